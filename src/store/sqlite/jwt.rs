//! SQLite implementation of the identity-token table.

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row};

use super::SqliteStore;
use crate::store::{JwtStore, JwtSvidRow};
use crate::Result;

fn from_row(row: &Row<'_>) -> rusqlite::Result<JwtSvidRow> {
    Ok(JwtSvidRow {
        id: row.get(0)?,
        subject: row.get(1)?,
        audience: row.get(2)?,
        kid: row.get(3)?,
        issued_by: row.get(4)?,
        issued_at: row.get(5)?,
        expires_at: row.get(6)?,
        revoked_at: row.get(7)?,
        revoked_by: row.get(8)?,
    })
}

#[async_trait]
impl JwtStore for SqliteStore {
    async fn insert_jwt_svid(&self, row: &JwtSvidRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(&format!(
                "INSERT INTO jwt_svids ({JWT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))?
            .execute(params![
                row.id,
                row.subject,
                row.audience,
                row.kid,
                row.issued_by,
                row.issued_at,
                row.expires_at,
                row.revoked_at,
                row.revoked_by
            ])?;
            Ok(())
        })
    }

    async fn get_jwt_svid(&self, id: &str) -> Result<Option<JwtSvidRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE id = ?1"
            ))?
            .query_row([id], from_row)
            .optional()?)
        })
    }

    async fn list_unexpired_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE expires_at > ?1 ORDER BY issued_at, id"
            ))?;
            let rows = statement.query_map([now], from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn list_revoked_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE revoked_at IS NOT NULL AND expires_at > ?1 \
                 ORDER BY revoked_at, id"
            ))?;
            let rows = statement.query_map([now], from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    async fn revoke_jwt_svid(
        &self,
        id: &str,
        revoked_at: &str,
        revoked_by: &str,
    ) -> Result<Option<JwtSvidRow>> {
        self.with(|c| {
            c.prepare_cached(
                "UPDATE jwt_svids SET revoked_at = ?2, revoked_by = ?3 \
                 WHERE id = ?1 AND revoked_at IS NULL",
            )?
            .execute(params![id, revoked_at, revoked_by])?;
            Ok(c.prepare_cached(&format!(
                "SELECT {JWT_COLUMNS} FROM jwt_svids WHERE id = ?1"
            ))?
            .query_row([id], from_row)
            .optional()?)
        })
    }
}
