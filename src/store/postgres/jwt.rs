//! PostgreSQL implementation of the identity-token table (see `store::jwt`).

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::store::{JwtStore, JwtSvidRow};
use crate::Result;

fn svid(row: &Row) -> Result<JwtSvidRow, tokio_postgres::Error> {
    Ok(JwtSvidRow {
        id: row.try_get(0)?,
        subject: row.try_get(1)?,
        audience: row.try_get(2)?,
        kid: row.try_get(3)?,
        issued_by: row.try_get(4)?,
        issued_at: row.try_get(5)?,
        expires_at: row.try_get(6)?,
        revoked_at: row.try_get(7)?,
        revoked_by: row.try_get(8)?,
    })
}

#[async_trait]
impl JwtStore for PostgresStore {
    async fn insert_jwt_svid(&self, row: &JwtSvidRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO jwt_svids ({JWT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            &[
                &row.id,
                &row.subject,
                &row.audience,
                &row.kid,
                &row.issued_by,
                &row.issued_at,
                &row.expires_at,
                &row.revoked_at,
                &row.revoked_by,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_jwt_svid(&self, id: &str) -> Result<Option<JwtSvidRow>> {
        self.first(
            &format!("SELECT {JWT_COLUMNS} FROM jwt_svids WHERE id = $1"),
            &[&id],
            svid,
        )
        .await
    }

    async fn list_unexpired_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>> {
        self.rows(
            &format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE expires_at > $1 ORDER BY issued_at, id"
            ),
            &[&now],
            svid,
        )
        .await
    }

    async fn list_revoked_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>> {
        self.rows(
            &format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE revoked_at IS NOT NULL AND expires_at > $1 \
                 ORDER BY revoked_at, id"
            ),
            &[&now],
            svid,
        )
        .await
    }

    async fn revoke_jwt_svid(
        &self,
        id: &str,
        revoked_at: &str,
        revoked_by: &str,
    ) -> Result<Option<JwtSvidRow>> {
        self.execute(
            "UPDATE jwt_svids SET revoked_at = $2, revoked_by = $3 \
             WHERE id = $1 AND revoked_at IS NULL",
            &[&id, &revoked_at, &revoked_by],
        )
        .await?;
        self.get_jwt_svid(id).await
    }
}
