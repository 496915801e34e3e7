//! SQLite implementation of the blueprint tables (see `store::blueprints`).

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, Row, TransactionBehavior};

use super::SqliteStore;
use crate::store::blueprints::check_insert;
use crate::store::{BlueprintAgentRow, BlueprintApplyRow, BlueprintRow, BlueprintStore};
use crate::Result;

fn blueprint(row: &Row<'_>) -> rusqlite::Result<BlueprintRow> {
    Ok(BlueprintRow {
        name: row.get(0)?,
        version: row.get(1)?,
        description: row.get(2)?,
        sha256: row.get(3)?,
        manifest: row.get(4)?,
        bundle: row.get(5)?,
        installed_by: row.get(6)?,
        installed_at: row.get(7)?,
    })
}

fn apply(row: &Row<'_>) -> rusqlite::Result<BlueprintApplyRow> {
    Ok(BlueprintApplyRow {
        id: row.get(0)?,
        name: row.get(1)?,
        version: row.get(2)?,
        kind: row.get(3)?,
        target: row.get(4)?,
        parameters: row.get(5)?,
        plan: row.get(6)?,
        results: row.get(7)?,
        applied_by: row.get(8)?,
        applied_at: row.get(9)?,
    })
}

fn agent(row: &Row<'_>) -> rusqlite::Result<BlueprintAgentRow> {
    Ok(BlueprintAgentRow {
        name: row.get(0)?,
        agent_id: row.get(1)?,
        version: row.get(2)?,
        apply_id: row.get(3)?,
        status: row.get(4)?,
        applied_at: row.get(5)?,
    })
}

#[async_trait]
impl BlueprintStore for SqliteStore {
    async fn insert_blueprint(&self, row: &BlueprintRow, is_update: bool) -> Result<()> {
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let installed: Vec<String> = {
                let mut statement =
                    tx.prepare_cached("SELECT version FROM blueprints WHERE name = ?1")?;
                let rows = statement.query_map([&row.name], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            check_insert(row, &installed, is_update)?;
            tx.prepare_cached(&format!(
                "INSERT INTO blueprints ({BLUEPRINT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))?
            .execute(params![
                row.name,
                row.version,
                row.description,
                row.sha256,
                row.manifest,
                row.bundle,
                row.installed_by,
                row.installed_at
            ])?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn list_blueprints(&self, name: Option<&str>) -> Result<Vec<BlueprintRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {BLUEPRINT_COLUMNS} FROM blueprints WHERE ?1 IS NULL OR name = ?1 \
                 ORDER BY name, installed_at"
            ))?;
            let rows = statement.query_map([name], blueprint)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn delete_blueprint(&self, name: &str) -> Result<u64> {
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM blueprint_agents WHERE name = ?1", [name])?;
            let count = tx.execute("DELETE FROM blueprints WHERE name = ?1", [name])?;
            tx.commit()?;
            Ok(count as u64)
        })
    }

    async fn record_blueprint_apply(
        &self,
        row: &BlueprintApplyRow,
        agents: &[BlueprintAgentRow],
    ) -> Result<()> {
        self.with(|c| {
            let _writer = self.writer.lock().expect("writer lock poisoned");
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(&format!(
                "INSERT INTO blueprint_applies ({BLUEPRINT_APPLY_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ))?
            .execute(params![
                row.id,
                row.name,
                row.version,
                row.kind,
                row.target,
                row.parameters,
                row.plan,
                row.results,
                row.applied_by,
                row.applied_at
            ])?;
            {
                let mut statement = tx.prepare_cached(&format!(
                    "INSERT INTO blueprint_agents ({BLUEPRINT_AGENT_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name, agent_id) DO UPDATE SET \
                     version = excluded.version, apply_id = excluded.apply_id, \
                     status = excluded.status, applied_at = excluded.applied_at"
                ))?;
                for a in agents {
                    statement.execute(params![
                        a.name,
                        a.agent_id,
                        a.version,
                        a.apply_id,
                        a.status,
                        a.applied_at
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    async fn list_blueprint_applies(&self, name: &str) -> Result<Vec<BlueprintApplyRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {BLUEPRINT_APPLY_COLUMNS} FROM blueprint_applies WHERE name = ?1 \
                 ORDER BY applied_at DESC, id DESC"
            ))?;
            let rows = statement.query_map([name], apply)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn list_blueprint_agents(&self) -> Result<Vec<BlueprintAgentRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {BLUEPRINT_AGENT_COLUMNS} FROM blueprint_agents ORDER BY name, agent_id"
            ))?;
            let rows = statement.query_map([], agent)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }
}
