//! The fleet tables (migration 0005 on top of 0004's `agents`, 0010 for facts, 0011 for
//! jobs): the agent registry as the operator sees it, quarantine, heartbeats, facts, each
//! agent's last applied state, and the jobs sent to agents with their results.

use async_trait::async_trait;

use super::AgentRow;
use crate::Result;

/// The plan an agent was last told to apply (JSON), for drift detection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStateRow {
    pub agent_id: String,
    pub plan: String,
    pub job_id: String,
    pub applied_by: String,
    pub applied_at: String,
}

/// One job (exec, state or module run) as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRow {
    pub id: String,
    pub kind: String,
    pub target: String,
    pub description: String,
    pub created_by: String,
    pub created_at: String,
    /// Past this, a job without `finished_at` was cut off (its server stopped).
    pub expires_at: String,
    pub finished_at: Option<String>,
    /// Targeted agents: at most this many results.
    pub agents: i64,
    /// Results so far by status, a JSON object as text.
    pub counts: String,
}

/// One agent's result of a job: its status and the whole result as JSON text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobResultRow {
    pub agent_id: String,
    pub status: String,
    pub result: String,
}

#[async_trait]
pub trait FleetStore: Send + Sync {
    /// Every enrolled agent, by id.
    async fn list_agents(&self) -> Result<Vec<AgentRow>>;
    /// Every enrolled agent's id and labels (JSON object text), by id: what resolving a target
    /// by id and labels reads.
    async fn list_agent_labels(&self) -> Result<Vec<(String, String)>>;
    /// One page of enrolled agents by id: those after `after` (all when empty), at most
    /// `limit`; with `quarantined`, only agents whose quarantine flag is that. Keyset paging
    /// on the primary key, so a page costs the same wherever it starts.
    async fn list_agents_page(
        &self,
        after: &str,
        limit: usize,
        quarantined: Option<bool>,
    ) -> Result<Vec<AgentRow>>;
    /// Sets or clears quarantine (reason and time only when set); None for an unknown id.
    async fn set_quarantine(
        &self,
        id: &str,
        quarantined: bool,
        reason: Option<&str>,
        at: &str,
    ) -> Result<Option<AgentRow>>;
    /// Replaces an agent's labels (a JSON object, as text); None for an unknown id.
    async fn set_labels(&self, id: &str, labels: &str) -> Result<Option<AgentRow>>;
    /// Records the latest heartbeat time of many agents in one transaction.
    async fn record_heartbeats(&self, seen: &[(String, String)]) -> Result<()>;
    /// Records the facts (JSON object, as text) many agents reported, in one transaction; an
    /// id appears at most once.
    async fn record_facts(&self, reported: &[(String, String)]) -> Result<()>;
    async fn put_agent_state(&self, row: &AgentStateRow) -> Result<()>;
    async fn get_agent_state(&self, agent_id: &str) -> Result<Option<AgentStateRow>>;
    /// Inserts a new job's row.
    async fn insert_job(&self, row: &JobRow) -> Result<()>;
    /// Stores a batch of one job's results, its counts so far and, on the last batch, when it
    /// finished, in one transaction. Fails when the job was pruned meanwhile.
    async fn record_job_results(
        &self,
        job_id: &str,
        counts: &str,
        finished_at: Option<&str>,
        results: &[JobResultRow],
    ) -> Result<()>;
    /// Jobs newest first, ids before `before` when given, at most `limit`.
    async fn list_jobs(&self, before: Option<&str>, limit: usize) -> Result<Vec<JobRow>>;
    async fn get_job(&self, id: &str) -> Result<Option<JobRow>>;
    /// One job's results by agent id, those after `after_agent`, at most `limit`.
    async fn job_results(
        &self,
        job_id: &str,
        after_agent: &str,
        limit: usize,
    ) -> Result<Vec<JobResultRow>>;
    /// Deletes the jobs (and their results) past the newest `keep` or created before
    /// `created_before`; returns how many jobs went.
    async fn prune_jobs(&self, keep: usize, created_before: &str) -> Result<u64>;
}
