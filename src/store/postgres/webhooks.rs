//! PostgreSQL implementation of the webhook and runbook tables (see `store::webhooks`).

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::store::{
    DeliveryRow, DeliveryStatus, ExecutionRow, ExecutionStatus, RunbookStore, StepRow, StepStatus,
    WebhookRow, WebhookStore,
};
use crate::{Error, Result};

/// The status columns read as their enums; an unknown value fails the read, naming it.
macro_rules! status_from_sql {
    ($($status:ty),+) => {$(
        impl<'a> tokio_postgres::types::FromSql<'a> for $status {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                Ok(<&str as tokio_postgres::types::FromSql>::from_sql(ty, raw)?.parse()?)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }
    )+};
}

status_from_sql!(DeliveryStatus, ExecutionStatus, StepStatus);

type PgResult<T> = std::result::Result<T, tokio_postgres::Error>;

fn webhook(row: &Row) -> PgResult<WebhookRow> {
    Ok(WebhookRow {
        id: row.try_get(0)?,
        url: row.try_get(1)?,
        event_types: row.try_get(2)?,
        category: row.try_get(3)?,
        min_severity: row.try_get(4)?,
        description: row.try_get(5)?,
        secret_sealed: row.try_get(6)?,
        created_by: row.try_get(7)?,
        created_at: row.try_get(8)?,
        updated_at: row.try_get(9)?,
        cursor_seq: row.try_get(10)?,
    })
}

fn delivery(row: &Row) -> PgResult<DeliveryRow> {
    Ok(DeliveryRow {
        id: row.try_get(0)?,
        webhook_id: row.try_get(1)?,
        event_id: row.try_get(2)?,
        event_seq: row.try_get(3)?,
        event_type: row.try_get(4)?,
        body: row.try_get(5)?,
        status: row.try_get(6)?,
        attempts: row.try_get(7)?,
        created_at: row.try_get(8)?,
        next_attempt_at: row.try_get(9)?,
        deadline_at: row.try_get(10)?,
        last_attempt_at: row.try_get(11)?,
        response_status: row.try_get(12)?,
        last_error: row.try_get(13)?,
    })
}

fn execution(row: &Row) -> PgResult<ExecutionRow> {
    Ok(ExecutionRow {
        id: row.try_get(0)?,
        runbook: row.try_get(1)?,
        status: row.try_get(2)?,
        parameters: row.try_get(3)?,
        definition: row.try_get(4)?,
        started_by: row.try_get(5)?,
        started_at: row.try_get(6)?,
        finished_at: row.try_get(7)?,
        trigger_event_id: row.try_get(8)?,
    })
}

fn step(row: &Row) -> PgResult<StepRow> {
    Ok(StepRow {
        execution_id: row.try_get(0)?,
        step_id: row.try_get(1)?,
        status: row.try_get(2)?,
        attempts: row.try_get(3)?,
        started_at: row.try_get(4)?,
        finished_at: row.try_get(5)?,
        output: row.try_get(6)?,
        error: row.try_get(7)?,
        approved_by: row.try_get(8)?,
    })
}

const UPSERT_STEP: &str = "INSERT INTO runbook_steps (execution_id, step_id, status, attempts, \
     started_at, finished_at, output, error, approved_by) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (execution_id, step_id) DO UPDATE SET status = EXCLUDED.status, \
     attempts = EXCLUDED.attempts, started_at = EXCLUDED.started_at, \
     finished_at = EXCLUDED.finished_at, output = EXCLUDED.output, error = EXCLUDED.error, \
     approved_by = EXCLUDED.approved_by";

#[async_trait]
impl WebhookStore for PostgresStore {
    async fn insert_webhook(&self, row: &WebhookRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO webhooks ({WEBHOOK_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ),
            &[
                &row.id,
                &row.url,
                &row.event_types,
                &row.category,
                &row.min_severity,
                &row.description,
                &row.secret_sealed,
                &row.created_by,
                &row.created_at,
                &row.updated_at,
                &row.cursor_seq,
            ],
        )
        .await?;
        Ok(())
    }

    async fn list_webhooks(&self) -> Result<Vec<WebhookRow>> {
        self.rows(
            &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY created_at, id"),
            &[],
            webhook,
        )
        .await
    }

    async fn get_webhook(&self, id: &str) -> Result<Option<WebhookRow>> {
        self.first(
            &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE id = $1"),
            &[&id],
            webhook,
        )
        .await
    }

    async fn update_webhook(&self, row: &WebhookRow) -> Result<bool> {
        let changed = self
            .execute(
                "UPDATE webhooks SET url = $2, event_types = $3, category = $4, \
                 min_severity = $5, description = $6, secret_sealed = $7, updated_at = $8 \
                 WHERE id = $1",
                &[
                    &row.id,
                    &row.url,
                    &row.event_types,
                    &row.category,
                    &row.min_severity,
                    &row.description,
                    &row.secret_sealed,
                    &row.updated_at,
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "DELETE FROM webhook_deliveries WHERE webhook_id = $1",
            &[&id],
        )
        .await?;
        let deleted = tx
            .execute("DELETE FROM webhooks WHERE id = $1", &[&id])
            .await?;
        tx.commit().await?;
        Ok(deleted == 1)
    }

    async fn enqueue_delivery(&self, d: &DeliveryRow) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            &format!(
                "INSERT INTO webhook_deliveries ({DELIVERY_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
            ),
            &[
                &d.id,
                &d.webhook_id,
                &d.event_id,
                &d.event_seq,
                &d.event_type,
                &d.body,
                &d.status.as_str(),
                &d.attempts,
                &d.created_at,
                &d.next_attempt_at,
                &d.deadline_at,
                &d.last_attempt_at,
                &d.response_status,
                &d.last_error,
            ],
        )
        .await?;
        tx.execute(
            "UPDATE webhooks SET cursor_seq = GREATEST(cursor_seq, $2) WHERE id = $1",
            &[&d.webhook_id, &d.event_seq],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn next_pending_delivery(&self, webhook_id: &str) -> Result<Option<DeliveryRow>> {
        self.first(
            &format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
                 WHERE webhook_id = $1 AND status = 'pending' ORDER BY event_seq, id LIMIT 1"
            ),
            &[&webhook_id],
            delivery,
        )
        .await
    }

    async fn update_delivery(&self, d: &DeliveryRow) -> Result<()> {
        self.execute(
            "UPDATE webhook_deliveries SET status = $2, attempts = $3, next_attempt_at = $4, \
             deadline_at = $5, last_attempt_at = $6, response_status = $7, last_error = $8 \
             WHERE id = $1",
            &[
                &d.id,
                &d.status.as_str(),
                &d.attempts,
                &d.next_attempt_at,
                &d.deadline_at,
                &d.last_attempt_at,
                &d.response_status,
                &d.last_error,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<DeliveryRow>> {
        self.first(
            &format!("SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = $1"),
            &[&id],
            delivery,
        )
        .await
    }

    async fn list_deliveries(
        &self,
        webhook_id: &str,
        failed_only: bool,
        limit: usize,
    ) -> Result<Vec<DeliveryRow>> {
        let failed = failed_only as i64;
        let limit = limit as i64;
        self.rows(
            &format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = $1 \
                 AND ($2::BIGINT = 0 OR status = 'dead' OR (status = 'pending' AND attempts > 0)) \
                 ORDER BY created_at DESC, id DESC LIMIT $3"
            ),
            &[&webhook_id, &failed, &limit],
            delivery,
        )
        .await
    }
}

#[async_trait]
impl RunbookStore for PostgresStore {
    async fn insert_execution(&self, row: &ExecutionRow, steps: &[StepRow]) -> Result<bool> {
        let result: Result<()> = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            tx.execute(
                &format!(
                    "INSERT INTO runbook_executions ({EXECUTION_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                ),
                &[
                    &row.id,
                    &row.runbook,
                    &row.status.as_str(),
                    &row.parameters,
                    &row.definition,
                    &row.started_by,
                    &row.started_at,
                    &row.finished_at,
                    &row.trigger_event_id,
                ],
            )
            .await?;
            for s in steps {
                tx.execute(
                    UPSERT_STEP,
                    &[
                        &s.execution_id,
                        &s.step_id,
                        &s.status.as_str(),
                        &s.attempts,
                        &s.started_at,
                        &s.finished_at,
                        &s.output,
                        &s.error,
                        &s.approved_by,
                    ],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(true),
            Err(Error::Conflict(_)) if row.trigger_event_id.is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_execution(&self, id: &str) -> Result<Option<ExecutionRow>> {
        self.first(
            &format!("SELECT {EXECUTION_COLUMNS} FROM runbook_executions WHERE id = $1"),
            &[&id],
            execution,
        )
        .await
    }

    async fn list_executions(
        &self,
        runbook: &str,
        status: Option<ExecutionStatus>,
        limit: usize,
    ) -> Result<Vec<ExecutionRow>> {
        let status = status.map_or("", ExecutionStatus::as_str);
        let limit = limit as i64;
        self.rows(
            &format!(
                "SELECT {EXECUTION_COLUMNS} FROM runbook_executions \
                 WHERE ($1 = '' OR runbook = $1) AND ($2 = '' OR status = $2) \
                 ORDER BY started_at DESC, id DESC LIMIT $3"
            ),
            &[&runbook, &status, &limit],
            execution,
        )
        .await
    }

    async fn set_execution_status(
        &self,
        id: &str,
        status: ExecutionStatus,
        finished_at: Option<&str>,
    ) -> Result<()> {
        self.execute(
            "UPDATE runbook_executions SET status = $2, finished_at = $3 WHERE id = $1",
            &[&id, &status.as_str(), &finished_at],
        )
        .await?;
        Ok(())
    }

    async fn list_steps(&self, execution_id: &str) -> Result<Vec<StepRow>> {
        self.rows(
            &format!(
                "SELECT {STEP_COLUMNS} FROM runbook_steps WHERE execution_id = $1 ORDER BY step_id"
            ),
            &[&execution_id],
            step,
        )
        .await
    }

    async fn upsert_step(&self, s: &StepRow) -> Result<()> {
        self.execute(
            UPSERT_STEP,
            &[
                &s.execution_id,
                &s.step_id,
                &s.status.as_str(),
                &s.attempts,
                &s.started_at,
                &s.finished_at,
                &s.output,
                &s.error,
                &s.approved_by,
            ],
        )
        .await?;
        Ok(())
    }
}
