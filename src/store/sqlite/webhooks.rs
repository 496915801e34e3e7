//! SQLite implementation of the webhook and runbook tables (see `store::webhooks`).

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row};

use super::SqliteStore;
use crate::store::{
    DeliveryRow, DeliveryStatus, ExecutionRow, ExecutionStatus, RunbookStore, StepRow, StepStatus,
    WebhookRow, WebhookStore,
};
use crate::{Error, Result};

/// The status columns read as their enums; an unknown value fails the read, naming it.
macro_rules! status_from_sql {
    ($($status:ty),+) => {$(
        impl rusqlite::types::FromSql for $status {
            fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                value
                    .as_str()?
                    .parse()
                    .map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    )+};
}

status_from_sql!(DeliveryStatus, ExecutionStatus, StepStatus);

fn webhook(row: &Row<'_>) -> rusqlite::Result<WebhookRow> {
    Ok(WebhookRow {
        id: row.get(0)?,
        url: row.get(1)?,
        event_types: row.get(2)?,
        category: row.get(3)?,
        min_severity: row.get(4)?,
        description: row.get(5)?,
        secret_sealed: row.get(6)?,
        created_by: row.get(7)?,
        created_at: row.get(8)?,
        updated_at: row.get(9)?,
        cursor_seq: row.get(10)?,
    })
}

fn delivery(row: &Row<'_>) -> rusqlite::Result<DeliveryRow> {
    Ok(DeliveryRow {
        id: row.get(0)?,
        webhook_id: row.get(1)?,
        event_id: row.get(2)?,
        event_seq: row.get(3)?,
        event_type: row.get(4)?,
        body: row.get(5)?,
        status: row.get(6)?,
        attempts: row.get(7)?,
        created_at: row.get(8)?,
        next_attempt_at: row.get(9)?,
        deadline_at: row.get(10)?,
        last_attempt_at: row.get(11)?,
        response_status: row.get(12)?,
        last_error: row.get(13)?,
    })
}

fn execution(row: &Row<'_>) -> rusqlite::Result<ExecutionRow> {
    Ok(ExecutionRow {
        id: row.get(0)?,
        runbook: row.get(1)?,
        status: row.get(2)?,
        parameters: row.get(3)?,
        definition: row.get(4)?,
        started_by: row.get(5)?,
        started_at: row.get(6)?,
        finished_at: row.get(7)?,
        trigger_event_id: row.get(8)?,
    })
}

fn step(row: &Row<'_>) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        execution_id: row.get(0)?,
        step_id: row.get(1)?,
        status: row.get(2)?,
        attempts: row.get(3)?,
        started_at: row.get(4)?,
        finished_at: row.get(5)?,
        output: row.get(6)?,
        error: row.get(7)?,
        approved_by: row.get(8)?,
    })
}

const INSERT_DELIVERY: &str = "INSERT INTO webhook_deliveries (id, webhook_id, event_id, \
     event_seq, event_type, body, status, attempts, created_at, next_attempt_at, deadline_at, \
     last_attempt_at, response_status, last_error) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)";

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn insert_webhook(&self, row: &WebhookRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(&format!(
                "INSERT INTO webhooks ({WEBHOOK_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))?
            .execute(params![
                row.id,
                row.url,
                row.event_types,
                row.category,
                row.min_severity,
                row.description,
                row.secret_sealed,
                row.created_by,
                row.created_at,
                row.updated_at,
                row.cursor_seq
            ])?;
            Ok(())
        })
    }

    async fn list_webhooks(&self) -> Result<Vec<WebhookRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map([], webhook)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn get_webhook(&self, id: &str) -> Result<Option<WebhookRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE id = ?1"
            ))?
            .query_row([id], webhook)
            .optional()?)
        })
    }

    async fn update_webhook(&self, row: &WebhookRow) -> Result<bool> {
        self.with(|c| {
            let changed = c
                .prepare_cached(
                    "UPDATE webhooks SET url = ?2, event_types = ?3, category = ?4, \
                     min_severity = ?5, description = ?6, secret_sealed = ?7, updated_at = ?8 \
                     WHERE id = ?1",
                )?
                .execute(params![
                    row.id,
                    row.url,
                    row.event_types,
                    row.category,
                    row.min_severity,
                    row.description,
                    row.secret_sealed,
                    row.updated_at
                ])?;
            Ok(changed == 1)
        })
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?1", [id])?;
            let deleted = tx.execute("DELETE FROM webhooks WHERE id = ?1", [id])?;
            tx.commit()?;
            Ok(deleted == 1)
        })
    }

    async fn enqueue_delivery(&self, d: &DeliveryRow) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.prepare_cached(INSERT_DELIVERY)?.execute(params![
                d.id,
                d.webhook_id,
                d.event_id,
                d.event_seq,
                d.event_type,
                d.body,
                d.status.as_str(),
                d.attempts,
                d.created_at,
                d.next_attempt_at,
                d.deadline_at,
                d.last_attempt_at,
                d.response_status,
                d.last_error
            ])?;
            tx.prepare_cached(
                "UPDATE webhooks SET cursor_seq = MAX(cursor_seq, ?2) WHERE id = ?1",
            )?
            .execute(params![d.webhook_id, d.event_seq])?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn next_pending_delivery(&self, webhook_id: &str) -> Result<Option<DeliveryRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
                 WHERE webhook_id = ?1 AND status = 'pending' ORDER BY event_seq, id LIMIT 1"
            ))?
            .query_row([webhook_id], delivery)
            .optional()?)
        })
    }

    async fn update_delivery(&self, d: &DeliveryRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "UPDATE webhook_deliveries SET status = ?2, attempts = ?3, next_attempt_at = ?4, \
                 deadline_at = ?5, last_attempt_at = ?6, response_status = ?7, last_error = ?8 \
                 WHERE id = ?1",
            )?
            .execute(params![
                d.id,
                d.status.as_str(),
                d.attempts,
                d.next_attempt_at,
                d.deadline_at,
                d.last_attempt_at,
                d.response_status,
                d.last_error
            ])?;
            Ok(())
        })
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<DeliveryRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = ?1"
            ))?
            .query_row([id], delivery)
            .optional()?)
        })
    }

    async fn list_deliveries(
        &self,
        webhook_id: &str,
        failed_only: bool,
        limit: usize,
    ) -> Result<Vec<DeliveryRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = ?1 \
                 AND (?2 = 0 OR status = 'dead' OR (status = 'pending' AND attempts > 0)) \
                 ORDER BY created_at DESC, id DESC LIMIT ?3"
            ))?;
            let rows = statement.query_map(
                params![webhook_id, failed_only as i64, limit as i64],
                delivery,
            )?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }
}

#[async_trait]
impl RunbookStore for SqliteStore {
    async fn insert_execution(&self, row: &ExecutionRow, steps: &[StepRow]) -> Result<bool> {
        let result = self.with(|c| {
            let tx = c.transaction()?;
            tx.prepare_cached(&format!(
                "INSERT INTO runbook_executions ({EXECUTION_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))?
            .execute(params![
                row.id,
                row.runbook,
                row.status.as_str(),
                row.parameters,
                row.definition,
                row.started_by,
                row.started_at,
                row.finished_at,
                row.trigger_event_id
            ])?;
            for s in steps {
                insert_step(&tx, s)?;
            }
            tx.commit()?;
            Ok(())
        });
        match result {
            Ok(()) => Ok(true),
            Err(Error::Conflict(_)) if row.trigger_event_id.is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_execution(&self, id: &str) -> Result<Option<ExecutionRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {EXECUTION_COLUMNS} FROM runbook_executions WHERE id = ?1"
            ))?
            .query_row([id], execution)
            .optional()?)
        })
    }

    async fn list_executions(
        &self,
        runbook: &str,
        status: Option<ExecutionStatus>,
        limit: usize,
    ) -> Result<Vec<ExecutionRow>> {
        let status = status.map_or("", ExecutionStatus::as_str);
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {EXECUTION_COLUMNS} FROM runbook_executions \
                 WHERE (?1 = '' OR runbook = ?1) AND (?2 = '' OR status = ?2) \
                 ORDER BY started_at DESC, id DESC LIMIT ?3"
            ))?;
            let rows = statement.query_map(params![runbook, status, limit as i64], execution)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn set_execution_status(
        &self,
        id: &str,
        status: ExecutionStatus,
        finished_at: Option<&str>,
    ) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "UPDATE runbook_executions SET status = ?2, finished_at = ?3 WHERE id = ?1",
            )?
            .execute(params![id, status.as_str(), finished_at])?;
            Ok(())
        })
    }

    async fn list_steps(&self, execution_id: &str) -> Result<Vec<StepRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM runbook_steps WHERE execution_id = ?1 \
                 ORDER BY step_id"
            ))?;
            let rows = statement.query_map([execution_id], step)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn upsert_step(&self, row: &StepRow) -> Result<()> {
        self.with(|c| {
            insert_step(c, row)?;
            Ok(())
        })
    }
}

fn insert_step(c: &rusqlite::Connection, s: &StepRow) -> rusqlite::Result<()> {
    c.prepare_cached(&format!(
        "INSERT OR REPLACE INTO runbook_steps ({STEP_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    ))?
    .execute(params![
        s.execution_id,
        s.step_id,
        s.status.as_str(),
        s.attempts,
        s.started_at,
        s.finished_at,
        s.output,
        s.error,
        s.approved_by
    ])?;
    Ok(())
}
