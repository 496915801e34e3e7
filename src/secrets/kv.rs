//! Versioned KV: put, get, delete (soft, per version, or destroy), list metadata.
//!
//! A value is a map of fields, stored as one JSON document sealed by the secret's data key.
//! Each put makes a new version with the whole map (as `vault kv put` does). A soft-deleted
//! version can no longer be read but keeps its ciphertext; a destroyed one loses it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::json;

use super::crypto::{self, AeadKey};
use super::{audited, store, Keyring};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::{SecretRow, SecretVersionRow};
use crate::{clock, Error, Result};

/// How often a put retries when another writer took the version it meant to write.
const WRITE_ATTEMPTS: usize = 5;
const MAX_PATH_LEN: usize = 512;

/// A secret's metadata, as `list` shows it: never a value.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Metadata {
    pub path: String,
    pub version: i64,
    pub created_at: String,
    pub updated_at: String,
    /// When the current version was deleted (soft or destroyed): the path is deleted, and
    /// `list` shows it only when asked to.
    pub deleted_at: Option<String>,
}

impl From<SecretRow> for Metadata {
    fn from(row: SecretRow) -> Self {
        Metadata {
            path: row.path,
            version: row.current_version,
            created_at: row.created_at,
            updated_at: row.updated_at,
            deleted_at: None,
        }
    }
}

/// One version of a secret with its fields in clear. `Debug` redacts the fields.
#[derive(Clone, PartialEq, Eq)]
pub struct Value {
    pub path: String,
    pub version: i64,
    pub data: BTreeMap<String, String>,
    pub created_at: String,
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Value")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("fields", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What `delete` does.
#[derive(Clone, Debug, Default)]
pub struct Deletion {
    /// Versions to delete; empty means the latest (or, with `destroy`, every version and the
    /// secret itself).
    pub versions: Vec<i64>,
    /// Erase for good instead of a soft delete.
    pub destroy: bool,
}

pub(super) fn data_key_aad(path: &str) -> Vec<u8> {
    format!("svc:kv-key:{path}").into_bytes()
}

fn value_aad(path: &str, version: i64) -> Vec<u8> {
    format!("svc:kv:{path}#{version}").into_bytes()
}

/// Paths are slash-separated segments of letters, digits, `.`, `_`, `-` (no `.` or `..`).
pub fn validate_path(path: &str) -> Result<()> {
    let is_valid_segment = |segment: &str| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if path.is_empty() || path.len() > MAX_PATH_LEN || !path.split('/').all(is_valid_segment) {
        return Err(Error::Invalid(format!(
            "invalid secret path '{path}' (segments of letters, digits, '.', '_', '-' separated by '/')"
        )));
    }
    Ok(())
}

fn data_key(keyring: &Keyring, row: &SecretRow) -> Result<AeadKey> {
    let bytes = keyring.unwrap_key(
        &row.wrapped_key,
        &data_key_aad(&row.path),
        &format!("secret '{}'", row.path),
    )?;
    let bytes: [u8; crypto::KEY_LEN] = bytes.try_into().map_err(|_| {
        Error::Internal(format!("secret '{}': data key has a bad length", row.path))
    })?;
    Ok(AeadKey::new(&bytes))
}

/// `svc-secrets put`: writes a new version with `data`; returns its metadata.
pub async fn put(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    data: BTreeMap<String, String>,
) -> Result<Metadata> {
    let fields: Vec<&String> = data.keys().collect();
    let mut detail = json!({ "fields": fields });
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("secret.write", "secret", path),
            put_inner(domain, principal, path, &data),
        )
        .await;
    if let Ok(meta) = &result {
        detail["version"] = json!(meta.version);
    }
    let action = Action::new("secret.write", "secret", path).detail(detail);
    audited(domain, principal, action, result).await
}

async fn put_inner(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    data: &BTreeMap<String, String>,
) -> Result<Metadata> {
    principal.require(Role::Operator)?;
    validate_path(path)?;
    if data.is_empty() {
        return Err(Error::Invalid(
            "a secret needs at least one KEY=VALUE".into(),
        ));
    }
    let plaintext = serde_json::to_vec(data).map_err(Error::internal)?;
    let keyring = domain.secrets.keyring().await?;
    for _ in 0..WRITE_ATTEMPTS {
        let now = clock::now_rfc3339();
        let (secret, key) = match store(domain).get_secret(path).await? {
            Some(mut row) => {
                let key = data_key(&keyring, &row)?;
                row.current_version += 1;
                row.updated_at = now.clone();
                (row, key)
            }
            None => {
                let key_bytes = crypto::random_key();
                let row = SecretRow {
                    path: path.to_string(),
                    wrapped_key: keyring.wrap(&key_bytes, &data_key_aad(path)),
                    current_version: 1,
                    created_at: now.clone(),
                    updated_at: now.clone(),
                };
                (row, AeadKey::new(&key_bytes))
            }
        };
        let version = SecretVersionRow {
            path: path.to_string(),
            version: secret.current_version,
            ciphertext: key.seal_text(&plaintext, &value_aad(path, secret.current_version)),
            created_at: now,
            deleted_at: None,
            is_destroyed: false,
        };
        match store(domain).write_secret_version(&secret, &version).await {
            Ok(()) => return Ok(secret.into()),
            Err(Error::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict(format!(
        "secret '{path}' is being written by others; try again"
    )))
}

/// `svc-secrets get`: the latest version, or `version`.
pub async fn get(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    version: Option<i64>,
) -> Result<Value> {
    let result = get_inner(domain, principal, path, version).await;
    let shown = result.as_ref().map(|v| v.version).ok().or(version);
    let action = Action::new("secret.read", "secret", path).detail(json!({ "version": shown }));
    audited(domain, principal, action, result).await
}

async fn get_inner(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    version: Option<i64>,
) -> Result<Value> {
    principal.require(Role::Operator)?;
    let not_found = || Error::NotFound(format!("secret '{path}' not found"));
    validate_path(path).map_err(|_| not_found())?;
    let keyring = domain.secrets.keyring().await?;
    let secret = store(domain)
        .get_secret(path)
        .await?
        .ok_or_else(not_found)?;
    let number = version.unwrap_or(secret.current_version);
    let row = store(domain)
        .get_secret_version(path, number)
        .await?
        .ok_or_else(|| Error::NotFound(format!("secret '{path}' has no version {number}")))?;
    if row.is_destroyed {
        return Err(Error::NotFound(format!(
            "secret '{path}' version {number} was destroyed"
        )));
    }
    if row.deleted_at.is_some() {
        return Err(Error::NotFound(format!(
            "secret '{path}' version {number} is deleted"
        )));
    }
    let key = data_key(&keyring, &secret)?;
    let plaintext = key
        .open_text(&row.ciphertext, &value_aad(path, number))
        .map_err(|_| {
            tracing::error!(
                path,
                version = number,
                "secret version failed authentication: its ciphertext was altered or moved"
            );
            Error::Internal(format!(
                "secret '{path}' version {number}: integrity check failed"
            ))
        })?;
    let data: BTreeMap<String, String> = serde_json::from_slice(&plaintext)
        .map_err(|e| Error::Internal(format!("secret '{path}' version {number}: {e}")))?;
    Ok(Value {
        path: path.to_string(),
        version: number,
        data,
        created_at: row.created_at,
    })
}

/// `svc-secrets delete`: soft-deletes (or destroys) versions; returns how many changed.
pub async fn delete(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    deletion: &Deletion,
) -> Result<u64> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new(
                if deletion.destroy {
                    "secret.destroy"
                } else {
                    "secret.delete"
                },
                "secret",
                path,
            ),
            delete_inner(domain, principal, path, deletion),
        )
        .await;
    let (name, detail) = if deletion.destroy {
        ("secret.destroy", json!({ "versions": deletion.versions }))
    } else {
        ("secret.delete", json!({ "versions": deletion.versions }))
    };
    audited(
        domain,
        principal,
        Action::new(name, "secret", path).detail(detail),
        result,
    )
    .await
}

async fn delete_inner(
    domain: &Domain,
    principal: &Principal,
    path: &str,
    deletion: &Deletion,
) -> Result<u64> {
    principal.require(Role::Operator)?;
    let not_found = || Error::NotFound(format!("secret '{path}' not found"));
    validate_path(path).map_err(|_| not_found())?;
    let secret = store(domain)
        .get_secret(path)
        .await?
        .ok_or_else(not_found)?;
    let now = clock::now_rfc3339();
    if deletion.destroy && deletion.versions.is_empty() {
        let versions = store(domain).secret_versions(path).await?.len() as u64;
        store(domain).destroy_secret(path).await?;
        return Ok(versions);
    }
    let versions = if deletion.versions.is_empty() {
        vec![secret.current_version]
    } else {
        deletion.versions.clone()
    };
    if let Some(bad) = versions
        .iter()
        .find(|v| **v < 1 || **v > secret.current_version)
    {
        return Err(Error::NotFound(format!(
            "secret '{path}' has no version {bad}"
        )));
    }
    if deletion.destroy {
        store(domain)
            .destroy_secret_versions(path, &versions, &now)
            .await
    } else {
        store(domain)
            .delete_secret_versions(path, &versions, &now)
            .await
    }
}

/// `svc-secrets list`: metadata of the secrets under `prefix` (readonly may list). Paths whose
/// current version is deleted are left out unless `include_deleted`.
pub async fn list(
    domain: &Domain,
    principal: &Principal,
    prefix: &str,
    include_deleted: bool,
) -> Result<Vec<Metadata>> {
    let result = list_inner(domain, principal, prefix, include_deleted).await;
    let mut action = Action::new("secret.list", "secret", prefix);
    if include_deleted {
        action = action.detail(json!({ "include_deleted": true }));
    }
    audited(domain, principal, action, result).await
}

async fn list_inner(
    domain: &Domain,
    principal: &Principal,
    prefix: &str,
    include_deleted: bool,
) -> Result<Vec<Metadata>> {
    principal.require(Role::Readonly)?;
    let rows = store(domain).list_secrets(prefix).await?;
    Ok(rows
        .into_iter()
        .filter(|(_, deleted_at)| include_deleted || deleted_at.is_none())
        .map(|(row, deleted_at)| Metadata {
            deleted_at,
            ..Metadata::from(row)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn path_rules() {
        let cases = [
            ("db/prod", true),
            ("a.b_c-d/e", true),
            ("", false),
            ("/db", false),
            ("db/", false),
            ("db//x", false),
            ("db/../x", false),
            ("db prod", false),
        ];
        for (path, ok) in cases {
            assert_eq!(validate_path(path).is_ok(), ok, "{path}");
        }
    }

    /// A change whose audit record cannot be written is never performed: its attempt row is
    /// written before it, so the first write that finds the audit log broken is refused, and
    /// every later change too (reads go on) until a row can be written again.
    #[tokio::test]
    async fn changes_are_refused_while_the_audit_log_cannot_be_written() {
        let (domain, dir, _) = testing::domain().await;
        let admin = Principal::server();
        put(&domain, &admin, "db/a", fields(&[("v", "1")]))
            .await
            .unwrap();
        let blocker = rusqlite::Connection::open(dir.path().join("svc.db")).unwrap();
        blocker
            .execute_batch(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_events \
                 BEGIN SELECT RAISE(ABORT, 'audit refused by the test'); END;",
            )
            .unwrap();
        for value in ["2", "3"] {
            let refused = put(&domain, &admin, "db/a", fields(&[("v", value)]))
                .await
                .unwrap_err();
            assert!(matches!(refused, Error::Unavailable(_)), "{refused:?}");
            assert!(
                refused.to_string().contains("audit log cannot be written"),
                "{refused}"
            );
        }
        assert!(domain.auditor.health().await.is_err());
        // Reads go on, and neither version 2 nor 3 was written.
        let current = get(&domain, &admin, "db/a", None).await.unwrap();
        assert_eq!(current.version, 1);
        blocker.execute_batch("DROP TRIGGER refuse_audit;").unwrap();
        // Readiness's probe writes the `audit.recover` row; changes are admitted again.
        domain.auditor.health().await.unwrap();
        let meta = put(&domain, &admin, "db/a", fields(&[("v", "3")]))
            .await
            .unwrap();
        assert_eq!(meta.version, 2);
    }

    #[tokio::test]
    async fn versions_deletes_and_roles() {
        let (domain, _dir, _) = testing::domain().await;
        let admin = Principal::server();
        let readonly = Principal {
            role: Role::Readonly,
            ..Principal::server()
        };
        put(&domain, &admin, "db/prod", fields(&[("user", "a")]))
            .await
            .unwrap();
        let meta = put(&domain, &admin, "db/prod", fields(&[("user", "b")]))
            .await
            .unwrap();
        assert_eq!(meta.version, 2);
        assert_eq!(
            get(&domain, &admin, "db/prod", None).await.unwrap().data["user"],
            "b"
        );
        assert_eq!(
            get(&domain, &admin, "db/prod", Some(1)).await.unwrap().data["user"],
            "a"
        );
        assert!(matches!(
            get(&domain, &readonly, "db/prod", None).await,
            Err(Error::Forbidden(_))
        ));
        assert_eq!(
            list(&domain, &readonly, "db/", false).await.unwrap().len(),
            1
        );
        assert_eq!(
            delete(&domain, &admin, "db/prod", &Deletion::default())
                .await
                .unwrap(),
            1
        );
        assert!(matches!(
            get(&domain, &admin, "db/prod", None).await,
            Err(Error::NotFound(_))
        ));
        assert!(get(&domain, &admin, "db/prod", Some(1)).await.is_ok());
        // Its current version is deleted: listed only when asked, and marked.
        assert!(list(&domain, &readonly, "db/", false)
            .await
            .unwrap()
            .is_empty());
        let listed = list(&domain, &readonly, "db/", true).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].deleted_at.is_some());
        let destroy = Deletion {
            versions: vec![1],
            destroy: true,
        };
        assert_eq!(
            delete(&domain, &admin, "db/prod", &destroy).await.unwrap(),
            1
        );
        assert!(matches!(
            get(&domain, &admin, "db/prod", Some(1)).await,
            Err(Error::NotFound(_))
        ));
        let all = Deletion {
            versions: vec![],
            destroy: true,
        };
        assert_eq!(delete(&domain, &admin, "db/prod", &all).await.unwrap(), 2);
        assert!(list(&domain, &admin, "", true).await.unwrap().is_empty());
    }
}
