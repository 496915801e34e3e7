//! SQLite implementation of the fleet tables.

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::SqliteStore;
use crate::store::{AgentRow, AgentStateRow, FleetStore};
use crate::Result;

pub(super) fn agent_from_row(row: &Row<'_>) -> rusqlite::Result<AgentRow> {
    Ok(AgentRow {
        id: row.get(0)?,
        labels: row.get(1)?,
        fingerprint: row.get(2)?,
        enrolled_at: row.get(3)?,
        is_quarantined: row.get(4)?,
        quarantine_reason: row.get(5)?,
        quarantined_at: row.get(6)?,
        last_heartbeat_at: row.get(7)?,
        facts: row.get(8)?,
    })
}

#[async_trait]
impl FleetStore for SqliteStore {
    async fn list_agents(&self) -> Result<Vec<AgentRow>> {
        self.with(|c| {
            let mut statement =
                c.prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id"))?;
            let rows = statement.query_map([], agent_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn set_quarantine(
        &self,
        id: &str,
        quarantined: bool,
        reason: Option<&str>,
        at: &str,
    ) -> Result<Option<AgentRow>> {
        self.with(|c| {
            let (reason, at) = if quarantined {
                (reason, Some(at))
            } else {
                (None, None)
            };
            let changed = c
                .prepare_cached(
                    "UPDATE agents SET quarantined = ?2, quarantine_reason = ?3, \
                     quarantined_at = ?4 WHERE id = ?1",
                )?
                .execute(params![id, quarantined, reason, at])?;
            if changed == 0 {
                return Ok(None);
            }
            Ok(
                c.prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"))?
                    .query_row([id], agent_from_row)
                    .optional()?,
            )
        })
    }

    async fn set_labels(&self, id: &str, labels: &str) -> Result<Option<AgentRow>> {
        self.with(|c| {
            let changed = c
                .prepare_cached("UPDATE agents SET labels = ?2 WHERE id = ?1")?
                .execute(params![id, labels])?;
            if changed == 0 {
                return Ok(None);
            }
            Ok(
                c.prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"))?
                    .query_row([id], agent_from_row)
                    .optional()?,
            )
        })
    }

    async fn record_heartbeats(&self, seen: &[(String, String)]) -> Result<()> {
        if seen.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut statement =
                    tx.prepare_cached("UPDATE agents SET last_heartbeat_at = ?2 WHERE id = ?1")?;
                for (id, at) in seen {
                    statement.execute(params![id, at])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    async fn record_facts(&self, reported: &[(String, String)]) -> Result<()> {
        if reported.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut statement =
                    tx.prepare_cached("UPDATE agents SET facts = ?2 WHERE id = ?1")?;
                for (id, facts) in reported {
                    statement.execute(params![id, facts])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    async fn put_agent_state(&self, row: &AgentStateRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO agent_states (agent_id, plan, job_id, applied_by, applied_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (agent_id) DO UPDATE SET \
                 plan = excluded.plan, job_id = excluded.job_id, \
                 applied_by = excluded.applied_by, applied_at = excluded.applied_at",
            )?
            .execute(params![
                row.agent_id,
                row.plan,
                row.job_id,
                row.applied_by,
                row.applied_at
            ])?;
            Ok(())
        })
    }

    async fn get_agent_state(&self, agent_id: &str) -> Result<Option<AgentStateRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(
                "SELECT agent_id, plan, job_id, applied_by, applied_at FROM agent_states \
                 WHERE agent_id = ?1",
            )?
            .query_row([agent_id], |row| {
                Ok(AgentStateRow {
                    agent_id: row.get(0)?,
                    plan: row.get(1)?,
                    job_id: row.get(2)?,
                    applied_by: row.get(3)?,
                    applied_at: row.get(4)?,
                })
            })
            .optional()?)
        })
    }
}
