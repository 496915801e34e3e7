//! The outbound-webhook and runbook tables (migration 0009): subscriptions with their
//! durable cursor in the events stream, deliveries, and runbook executions with their steps.

use async_trait::async_trait;

use crate::Result;

/// An outbound webhook subscription as stored (the secret only sealed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookRow {
    pub id: String,
    pub url: String,
    /// JSON array of event type names, as text; `[]` matches every type.
    pub event_types: String,
    pub category: String,
    pub min_severity: String,
    pub description: String,
    pub secret_sealed: String,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    /// The last event sequence turned into a delivery (or skipped as not matching).
    pub cursor_seq: i64,
}

/// One message to one subscription; `id` is its `webhook-id`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    /// 0 for a ping (`svc-webhook outbound test`).
    pub event_seq: i64,
    pub event_type: String,
    pub body: String,
    /// `pending`, `delivered` or `dead`.
    pub status: String,
    pub attempts: i64,
    pub created_at: String,
    pub next_attempt_at: String,
    pub deadline_at: String,
    pub last_attempt_at: Option<String>,
    pub response_status: Option<i64>,
    pub last_error: Option<String>,
}

#[async_trait]
pub trait WebhookStore: Send + Sync {
    async fn insert_webhook(&self, row: &WebhookRow) -> Result<()>;
    async fn list_webhooks(&self) -> Result<Vec<WebhookRow>>;
    async fn get_webhook(&self, id: &str) -> Result<Option<WebhookRow>>;
    /// Replaces the settings (url, filters, description, secret, updated_at), never the
    /// cursor; false when the id is unknown.
    async fn update_webhook(&self, row: &WebhookRow) -> Result<bool>;
    /// Deletes the subscription and its deliveries; false when the id is unknown.
    async fn delete_webhook(&self, id: &str) -> Result<bool>;
    /// Inserts `delivery` and moves its subscription's cursor to `delivery.event_seq` (never
    /// back) in one transaction: a restart neither skips nor repeats the event.
    async fn enqueue_delivery(&self, delivery: &DeliveryRow) -> Result<()>;
    /// The oldest pending delivery of a subscription (by event sequence, then id).
    async fn next_pending_delivery(&self, webhook_id: &str) -> Result<Option<DeliveryRow>>;
    /// Writes a delivery's outcome fields (status, attempts, times, response, error).
    async fn update_delivery(&self, row: &DeliveryRow) -> Result<()>;
    async fn get_delivery(&self, id: &str) -> Result<Option<DeliveryRow>>;
    /// A subscription's deliveries, newest first, at most `limit`; with `failed_only`, only
    /// dead ones and pending ones that failed at least once.
    async fn list_deliveries(
        &self,
        webhook_id: &str,
        failed_only: bool,
        limit: usize,
    ) -> Result<Vec<DeliveryRow>>;
}

/// A runbook execution as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutionRow {
    pub id: String,
    pub runbook: String,
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub status: String,
    /// JSON object, as text.
    pub parameters: String,
    /// The runbook as JSON, as it was when the execution started.
    pub definition: String,
    pub started_by: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub trigger_event_id: Option<String>,
}

/// One step of an execution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepRow {
    pub execution_id: String,
    pub step_id: String,
    pub status: String,
    pub attempts: i64,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// JSON, as text.
    pub output: String,
    pub error: Option<String>,
    pub approved_by: Option<String>,
}

#[async_trait]
pub trait RunbookStore: Send + Sync {
    /// Inserts an execution and its steps in one transaction; false (nothing inserted) when
    /// an execution of the same runbook already has this trigger event.
    async fn insert_execution(&self, row: &ExecutionRow, steps: &[StepRow]) -> Result<bool>;
    async fn get_execution(&self, id: &str) -> Result<Option<ExecutionRow>>;
    /// Newest first, at most `limit`; empty filters match everything.
    async fn list_executions(
        &self,
        runbook: &str,
        status: &str,
        limit: usize,
    ) -> Result<Vec<ExecutionRow>>;
    /// Sets status and finished_at (None keeps it running).
    async fn set_execution_status(
        &self,
        id: &str,
        status: &str,
        finished_at: Option<&str>,
    ) -> Result<()>;
    async fn list_steps(&self, execution_id: &str) -> Result<Vec<StepRow>>;
    /// Inserts or replaces one step row.
    async fn upsert_step(&self, row: &StepRow) -> Result<()>;
}
