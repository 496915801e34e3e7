//! PostgreSQL implementation of the fleet tables (see `store::fleet`).

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::store::{AgentRow, AgentStateRow, FleetStore};
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
}
