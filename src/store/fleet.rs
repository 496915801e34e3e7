//! The fleet tables (migration 0005 on top of 0004's `agents`, 0010 for facts): the agent
//! registry as the operator sees it, quarantine, heartbeats, facts and each agent's last
//! applied state.

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

#[async_trait]
pub trait FleetStore: Send + Sync {
    /// Every enrolled agent, by id.
    async fn list_agents(&self) -> Result<Vec<AgentRow>>;
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
}
