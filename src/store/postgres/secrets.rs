//! PostgreSQL implementation of the secrets tables (see `store::secrets`). Where SQLite takes
//! its one write lock (`BEGIN IMMEDIATE`), this takes row or table locks that other servers
//! sharing the database see as well, so a racing writer gets `Conflict` or waits, never a
//! half-applied change.

use crate::store::columns::*;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::{rows_on, PostgresStore};
use crate::store::prefix_like;
use crate::store::secrets::{
    LeaseRow, Rewrap, SecretRow, SecretStore, SecretVersionRow, TransitKeyRow, TransitVersionRow,
    Wrapped,
};
use crate::{Error, Result};

type Mapped<T> = std::result::Result<T, tokio_postgres::Error>;

fn secret(row: &Row) -> Mapped<SecretRow> {
    Ok(SecretRow {
        path: row.try_get(0)?,
        wrapped_key: row.try_get(1)?,
        current_version: row.try_get(2)?,
        created_at: row.try_get(3)?,
        updated_at: row.try_get(4)?,
    })
}

fn version(row: &Row) -> Mapped<SecretVersionRow> {
    Ok(SecretVersionRow {
        path: row.try_get(0)?,
        version: row.try_get(1)?,
        ciphertext: row.try_get(2)?,
        created_at: row.try_get(3)?,
        deleted_at: row.try_get(4)?,
        is_destroyed: row.try_get::<_, i64>(5)? != 0,
    })
}

fn transit(row: &Row) -> Mapped<TransitKeyRow> {
    Ok(TransitKeyRow {
        name: row.try_get(0)?,
        key_type: row.try_get(1)?,
        latest_version: row.try_get(2)?,
        min_decryption_version: row.try_get(3)?,
        created_at: row.try_get(4)?,
        updated_at: row.try_get(5)?,
    })
}

fn transit_version(row: &Row) -> Mapped<TransitVersionRow> {
    Ok(TransitVersionRow {
        name: row.try_get(0)?,
        version: row.try_get(1)?,
        material: row.try_get(2)?,
        public_key: row.try_get(3)?,
        created_at: row.try_get(4)?,
    })
}

fn lease(row: &Row) -> Mapped<LeaseRow> {
    Ok(LeaseRow {
        id: row.try_get(0)?,
        path: row.try_get(1)?,
        backend: row.try_get(2)?,
        backend_data: row.try_get(3)?,
        created_at: row.try_get(4)?,
        expires_at: row.try_get(5)?,
        max_expires_at: row.try_get(6)?,
        is_renewable: row.try_get::<_, i64>(7)? != 0,
        revoked_at: row.try_get(8)?,
        last_error: row.try_get(9)?,
    })
}

fn pair(row: &Row) -> Mapped<(String, String)> {
    Ok((row.try_get(0)?, row.try_get(1)?))
}

#[async_trait]
impl SecretStore for PostgresStore {
    async fn master_check(&self) -> Result<Option<String>> {
        self.first(
            "SELECT check_value FROM secrets_master_check WHERE id = $1",
            &[&MASTER_CHECK_ID],
            |r| r.try_get(0),
        )
        .await
    }

    async fn init_master_check(&self, check_value: &str, at: &str) -> Result<String> {
        self.execute(
            "INSERT INTO secrets_master_check (id, check_value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO NOTHING",
            &[&MASTER_CHECK_ID, &check_value, &at],
        )
        .await?;
        self.master_check()
            .await?
            .ok_or_else(|| Error::internal("the master-key check row vanished"))
    }

    async fn rotate_master(&self, rewrap: &Rewrap<'_>, at: &str) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // EXCLUSIVE: readers go on, writers (which wrap with the old key) wait for the commit.
        tx.batch_execute(
            "LOCK TABLE secrets_master_check, secrets, transit_key_versions, data_keys \
             IN EXCLUSIVE MODE",
        )
        .await?;
        let mut count = 0u64;
        let check = rows_on(
            &tx,
            "SELECT check_value FROM secrets_master_check WHERE id = $1",
            &[&MASTER_CHECK_ID],
            |r| r.try_get::<_, String>(0),
        )
        .await?;
        if let Some(check) = check.first() {
            let new = rewrap(Wrapped::MasterCheck, check)?;
            tx.execute(
                "UPDATE secrets_master_check SET check_value = $2, rotated_at = $3 WHERE id = $1",
                &[&MASTER_CHECK_ID, &new, &at],
            )
            .await?;
            count += 1;
        }
        let secrets = rows_on(&tx, "SELECT path, wrapped_key FROM secrets", &[], pair).await?;
        for (path, wrapped) in secrets {
            let new = rewrap(Wrapped::SecretKey { path: &path }, &wrapped)?;
            tx.execute(
                "UPDATE secrets SET wrapped_key = $2 WHERE path = $1",
                &[&path, &new],
            )
            .await?;
            count += 1;
        }
        let transit = rows_on(
            &tx,
            "SELECT name, version, material FROM transit_key_versions",
            &[],
            |r| {
                Ok((
                    r.try_get::<_, String>(0)?,
                    r.try_get::<_, i64>(1)?,
                    r.try_get::<_, String>(2)?,
                ))
            },
        )
        .await?;
        for (name, version, material) in transit {
            let new = rewrap(
                Wrapped::TransitKey {
                    name: &name,
                    version,
                },
                &material,
            )?;
            tx.execute(
                "UPDATE transit_key_versions SET material = $3 WHERE name = $1 AND version = $2",
                &[&name, &version, &new],
            )
            .await?;
            count += 1;
        }
        let data_keys = rows_on(&tx, "SELECT name, key_sealed FROM data_keys", &[], pair).await?;
        for (name, wrapped) in data_keys {
            let new = rewrap(Wrapped::DataKey { name: &name }, &wrapped)?;
            tx.execute(
                "UPDATE data_keys SET key_sealed = $2 WHERE name = $1",
                &[&name, &new],
            )
            .await?;
            count += 1;
        }
        tx.commit().await?;
        Ok(count)
    }

    async fn data_key(&self, name: &str) -> Result<Option<String>> {
        self.first(
            "SELECT key_sealed FROM data_keys WHERE name = $1",
            &[&name],
            |r| r.try_get(0),
        )
        .await
    }

    async fn init_data_key(&self, name: &str, wrapped: &str, at: &str) -> Result<String> {
        self.execute(
            "INSERT INTO data_keys (name, key_sealed, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
            &[&name, &wrapped, &at],
        )
        .await?;
        self.data_key(name)
            .await?
            .ok_or_else(|| Error::internal("the data key row vanished"))
    }

    async fn get_secret(&self, path: &str) -> Result<Option<SecretRow>> {
        self.first(
            &format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE path = $1"),
            &[&path],
            secret,
        )
        .await
    }

    async fn get_secret_version(
        &self,
        path: &str,
        number: i64,
    ) -> Result<Option<SecretVersionRow>> {
        self.first(
            &format!(
                "SELECT {VERSION_COLUMNS} FROM secret_versions WHERE path = $1 AND version = $2"
            ),
            &[&path, &number],
            version,
        )
        .await
    }

    async fn secret_versions(&self, path: &str) -> Result<Vec<SecretVersionRow>> {
        self.rows(
            &format!(
                "SELECT {VERSION_COLUMNS} FROM secret_versions WHERE path = $1 ORDER BY version"
            ),
            &[&path],
            version,
        )
        .await
    }

    async fn list_secrets(&self, prefix: &str) -> Result<Vec<(SecretRow, Option<String>)>> {
        // The current version's deleted_at says whether the path is (soft-)deleted.
        let columns: Vec<String> = SECRET_COLUMNS
            .split(", ")
            .map(|column| format!("s.{column}"))
            .collect();
        self.rows(
            &format!(
                "SELECT {}, v.deleted_at FROM secrets s \
                 LEFT JOIN secret_versions v ON v.path = s.path AND v.version = s.current_version \
                 WHERE s.path LIKE $1 ESCAPE '\\' ORDER BY s.path",
                columns.join(", ")
            ),
            &[&prefix_like(prefix)],
            |row| Ok((secret(row)?, row.try_get(5)?)),
        )
        .await
    }

    async fn write_secret_version(
        &self,
        secret: &SecretRow,
        version: &SecretVersionRow,
    ) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // FOR UPDATE: a second writer of the same path waits here, then sees the new current
        // version and gets `Conflict`. Two first writes race on the primary key instead, and
        // the loser's duplicate key is `Conflict` as well.
        let current = rows_on(
            &tx,
            "SELECT current_version FROM secrets WHERE path = $1 FOR UPDATE",
            &[&secret.path],
            |r| r.try_get::<_, i64>(0),
        )
        .await?;
        match current.first() {
            None if version.version == 1 => {
                tx.execute(
                    &format!("INSERT INTO secrets ({SECRET_COLUMNS}) VALUES ($1, $2, $3, $4, $5)"),
                    &[
                        &secret.path,
                        &secret.wrapped_key,
                        &version.version,
                        &secret.created_at,
                        &secret.updated_at,
                    ],
                )
                .await
                .map_err(|e| changed_meanwhile(e.into(), &secret.path))?;
            }
            Some(current) if current + 1 == version.version => {
                tx.execute(
                    "UPDATE secrets SET current_version = $2, updated_at = $3 WHERE path = $1",
                    &[&secret.path, &version.version, &secret.updated_at],
                )
                .await?;
            }
            _ => {
                return Err(changed_meanwhile(
                    Error::Conflict(String::new()),
                    &secret.path,
                ))
            }
        }
        tx.execute(
            &format!(
                "INSERT INTO secret_versions ({VERSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            &[
                &version.path,
                &version.version,
                &version.ciphertext,
                &version.created_at,
                &version.deleted_at,
                &(version.is_destroyed as i64),
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn delete_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let count = tx
            .execute(
                "UPDATE secret_versions SET deleted_at = $3 \
                 WHERE path = $1 AND version = ANY($2) AND deleted_at IS NULL AND destroyed = 0",
                &[&path, &versions, &at],
            )
            .await?;
        tx.execute(
            "UPDATE secrets SET updated_at = $2 WHERE path = $1",
            &[&path, &at],
        )
        .await?;
        tx.commit().await?;
        Ok(count)
    }

    async fn destroy_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let count = tx
            .execute(
                "UPDATE secret_versions SET ciphertext = '', destroyed = 1, \
                 deleted_at = COALESCE(deleted_at, $3) \
                 WHERE path = $1 AND version = ANY($2) AND destroyed = 0",
                &[&path, &versions, &at],
            )
            .await?;
        tx.execute(
            "UPDATE secrets SET updated_at = $2 WHERE path = $1",
            &[&path, &at],
        )
        .await?;
        tx.commit().await?;
        Ok(count)
    }

    async fn destroy_secret(&self, path: &str) -> Result<bool> {
        // The versions go with it (ON DELETE CASCADE), in the same statement.
        Ok(self
            .execute("DELETE FROM secrets WHERE path = $1", &[&path])
            .await?
            > 0)
    }

    async fn insert_transit_key(
        &self,
        key: &TransitKeyRow,
        first: &TransitVersionRow,
    ) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let inserted = tx
            .execute(
                &format!(
                    "INSERT INTO transit_keys ({TRANSIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
                ),
                &[
                    &key.name,
                    &key.key_type,
                    &key.latest_version,
                    &key.min_decryption_version,
                    &key.created_at,
                    &key.updated_at,
                ],
            )
            .await;
        match inserted.map_err(Error::from) {
            Err(Error::Conflict(_)) => {
                return Err(Error::Conflict(format!(
                    "transit key '{}' already exists",
                    key.name
                )))
            }
            other => other?,
        };
        tx.execute(
            &format!(
                "INSERT INTO transit_key_versions ({TRANSIT_VERSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5)"
            ),
            &[
                &first.name,
                &first.version,
                &first.material,
                &first.public_key,
                &first.created_at,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_transit_key(&self, name: &str) -> Result<Option<TransitKeyRow>> {
        self.first(
            &format!("SELECT {TRANSIT_COLUMNS} FROM transit_keys WHERE name = $1"),
            &[&name],
            transit,
        )
        .await
    }

    async fn transit_key_versions(&self, name: &str) -> Result<Vec<TransitVersionRow>> {
        self.rows(
            &format!(
                "SELECT {TRANSIT_VERSION_COLUMNS} FROM transit_key_versions WHERE name = $1 \
                 ORDER BY version"
            ),
            &[&name],
            transit_version,
        )
        .await
    }

    async fn list_transit_keys(&self) -> Result<Vec<TransitKeyRow>> {
        self.rows(
            &format!("SELECT {TRANSIT_COLUMNS} FROM transit_keys ORDER BY name"),
            &[],
            transit,
        )
        .await
    }

    async fn add_transit_version(&self, version: &TransitVersionRow, at: &str) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The UPDATE's WHERE is re-checked on a row another rotation just changed, so of two
        // racing rotations one changes nothing and gets `Conflict`.
        let changed = tx
            .execute(
                "UPDATE transit_keys SET latest_version = $2::BIGINT, updated_at = $3 \
                 WHERE name = $1 AND latest_version = $2::BIGINT - 1",
                &[&version.name, &version.version, &at],
            )
            .await?;
        if changed == 0 {
            return Err(Error::Conflict(format!(
                "transit key '{}' changed while it was rotated",
                version.name
            )));
        }
        tx.execute(
            &format!(
                "INSERT INTO transit_key_versions ({TRANSIT_VERSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5)"
            ),
            &[
                &version.name,
                &version.version,
                &version.material,
                &version.public_key,
                &version.created_at,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_transit_min_decryption(&self, name: &str, version: i64, at: &str) -> Result<bool> {
        Ok(self
            .execute(
                "UPDATE transit_keys SET min_decryption_version = $2, updated_at = $3 WHERE name = $1",
                &[&name, &version, &at],
            )
            .await?
            > 0)
    }

    async fn insert_lease(&self, lease: &LeaseRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO leases ({LEASE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            &[
                &lease.id,
                &lease.path,
                &lease.backend,
                &lease.backend_data,
                &lease.created_at,
                &lease.expires_at,
                &lease.max_expires_at,
                &(lease.is_renewable as i64),
                &lease.revoked_at,
                &lease.last_error,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_lease(&self, id: &str) -> Result<Option<LeaseRow>> {
        self.first(
            &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1"),
            &[&id],
            lease,
        )
        .await
    }

    async fn list_leases(&self, prefix: &str) -> Result<Vec<LeaseRow>> {
        self.rows(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE id LIKE $1 ESCAPE '\\' AND revoked_at IS NULL ORDER BY id"
            ),
            &[&prefix_like(prefix)],
            lease,
        )
        .await
    }

    async fn set_lease_expiry(&self, id: &str, expires_at: &str) -> Result<bool> {
        Ok(self
            .execute(
                "UPDATE leases SET expires_at = $2 WHERE id = $1 AND revoked_at IS NULL",
                &[&id, &expires_at],
            )
            .await?
            > 0)
    }

    async fn mark_lease_revoked(&self, id: &str, at: &str) -> Result<bool> {
        Ok(self
            .execute(
                "UPDATE leases SET revoked_at = $2, last_error = NULL \
                 WHERE id = $1 AND revoked_at IS NULL",
                &[&id, &at],
            )
            .await?
            > 0)
    }

    async fn set_lease_error(&self, id: &str, error: &str) -> Result<()> {
        self.execute(
            "UPDATE leases SET last_error = $2 WHERE id = $1",
            &[&id, &error],
        )
        .await?;
        Ok(())
    }

    async fn expired_leases(&self, now: &str, limit: usize) -> Result<Vec<LeaseRow>> {
        self.rows(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE revoked_at IS NULL AND expires_at <= $1 ORDER BY expires_at LIMIT $2"
            ),
            &[&now, &(limit as i64)],
            lease,
        )
        .await
    }
}

/// A first write that lost the race to another: the same `Conflict` as SQLite gives.
fn changed_meanwhile(error: Error, path: &str) -> Error {
    match error {
        Error::Conflict(_) => {
            Error::Conflict(format!("secret '{path}' changed while it was written"))
        }
        other => other,
    }
}
