//! SQLite implementation of the fleet tables.

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::SqliteStore;
use crate::store::{AgentRow, AgentStateRow, FleetStore, JobResultRow, JobRow};
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
        public_key: row.get(9)?,
    })
}

fn job_from_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
    Ok(JobRow {
        id: row.get(0)?,
        kind: row.get(1)?,
        target: row.get(2)?,
        description: row.get(3)?,
        created_by: row.get(4)?,
        created_at: row.get(5)?,
        expires_at: row.get(6)?,
        finished_at: row.get(7)?,
        agents: row.get(8)?,
        counts: row.get(9)?,
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

    async fn list_agent_labels(&self) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            let mut statement = c.prepare_cached("SELECT id, labels FROM agents ORDER BY id")?;
            let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn list_agents_page(
        &self,
        after: &str,
        limit: usize,
        quarantined: Option<bool>,
    ) -> Result<Vec<AgentRow>> {
        self.with(|c| {
            // `quarantined = 1` alone is served by the partial index of migration 0014.
            let filter = match quarantined {
                None => "",
                Some(true) => "AND quarantined = 1",
                Some(false) => "AND quarantined = 0",
            };
            let mut statement = c.prepare_cached(&format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE id > ?1 {filter} ORDER BY id LIMIT ?2"
            ))?;
            let rows = statement.query_map(params![after, limit as i64], agent_from_row)?;
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

    async fn insert_job(&self, row: &JobRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(&format!(
                "INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ))?
            .execute(params![
                row.id,
                row.kind,
                row.target,
                row.description,
                row.created_by,
                row.created_at,
                row.expires_at,
                row.finished_at,
                row.agents,
                row.counts
            ])?;
            Ok(())
        })
    }

    async fn record_job_results(
        &self,
        job_id: &str,
        counts: &str,
        finished_at: Option<&str>,
        results: &[JobResultRow],
    ) -> Result<()> {
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let updated = tx
                .prepare_cached(
                    "UPDATE jobs SET counts = ?2, finished_at = COALESCE(?3, finished_at) \
                     WHERE id = ?1",
                )?
                .execute(params![job_id, counts, finished_at])?;
            if updated == 0 {
                return Err(crate::Error::NotFound(format!("job '{job_id}' was pruned")));
            }
            {
                let mut statement = tx.prepare_cached(
                    "INSERT INTO job_results (job_id, agent_id, status, result) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (job_id, agent_id) DO NOTHING",
                )?;
                for row in results {
                    statement.execute(params![job_id, row.agent_id, row.status, row.result])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    async fn list_jobs(&self, before: Option<&str>, limit: usize) -> Result<Vec<JobRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE ?1 IS NULL OR id < ?1 \
                 ORDER BY id DESC LIMIT ?2"
            ))?;
            let rows = statement.query_map(params![before, limit as i64], job_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>> {
        self.with(|c| {
            Ok(
                c.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
                    .query_row([id], job_from_row)
                    .optional()?,
            )
        })
    }

    async fn job_results(
        &self,
        job_id: &str,
        after_agent: &str,
        limit: usize,
    ) -> Result<Vec<JobResultRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(
                "SELECT agent_id, status, result FROM job_results \
                 WHERE job_id = ?1 AND agent_id > ?2 ORDER BY agent_id LIMIT ?3",
            )?;
            let rows = statement.query_map(params![job_id, after_agent, limit as i64], |row| {
                Ok(JobResultRow {
                    agent_id: row.get(0)?,
                    status: row.get(1)?,
                    result: row.get(2)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn prune_jobs(&self, keep: usize, created_before: &str) -> Result<u64> {
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            // Results go with their job (ON DELETE CASCADE).
            let deleted = c
                .prepare_cached(
                    "DELETE FROM jobs WHERE created_at < ?1 \
                     OR id NOT IN (SELECT id FROM jobs ORDER BY id DESC LIMIT ?2)",
                )?
                .execute(params![created_before, keep as i64])?;
            Ok(deleted as u64)
        })
    }
}
