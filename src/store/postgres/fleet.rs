//! PostgreSQL implementation of the fleet tables (see `store::fleet`).

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::store::{AgentRow, AgentStateRow, FleetStore, JobResultRow, JobRow};
use crate::Result;

pub(super) fn agent(row: &Row) -> Result<AgentRow, tokio_postgres::Error> {
    Ok(AgentRow {
        id: row.try_get(0)?,
        labels: row.try_get(1)?,
        fingerprint: row.try_get(2)?,
        enrolled_at: row.try_get(3)?,
        is_quarantined: row.try_get::<_, i64>(4)? != 0,
        quarantine_reason: row.try_get(5)?,
        quarantined_at: row.try_get(6)?,
        last_heartbeat_at: row.try_get(7)?,
        facts: row.try_get(8)?,
        public_key: row.try_get(9)?,
    })
}

fn job(row: &Row) -> Result<JobRow, tokio_postgres::Error> {
    Ok(JobRow {
        id: row.try_get(0)?,
        kind: row.try_get(1)?,
        target: row.try_get(2)?,
        description: row.try_get(3)?,
        created_by: row.try_get(4)?,
        created_at: row.try_get(5)?,
        expires_at: row.try_get(6)?,
        finished_at: row.try_get(7)?,
        agents: row.try_get(8)?,
        counts: row.try_get(9)?,
    })
}

#[async_trait]
impl FleetStore for PostgresStore {
    async fn list_agents(&self) -> Result<Vec<AgentRow>> {
        self.rows(
            &format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id"),
            &[],
            agent,
        )
        .await
    }

    async fn list_agent_labels(&self) -> Result<Vec<(String, String)>> {
        self.rows("SELECT id, labels FROM agents ORDER BY id", &[], |row| {
            Ok((row.try_get(0)?, row.try_get(1)?))
        })
        .await
    }

    async fn list_agents_page(
        &self,
        after: &str,
        limit: usize,
        quarantined: Option<bool>,
    ) -> Result<Vec<AgentRow>> {
        // `quarantined = 1` alone is served by the partial index of migration 0014.
        let filter = match quarantined {
            None => "",
            Some(true) => "AND quarantined = 1",
            Some(false) => "AND quarantined = 0",
        };
        self.rows(
            &format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE id > $1 {filter} ORDER BY id LIMIT $2"
            ),
            &[&after, &(limit as i64)],
            agent,
        )
        .await
    }

    async fn set_quarantine(
        &self,
        id: &str,
        quarantined: bool,
        reason: Option<&str>,
        at: &str,
    ) -> Result<Option<AgentRow>> {
        let (reason, at) = if quarantined {
            (reason, Some(at))
        } else {
            (None, None)
        };
        self.first(
            &format!(
                "UPDATE agents SET quarantined = $2, quarantine_reason = $3, quarantined_at = $4 \
                 WHERE id = $1 RETURNING {AGENT_COLUMNS}"
            ),
            &[&id, &(quarantined as i64), &reason, &at],
            agent,
        )
        .await
    }

    async fn set_labels(&self, id: &str, labels: &str) -> Result<Option<AgentRow>> {
        self.first(
            &format!("UPDATE agents SET labels = $2 WHERE id = $1 RETURNING {AGENT_COLUMNS}"),
            &[&id, &labels],
            agent,
        )
        .await
    }

    async fn record_heartbeats(&self, seen: &[(String, String)]) -> Result<()> {
        if seen.is_empty() {
            return Ok(());
        }
        // One statement for the whole batch: a round trip per agent would cost more than the
        // updates themselves.
        let ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
        let times: Vec<&str> = seen.iter().map(|(_, at)| at.as_str()).collect();
        self.execute(
            "UPDATE agents SET last_heartbeat_at = seen.at \
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS seen (id, at) WHERE agents.id = seen.id",
            &[&ids, &times],
        )
        .await?;
        Ok(())
    }

    async fn record_facts(&self, reported: &[(String, String)]) -> Result<()> {
        if reported.is_empty() {
            return Ok(());
        }
        // One statement for the batch, as for heartbeat times.
        let ids: Vec<&str> = reported.iter().map(|(id, _)| id.as_str()).collect();
        let facts: Vec<&str> = reported.iter().map(|(_, facts)| facts.as_str()).collect();
        self.execute(
            "UPDATE agents SET facts = reported.facts \
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS reported (id, facts) \
             WHERE agents.id = reported.id",
            &[&ids, &facts],
        )
        .await?;
        Ok(())
    }

    async fn put_agent_state(&self, row: &AgentStateRow) -> Result<()> {
        self.execute(
            "INSERT INTO agent_states (agent_id, plan, job_id, applied_by, applied_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (agent_id) DO UPDATE SET \
             plan = EXCLUDED.plan, job_id = EXCLUDED.job_id, \
             applied_by = EXCLUDED.applied_by, applied_at = EXCLUDED.applied_at",
            &[
                &row.agent_id,
                &row.plan,
                &row.job_id,
                &row.applied_by,
                &row.applied_at,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_agent_state(&self, agent_id: &str) -> Result<Option<AgentStateRow>> {
        self.first(
            "SELECT agent_id, plan, job_id, applied_by, applied_at FROM agent_states \
             WHERE agent_id = $1",
            &[&agent_id],
            |row| {
                Ok(AgentStateRow {
                    agent_id: row.try_get(0)?,
                    plan: row.try_get(1)?,
                    job_id: row.try_get(2)?,
                    applied_by: row.try_get(3)?,
                    applied_at: row.try_get(4)?,
                })
            },
        )
        .await
    }

    async fn insert_job(&self, row: &JobRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            &[
                &row.id,
                &row.kind,
                &row.target,
                &row.description,
                &row.created_by,
                &row.created_at,
                &row.expires_at,
                &row.finished_at,
                &row.agents,
                &row.counts,
            ],
        )
        .await?;
        Ok(())
    }

    async fn record_job_results(
        &self,
        job_id: &str,
        counts: &str,
        finished_at: Option<&str>,
        results: &[JobResultRow],
    ) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let updated = tx
            .execute(
                "UPDATE jobs SET counts = $2, finished_at = COALESCE($3, finished_at) \
                 WHERE id = $1",
                &[&job_id, &counts, &finished_at],
            )
            .await?;
        if updated == 0 {
            return Err(crate::Error::NotFound(format!("job '{job_id}' was pruned")));
        }
        // One statement for the batch, as for heartbeat times.
        let agents: Vec<&str> = results.iter().map(|r| r.agent_id.as_str()).collect();
        let statuses: Vec<&str> = results.iter().map(|r| r.status.as_str()).collect();
        let bodies: Vec<&str> = results.iter().map(|r| r.result.as_str()).collect();
        tx.execute(
            "INSERT INTO job_results (job_id, agent_id, status, result) \
             SELECT $1, r.agent_id, r.status, r.result \
             FROM UNNEST($2::TEXT[], $3::TEXT[], $4::TEXT[]) AS r (agent_id, status, result) \
             ON CONFLICT (job_id, agent_id) DO NOTHING",
            &[&job_id, &agents, &statuses, &bodies],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_jobs(&self, before: Option<&str>, limit: usize) -> Result<Vec<JobRow>> {
        self.rows(
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE $1::TEXT IS NULL OR id < $1 \
                 ORDER BY id DESC LIMIT $2"
            ),
            &[&before, &(limit as i64)],
            job,
        )
        .await
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>> {
        self.first(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
            &[&id],
            job,
        )
        .await
    }

    async fn job_results(
        &self,
        job_id: &str,
        after_agent: &str,
        limit: usize,
    ) -> Result<Vec<JobResultRow>> {
        self.rows(
            "SELECT agent_id, status, result FROM job_results \
             WHERE job_id = $1 AND agent_id > $2 ORDER BY agent_id LIMIT $3",
            &[&job_id, &after_agent, &(limit as i64)],
            |row| {
                Ok(JobResultRow {
                    agent_id: row.try_get(0)?,
                    status: row.try_get(1)?,
                    result: row.try_get(2)?,
                })
            },
        )
        .await
    }

    async fn prune_jobs(&self, keep: usize, created_before: &str) -> Result<u64> {
        // Results go with their job (ON DELETE CASCADE).
        self.execute(
            "DELETE FROM jobs WHERE created_at < $1 \
             OR id NOT IN (SELECT id FROM jobs ORDER BY id DESC LIMIT $2)",
            &[&created_before, &(keep as i64)],
        )
        .await
    }
}
