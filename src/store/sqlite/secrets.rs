//! SQLite implementation of the secrets tables. Multi-row changes (a new version and its
//! secret's counters, a master-key rotation) run in one IMMEDIATE transaction, so a racing
//! writer sees `Conflict` instead of a half-applied change.

use crate::store::columns::*;
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::SqliteStore;
use crate::store::prefix_like;
use crate::store::secrets::{
    LeaseRow, Rewrap, SecretRow, SecretStore, SecretVersionRow, TransitKeyRow, TransitVersionRow,
    Wrapped,
};
use crate::{Error, Result};

fn secret_from_row(row: &Row<'_>) -> rusqlite::Result<SecretRow> {
    Ok(SecretRow {
        path: row.get(0)?,
        wrapped_key: row.get(1)?,
        current_version: row.get(2)?,
        created_at: row.get(3)?,
        updated_at: row.get(4)?,
    })
}

fn version_from_row(row: &Row<'_>) -> rusqlite::Result<SecretVersionRow> {
    Ok(SecretVersionRow {
        path: row.get(0)?,
        version: row.get(1)?,
        ciphertext: row.get(2)?,
        created_at: row.get(3)?,
        deleted_at: row.get(4)?,
        is_destroyed: row.get::<_, i64>(5)? != 0,
    })
}

fn transit_from_row(row: &Row<'_>) -> rusqlite::Result<TransitKeyRow> {
    Ok(TransitKeyRow {
        name: row.get(0)?,
        key_type: row.get(1)?,
        latest_version: row.get(2)?,
        min_decryption_version: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
    })
}

fn transit_version_from_row(row: &Row<'_>) -> rusqlite::Result<TransitVersionRow> {
    Ok(TransitVersionRow {
        name: row.get(0)?,
        version: row.get(1)?,
        material: row.get(2)?,
        public_key: row.get(3)?,
        created_at: row.get(4)?,
    })
}

fn lease_from_row(row: &Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok(LeaseRow {
        id: row.get(0)?,
        path: row.get(1)?,
        backend: row.get(2)?,
        backend_data: row.get(3)?,
        created_at: row.get(4)?,
        expires_at: row.get(5)?,
        max_expires_at: row.get(6)?,
        is_renewable: row.get::<_, i64>(7)? != 0,
        revoked_at: row.get(8)?,
        last_error: row.get(9)?,
    })
}

fn is_unique_violation(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::ConstraintViolation
    )
}

#[async_trait]
impl SecretStore for SqliteStore {
    async fn master_check(&self) -> Result<Option<String>> {
        self.with(|c| {
            Ok(
                c.prepare_cached("SELECT check_value FROM secrets_master_check WHERE id = ?1")?
                    .query_row([MASTER_CHECK_ID], |r| r.get(0))
                    .optional()?,
            )
        })
    }

    async fn init_master_check(&self, check_value: &str, at: &str) -> Result<String> {
        self.with(|c| {
            c.execute(
                "INSERT INTO secrets_master_check (id, check_value, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (id) DO NOTHING",
                params![MASTER_CHECK_ID, check_value, at],
            )?;
            Ok(c.query_row(
                "SELECT check_value FROM secrets_master_check WHERE id = ?1",
                [MASTER_CHECK_ID],
                |r| r.get(0),
            )?)
        })
    }

    async fn rotate_master(&self, rewrap: &Rewrap<'_>, at: &str) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut count = 0u64;
            let check: Option<String> = tx
                .query_row(
                    "SELECT check_value FROM secrets_master_check WHERE id = ?1",
                    [MASTER_CHECK_ID],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(check) = check {
                let new = rewrap(Wrapped::MasterCheck, &check)?;
                tx.execute(
                    "UPDATE secrets_master_check SET check_value = ?2, rotated_at = ?3 WHERE id = ?1",
                    params![MASTER_CHECK_ID, new, at],
                )?;
                count += 1;
            }
            let secrets: Vec<(String, String)> = tx
                .prepare("SELECT path, wrapped_key FROM secrets")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (path, wrapped) in secrets {
                let new = rewrap(Wrapped::SecretKey { path: &path }, &wrapped)?;
                tx.execute(
                    "UPDATE secrets SET wrapped_key = ?2 WHERE path = ?1",
                    params![path, new],
                )?;
                count += 1;
            }
            let transit: Vec<(String, i64, String)> = tx
                .prepare("SELECT name, version, material FROM transit_key_versions")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (name, version, material) in transit {
                let new = rewrap(
                    Wrapped::TransitKey {
                        name: &name,
                        version,
                    },
                    &material,
                )?;
                tx.execute(
                    "UPDATE transit_key_versions SET material = ?3 WHERE name = ?1 AND version = ?2",
                    params![name, version, new],
                )?;
                count += 1;
            }
            let data_keys: Vec<(String, String)> = tx
                .prepare("SELECT name, key_sealed FROM data_keys")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (name, wrapped) in data_keys {
                let new = rewrap(Wrapped::DataKey { name: &name }, &wrapped)?;
                tx.execute(
                    "UPDATE data_keys SET key_sealed = ?2 WHERE name = ?1",
                    params![name, new],
                )?;
                count += 1;
            }
            tx.commit()?;
            Ok(count)
        })
    }

    async fn data_key(&self, name: &str) -> Result<Option<String>> {
        self.with(|c| {
            Ok(
                c.prepare_cached("SELECT key_sealed FROM data_keys WHERE name = ?1")?
                    .query_row([name], |r| r.get(0))
                    .optional()?,
            )
        })
    }

    async fn init_data_key(&self, name: &str, wrapped: &str, at: &str) -> Result<String> {
        self.with(|c| {
            c.execute(
                "INSERT INTO data_keys (name, key_sealed, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO NOTHING",
                params![name, wrapped, at],
            )?;
            Ok(c.query_row(
                "SELECT key_sealed FROM data_keys WHERE name = ?1",
                [name],
                |r| r.get(0),
            )?)
        })
    }

    async fn get_secret(&self, path: &str) -> Result<Option<SecretRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {SECRET_COLUMNS} FROM secrets WHERE path = ?1"
            ))?
            .query_row([path], secret_from_row)
            .optional()?)
        })
    }

    async fn get_secret_version(
        &self,
        path: &str,
        version: i64,
    ) -> Result<Option<SecretVersionRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM secret_versions WHERE path = ?1 AND version = ?2"
            ))?
            .query_row(params![path, version], version_from_row)
            .optional()?)
        })
    }

    async fn secret_versions(&self, path: &str) -> Result<Vec<SecretVersionRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM secret_versions WHERE path = ?1 ORDER BY version"
            ))?;
            let rows = statement.query_map([path], version_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn list_secrets(&self, prefix: &str) -> Result<Vec<(SecretRow, Option<String>)>> {
        self.with(|c| {
            // The current version's deleted_at says whether the path is (soft-)deleted.
            let columns: Vec<String> = SECRET_COLUMNS
                .split(", ")
                .map(|column| format!("s.{column}"))
                .collect();
            let columns = columns.join(", ");
            let mut statement = c.prepare_cached(&format!(
                "SELECT {columns}, v.deleted_at FROM secrets s \
                 LEFT JOIN secret_versions v ON v.path = s.path AND v.version = s.current_version \
                 WHERE s.path LIKE ?1 ESCAPE '\\' ORDER BY s.path"
            ))?;
            let rows = statement.query_map([prefix_like(prefix)], |row| {
                Ok((secret_from_row(row)?, row.get(5)?))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn write_secret_version(
        &self,
        secret: &SecretRow,
        version: &SecretVersionRow,
    ) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let current: Option<i64> = tx
                .query_row(
                    "SELECT current_version FROM secrets WHERE path = ?1",
                    [&secret.path],
                    |r| r.get(0),
                )
                .optional()?;
            match current {
                None if version.version == 1 => {
                    tx.execute(
                        &format!("INSERT INTO secrets ({SECRET_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
                        params![
                            secret.path,
                            secret.wrapped_key,
                            version.version,
                            secret.created_at,
                            secret.updated_at
                        ],
                    )?;
                }
                Some(current) if current + 1 == version.version => {
                    tx.execute(
                        "UPDATE secrets SET current_version = ?2, updated_at = ?3 WHERE path = ?1",
                        params![secret.path, version.version, secret.updated_at],
                    )?;
                }
                _ => {
                    return Err(Error::Conflict(format!(
                        "secret '{}' changed while it was written",
                        secret.path
                    )))
                }
            }
            tx.execute(
                &format!("INSERT INTO secret_versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                params![
                    version.path,
                    version.version,
                    version.ciphertext,
                    version.created_at,
                    version.deleted_at,
                    version.is_destroyed as i64
                ],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn delete_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction()?;
            let mut count = 0;
            for version in versions {
                count += tx.execute(
                    "UPDATE secret_versions SET deleted_at = ?3 \
                     WHERE path = ?1 AND version = ?2 AND deleted_at IS NULL AND destroyed = 0",
                    params![path, version, at],
                )? as u64;
            }
            tx.execute(
                "UPDATE secrets SET updated_at = ?2 WHERE path = ?1",
                params![path, at],
            )?;
            tx.commit()?;
            Ok(count)
        })
    }

    async fn destroy_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction()?;
            let mut count = 0;
            for version in versions {
                count += tx.execute(
                    "UPDATE secret_versions SET ciphertext = '', destroyed = 1, \
                     deleted_at = COALESCE(deleted_at, ?3) \
                     WHERE path = ?1 AND version = ?2 AND destroyed = 0",
                    params![path, version, at],
                )? as u64;
            }
            tx.execute(
                "UPDATE secrets SET updated_at = ?2 WHERE path = ?1",
                params![path, at],
            )?;
            tx.commit()?;
            Ok(count)
        })
    }

    async fn destroy_secret(&self, path: &str) -> Result<bool> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM secret_versions WHERE path = ?1", [path])?;
            let removed = tx.execute("DELETE FROM secrets WHERE path = ?1", [path])? > 0;
            tx.commit()?;
            Ok(removed)
        })
    }

    async fn insert_transit_key(
        &self,
        key: &TransitKeyRow,
        first: &TransitVersionRow,
    ) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let inserted = tx.execute(
                &format!("INSERT INTO transit_keys ({TRANSIT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                params![
                    key.name,
                    key.key_type,
                    key.latest_version,
                    key.min_decryption_version,
                    key.created_at,
                    key.updated_at
                ],
            );
            match inserted {
                Err(e) if is_unique_violation(&e) => {
                    return Err(Error::Conflict(format!(
                        "transit key '{}' already exists",
                        key.name
                    )))
                }
                other => other?,
            };
            tx.execute(
                &format!("INSERT INTO transit_key_versions ({TRANSIT_VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
                params![first.name, first.version, first.material, first.public_key, first.created_at],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn get_transit_key(&self, name: &str) -> Result<Option<TransitKeyRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {TRANSIT_COLUMNS} FROM transit_keys WHERE name = ?1"
            ))?
            .query_row([name], transit_from_row)
            .optional()?)
        })
    }

    async fn transit_key_versions(&self, name: &str) -> Result<Vec<TransitVersionRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {TRANSIT_VERSION_COLUMNS} FROM transit_key_versions WHERE name = ?1 ORDER BY version"
            ))?;
            let rows = statement.query_map([name], transit_version_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn list_transit_keys(&self) -> Result<Vec<TransitKeyRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {TRANSIT_COLUMNS} FROM transit_keys ORDER BY name"
            ))?;
            let rows = statement.query_map([], transit_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn add_transit_version(&self, version: &TransitVersionRow, at: &str) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = tx.execute(
                "UPDATE transit_keys SET latest_version = ?2, updated_at = ?3 \
                 WHERE name = ?1 AND latest_version = ?2 - 1",
                params![version.name, version.version, at],
            )?;
            if changed == 0 {
                return Err(Error::Conflict(format!(
                    "transit key '{}' changed while it was rotated",
                    version.name
                )));
            }
            tx.execute(
                &format!("INSERT INTO transit_key_versions ({TRANSIT_VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
                params![version.name, version.version, version.material, version.public_key, version.created_at],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn set_transit_min_decryption(&self, name: &str, version: i64, at: &str) -> Result<bool> {
        self.with(|c| {
            Ok(c.execute(
                "UPDATE transit_keys SET min_decryption_version = ?2, updated_at = ?3 WHERE name = ?1",
                params![name, version, at],
            )? > 0)
        })
    }

    async fn insert_lease(&self, lease: &LeaseRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                &format!("INSERT INTO leases ({LEASE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![
                    lease.id,
                    lease.path,
                    lease.backend,
                    lease.backend_data,
                    lease.created_at,
                    lease.expires_at,
                    lease.max_expires_at,
                    lease.is_renewable as i64,
                    lease.revoked_at,
                    lease.last_error
                ],
            )?;
            Ok(())
        })
    }

    async fn get_lease(&self, id: &str) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            Ok(
                c.prepare_cached(&format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = ?1"))?
                    .query_row([id], lease_from_row)
                    .optional()?,
            )
        })
    }

    async fn list_leases(&self, prefix: &str) -> Result<Vec<LeaseRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE id LIKE ?1 ESCAPE '\\' AND revoked_at IS NULL ORDER BY id"
            ))?;
            let rows = statement.query_map([prefix_like(prefix)], lease_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn set_lease_expiry(&self, id: &str, expires_at: &str) -> Result<bool> {
        self.with(|c| {
            Ok(c.execute(
                "UPDATE leases SET expires_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, expires_at],
            )? > 0)
        })
    }

    async fn mark_lease_revoked(&self, id: &str, at: &str) -> Result<bool> {
        self.with(|c| {
            Ok(c.execute(
                "UPDATE leases SET revoked_at = ?2, last_error = NULL WHERE id = ?1 AND revoked_at IS NULL",
                params![id, at],
            )? > 0)
        })
    }

    async fn set_lease_error(&self, id: &str, error: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE leases SET last_error = ?2 WHERE id = ?1",
                params![id, error],
            )?;
            Ok(())
        })
    }

    async fn expired_leases(&self, now: &str, limit: usize) -> Result<Vec<LeaseRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE revoked_at IS NULL AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2"
            ))?;
            let rows = statement.query_map(params![now, limit as i64], lease_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }
}
