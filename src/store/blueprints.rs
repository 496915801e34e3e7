//! The blueprint tables (migration 0008): the catalogue (every installed version of every
//! blueprint, the bundle as base64), each apply or rollback as recorded, and what is applied
//! where (one row per blueprint and agent).

use async_trait::async_trait;

use crate::{Error, Result};

/// The rule `insert_blueprint` enforces, given the versions installed under the row's name.
pub(crate) fn check_insert(
    row: &BlueprintRow,
    installed: &[String],
    is_update: bool,
) -> Result<()> {
    use crate::version::compare;
    let newest = installed.iter().max_by(|a, b| compare(a, b));
    match (is_update, newest) {
        (false, Some(newest)) => Err(Error::Conflict(format!(
            "blueprint '{}' is installed ({newest}); use update for a newer version",
            row.name
        ))),
        (true, None) => Err(Error::NotFound(format!(
            "blueprint '{}' is not installed; use install",
            row.name
        ))),
        (true, Some(newest)) if compare(&row.version, newest) != std::cmp::Ordering::Greater => {
            Err(Error::Conflict(format!(
                "blueprint '{}' {} is not newer than the installed {newest}",
                row.name, row.version
            )))
        }
        _ => Ok(()),
    }
}

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
    /// Adds a version, checked in the same write transaction (so it holds across servers
    /// sharing one PostgreSQL): an install (`is_update` false) needs a name with no version
    /// yet, an update a version newer than every installed one (Conflict, or NotFound for an
    /// update of a name not installed).
    async fn insert_blueprint(&self, row: &BlueprintRow, is_update: bool) -> Result<()>;
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
