//! The outbound-webhook and runbook tables (migration 0009): subscriptions with their
//! durable cursor in the events stream, deliveries, and runbook executions with their steps.
//!
//! The status columns are TEXT; their values are the enums below, so a misspelt state is a
//! compile error. Each enum's one list of names serves `as_str` (what the drivers write),
//! `FromStr` (what they read back: an unknown stored value is an error naming it) and serde
//! (the JSON views), so the stored and shown text cannot drift apart.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;

/// A status text that is none of its enum's names (a row this version did not write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownStatus {
    /// What was being read (`delivery status`, ...).
    pub kind: &'static str,
    pub text: String,
    pub expected: &'static [&'static str],
}

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} '{}' (expected one of {})",
            self.kind,
            self.text,
            self.expected.join(", ")
        )
    }
}

impl std::error::Error for UnknownStatus {}

/// A status enum over a TEXT column: the variants with their names, `as_str`, `FromStr`,
/// `Display` and serde, all from the one list.
macro_rules! status_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$variant_meta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
            /// The names, in declaration order (for messages).
            pub const NAMES: &'static [&'static str] = &[$($text,)+];

            /// The stored and shown name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownStatus;

            fn from_str(text: &str) -> std::result::Result<Self, UnknownStatus> {
                match text {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownStatus {
                        kind: $kind,
                        text: text.to_string(),
                        expected: $name::NAMES,
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_enum! {
    /// Where a delivery stands.
    DeliveryStatus, "delivery status" {
        /// To send, at `next_attempt_at`.
        #[default]
        Pending = "pending",
        /// The receiver answered 2xx.
        Delivered = "delivered",
        /// Given up on (`deadline_at` passed, or a ping that failed).
        Dead = "dead",
    }
}

status_enum! {
    /// Where a runbook execution stands.
    ExecutionStatus, "execution status" {
        #[default]
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

status_enum! {
    /// Where one step of an execution stands.
    StepStatus, "step status" {
        /// Not started: its `needs` are not all done.
        #[default]
        Pending = "pending",
        Running = "running",
        /// An `approve` step waiting for another principal.
        Waiting = "waiting",
        /// Approved; the step finishes on its next look.
        Approved = "approved",
        Succeeded = "succeeded",
        Failed = "failed",
        /// Not run: a step it needs failed, or the execution stopped.
        Skipped = "skipped",
        Cancelled = "cancelled",
    }
}

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
    pub status: DeliveryStatus,
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
    pub status: ExecutionStatus,
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
    pub status: StepStatus,
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
    /// Newest first, at most `limit`; an empty runbook name and no status match everything.
    async fn list_executions(
        &self,
        runbook: &str,
        status: Option<ExecutionStatus>,
        limit: usize,
    ) -> Result<Vec<ExecutionRow>>;
    /// Sets status and finished_at (None keeps it running).
    async fn set_execution_status(
        &self,
        id: &str,
        status: ExecutionStatus,
        finished_at: Option<&str>,
    ) -> Result<()>;
    async fn list_steps(&self, execution_id: &str) -> Result<Vec<StepRow>>;
    /// Inserts or replaces one step row.
    async fn upsert_step(&self, row: &StepRow) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name reads back as its variant, and serde writes the same text.
    #[test]
    fn names_round_trip_through_text_and_json() {
        fn check<T>(all: &[T])
        where
            T: Copy
                + fmt::Display
                + FromStr<Err = UnknownStatus>
                + Serialize
                + PartialEq
                + fmt::Debug,
        {
            for &value in all {
                let text = value.to_string();
                assert_eq!(text.parse::<T>(), Ok(value), "{text}");
                assert_eq!(
                    serde_json::to_string(&value).unwrap(),
                    format!("\"{text}\"")
                );
            }
        }
        check(DeliveryStatus::ALL);
        check(ExecutionStatus::ALL);
        check(StepStatus::ALL);
        assert_eq!(DeliveryStatus::NAMES, ["pending", "delivered", "dead"]);
        assert_eq!(
            ExecutionStatus::NAMES,
            ["running", "succeeded", "failed", "cancelled"]
        );
        assert_eq!(
            StepStatus::NAMES,
            [
                "pending",
                "running",
                "waiting",
                "approved",
                "succeeded",
                "failed",
                "skipped",
                "cancelled"
            ]
        );
    }

    #[test]
    fn unknown_stored_values_are_named() {
        let cases = [
            (
                "done",
                "unknown step status 'done' (expected one of pending, running, waiting, \
              approved, succeeded, failed, skipped, cancelled)",
            ),
            (
                "Pending",
                "unknown step status 'Pending' (expected one of pending, running, \
              waiting, approved, succeeded, failed, skipped, cancelled)",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(text.parse::<StepStatus>().unwrap_err().to_string(), message);
        }
        assert_eq!(
            "".parse::<DeliveryStatus>().unwrap_err().to_string(),
            "unknown delivery status '' (expected one of pending, delivered, dead)"
        );
    }
}
