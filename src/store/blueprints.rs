//! The blueprint tables (migration 0008): the catalogue (every installed version of every
//! blueprint, the bundle as base64), each apply or rollback as recorded, and what is applied
//! where (one row per blueprint and agent).

use async_trait::async_trait;

use crate::Result;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlueprintRow {
    pub name: String,
    pub version: String,
    pub description: String,
    pub sha256: String,
    /// blueprint.yaml as JSON.
    pub manifest: String,
    /// The bundle's bytes, base64.
    pub bundle: String,
    pub installed_by: String,
    pub installed_at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlueprintApplyRow {
    pub id: String,
    pub name: String,
    pub version: String,
    /// apply | rollback
    pub kind: String,
    pub target: String,
    /// JSON object, secret values redacted.
    pub parameters: String,
    /// The rendered plan, JSON.
    pub plan: String,
    /// JSON array of {agent_id, status, changed, error}.
    pub results: String,
    pub applied_by: String,
    pub applied_at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlueprintAgentRow {
    pub name: String,
    pub agent_id: String,
    pub version: String,
    pub apply_id: String,
    pub status: String,
    pub applied_at: String,
}

#[async_trait]
pub trait BlueprintStore: Send + Sync {
    /// Adds a version; Conflict when that name and version are already there.
    async fn insert_blueprint(&self, row: &BlueprintRow) -> Result<()>;
    /// Every version of `name` (any order), or of every blueprint when `name` is None.
    async fn list_blueprints(&self, name: Option<&str>) -> Result<Vec<BlueprintRow>>;
    /// Deletes every version of `name` and its applied-where rows (apply records stay);
    /// returns how many versions were deleted.
    async fn delete_blueprint(&self, name: &str) -> Result<u64>;
    /// Records an apply and sets the applied-where rows of the agents that answered.
    async fn record_blueprint_apply(
        &self,
        apply: &BlueprintApplyRow,
        agents: &[BlueprintAgentRow],
    ) -> Result<()>;
    /// Applies of `name`, newest first.
    async fn list_blueprint_applies(&self, name: &str) -> Result<Vec<BlueprintApplyRow>>;
    /// What is applied where, by name and agent.
    async fn list_blueprint_agents(&self) -> Result<Vec<BlueprintAgentRow>>;
}
