//! PostgreSQL implementation of the blueprint tables (see `store::blueprints`).

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::store::blueprints::check_insert;
use crate::store::{BlueprintAgentRow, BlueprintApplyRow, BlueprintRow, BlueprintStore};
use crate::Result;

fn blueprint(row: &Row) -> Result<BlueprintRow, tokio_postgres::Error> {
    Ok(BlueprintRow {
        name: row.try_get(0)?,
        version: row.try_get(1)?,
        description: row.try_get(2)?,
        sha256: row.try_get(3)?,
        manifest: row.try_get(4)?,
        bundle: row.try_get(5)?,
        installed_by: row.try_get(6)?,
        installed_at: row.try_get(7)?,
    })
}

fn apply(row: &Row) -> Result<BlueprintApplyRow, tokio_postgres::Error> {
    Ok(BlueprintApplyRow {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        version: row.try_get(2)?,
        kind: row.try_get(3)?,
        target: row.try_get(4)?,
        parameters: row.try_get(5)?,
        plan: row.try_get(6)?,
        results: row.try_get(7)?,
        applied_by: row.try_get(8)?,
        applied_at: row.try_get(9)?,
    })
}

fn agent(row: &Row) -> Result<BlueprintAgentRow, tokio_postgres::Error> {
    Ok(BlueprintAgentRow {
        name: row.try_get(0)?,
        agent_id: row.try_get(1)?,
        version: row.try_get(2)?,
        apply_id: row.try_get(3)?,
        status: row.try_get(4)?,
        applied_at: row.try_get(5)?,
    })
}

#[async_trait]
impl BlueprintStore for PostgresStore {
    async fn insert_blueprint(&self, row: &BlueprintRow, is_update: bool) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Installs and updates on every server sharing the database take turns here, so the
        // check below sees every version committed before it.
        tx.batch_execute("LOCK TABLE blueprints IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        let installed: Vec<String> = tx
            .query(
                "SELECT version FROM blueprints WHERE name = $1",
                &[&row.name],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        check_insert(row, &installed, is_update)?;
        tx.execute(
            &format!(
                "INSERT INTO blueprints ({BLUEPRINT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            &[
                &row.name,
                &row.version,
                &row.description,
                &row.sha256,
                &row.manifest,
                &row.bundle,
                &row.installed_by,
                &row.installed_at,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_blueprints(&self, name: Option<&str>) -> Result<Vec<BlueprintRow>> {
        self.rows(
            &format!(
                "SELECT {BLUEPRINT_COLUMNS} FROM blueprints WHERE $1::TEXT IS NULL OR name = $1 \
                 ORDER BY name, installed_at"
            ),
            &[&name],
            blueprint,
        )
        .await
    }

    async fn delete_blueprint(&self, name: &str) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute("DELETE FROM blueprint_agents WHERE name = $1", &[&name])
            .await?;
        let count = tx
            .execute("DELETE FROM blueprints WHERE name = $1", &[&name])
            .await?;
        tx.commit().await?;
        Ok(count)
    }

    async fn record_blueprint_apply(
        &self,
        row: &BlueprintApplyRow,
        agents: &[BlueprintAgentRow],
    ) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            &format!(
                "INSERT INTO blueprint_applies ({BLUEPRINT_APPLY_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            &[
                &row.id,
                &row.name,
                &row.version,
                &row.kind,
                &row.target,
                &row.parameters,
                &row.plan,
                &row.results,
                &row.applied_by,
                &row.applied_at,
            ],
        )
        .await?;
        for a in agents {
            tx.execute(
                &format!(
                    "INSERT INTO blueprint_agents ({BLUEPRINT_AGENT_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name, agent_id) DO UPDATE SET \
                     version = EXCLUDED.version, apply_id = EXCLUDED.apply_id, \
                     status = EXCLUDED.status, applied_at = EXCLUDED.applied_at"
                ),
                &[
                    &a.name,
                    &a.agent_id,
                    &a.version,
                    &a.apply_id,
                    &a.status,
                    &a.applied_at,
                ],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_blueprint_applies(&self, name: &str) -> Result<Vec<BlueprintApplyRow>> {
        self.rows(
            &format!(
                "SELECT {BLUEPRINT_APPLY_COLUMNS} FROM blueprint_applies WHERE name = $1 \
                 ORDER BY applied_at DESC, id DESC"
            ),
            &[&name],
            apply,
        )
        .await
    }

    async fn list_blueprint_agents(&self) -> Result<Vec<BlueprintAgentRow>> {
        self.rows(
            &format!(
                "SELECT {BLUEPRINT_AGENT_COLUMNS} FROM blueprint_agents ORDER BY name, agent_id"
            ),
            &[],
            agent,
        )
        .await
    }
}
