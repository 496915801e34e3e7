//! Secrets (contract §11): versioned KV, the transit engine and dynamic-secret leases.
//!
//! Owns the running master key (the keyring), the transit key cache and the lease backends.
//! No transport code: gRPC (and REST, for the metadata list) call the functions of `kv`,
//! `transit` and `leases` with a `Principal`; each checks the role (§4: readonly may list
//! metadata, operator+ reads and writes values, admin rotates the master key; the transports
//! have checked it once already, before reading the request) and writes one audit row whose
//! detail never holds a value.
//!
//! Envelope encryption: every KV secret has a random data key, stored wrapped (AES-256-GCM)
//! by the master key with the path as associated data; every version of its value is sealed
//! by the data key with the path and version as associated data. Transit key material is
//! wrapped by the master key the same way. So the master key only ever encrypts keys, and
//! rotating it re-wraps keys, never values. At first start a check value (a known marker
//! sealed by the master key) is stored; every later start verifies it and refuses a wrong key.
//!
//! Architecture invariant: nothing in this module logs or audits a value, a password or key
//! material; secret-bearing types have a redacting `Debug`.

pub mod at_rest;
pub mod crypto;
pub mod kv;
pub mod leases;
pub mod postgres;
pub mod transit;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{RwLock, RwLockReadGuard};

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::config::SecretsConfig;
use crate::domain::Domain;
use crate::store::{SecretStore, Wrapped};
use crate::{clock, Error, Result};

use crypto::AeadKey;

/// The secrets domain's state inside `Domain`. Sealed (no master key) until `start`.
#[derive(Default)]
pub struct Secrets {
    /// Held for reading by every operation and for writing by a master-key rotation, so a
    /// rotation never interleaves with a write that wraps under the old key.
    keyring: RwLock<Option<Keyring>>,
    /// Decrypted transit keys by name; cleared on rotation, config change and master rotation.
    transit_cache: Mutex<HashMap<String, Arc<transit::KeySet>>>,
    config: std::sync::RwLock<SecretsConfig>,
    /// The current master key's bytes, for the other at-rest users (the CA keys), which must
    /// follow a rotation too.
    current_master: std::sync::RwLock<Option<[u8; crypto::KEY_LEN]>>,
    /// The at-rest data key (`at_rest`), once unwrapped.
    at_rest: std::sync::OnceLock<AeadKey>,
}

/// The running master key.
#[derive(Debug)]
pub struct Keyring {
    master: AeadKey,
}

impl Keyring {
    pub fn new(master_key: &[u8; crypto::KEY_LEN]) -> Self {
        Keyring {
            master: AeadKey::new(master_key),
        }
    }

    /// Wraps a key (data key or transit material) under the master key, bound to `aad`.
    fn wrap(&self, key: &[u8], aad: &[u8]) -> String {
        self.master.seal_text(key, aad)
    }

    fn unwrap_key(&self, wrapped: &str, aad: &[u8], what: &str) -> Result<Vec<u8>> {
        self.master.open_text(wrapped, aad).map_err(|_| {
            tracing::error!(
                what,
                "wrapped key failed authentication: tampered store or wrong master key"
            );
            Error::Internal(format!("{what}: wrapped key failed authentication"))
        })
    }
}

/// Associated data of each kind of wrapped value.
fn wrapped_aad(wrapped: Wrapped<'_>) -> Vec<u8> {
    match wrapped {
        Wrapped::MasterCheck => Vec::new(),
        Wrapped::SecretKey { path } => kv::data_key_aad(path),
        Wrapped::TransitKey { name, version } => transit::material_aad(name, version),
        Wrapped::DataKey { name } => at_rest::data_key_aad(name),
    }
}

impl Secrets {
    /// The keyring for one operation; `Unavailable` while sealed.
    async fn keyring(&self) -> Result<RwLockReadGuard<'_, Keyring>> {
        let guard = self.keyring.read().await;
        RwLockReadGuard::try_map(guard, |k| k.as_ref())
            .map_err(|_| Error::Unavailable("the secrets engine has no master key".into()))
    }

    /// The master key in force (None before `start`).
    pub fn current_master(&self) -> Option<[u8; crypto::KEY_LEN]> {
        *self.current_master.read().expect("master lock poisoned")
    }

    fn config(&self) -> SecretsConfig {
        self.config.read().expect("config lock poisoned").clone()
    }
}

/// Unlocks the secrets engine with a master key not checked yet: [`verify_master_key`] (on a
/// new store it records the check value), then [`unlock`]. A wrong master key is refused with
/// an error that says so.
pub async fn start(domain: &Domain, master_key: &[u8; 32], config: &SecretsConfig) -> Result<()> {
    verify_master_key(domain.store.as_ref(), master_key).await?;
    unlock(domain, master_key, config).await;
    Ok(())
}

/// Unlocks the secrets engine with a master key [`verify_master_key`] accepted on this store:
/// at server start, where the server checked it once before anything sealed was opened
/// (`domain::Unlocked`).
pub async fn unlock(domain: &Domain, master_key: &[u8; 32], config: &SecretsConfig) {
    *domain
        .secrets
        .current_master
        .write()
        .expect("master lock poisoned") = Some(*master_key);
    *domain.secrets.keyring.write().await = Some(Keyring::new(master_key));
    *domain.secrets.config.write().expect("config lock poisoned") = config.clone();
}

/// Refuses a master key other than the one this store's secrets were sealed with (the first
/// call on a new store records it). The server runs this once at start, before it opens
/// anything sealed; the offline restore runs it on the snapshot's store.
pub async fn verify_master_key(
    store: &dyn crate::store::Store,
    master_key: &[u8; 32],
) -> Result<()> {
    let keyring = Keyring::new(master_key);
    let store = store.secrets();
    let check = match store.master_check().await? {
        Some(check) => check,
        None => {
            let value = crypto::master_check_value(&keyring.master);
            store
                .init_master_check(&value, &clock::now_rfc3339())
                .await?
        }
    };
    if !crypto::verify_master_check(&keyring.master, &check) {
        return Err(Error::Invalid(
            "master_key does not match the key this data dir's secrets were encrypted with \
             (if it was rotated with 'svc-secrets rotate-master', set master_key to the new key)"
                .into(),
        ));
    }
    Ok(())
}

/// `svc-secrets rotate-master`: re-wraps every data key, every transit key version and the
/// check value under `new_key` in one store transaction, then switches the running server to
/// it. Requests wait for the rotation (milliseconds per thousand keys); none fails.
pub async fn rotate_master(domain: &Domain, principal: &Principal, new_key: &str) -> Result<u64> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("secret.rotate_master", "secret", "master_key"),
            rotate_master_inner(domain, principal, new_key),
        )
        .await;
    let detail = match &result {
        Ok(count) => serde_json::json!({ "rewrapped": count }),
        Err(_) => serde_json::json!({}),
    };
    let action = Action::new("secret.rotate_master", "secret", "master_key").detail(detail);
    domain.auditor.record(principal, action, &result).await;
    result
}

async fn rotate_master_inner(domain: &Domain, principal: &Principal, new_key: &str) -> Result<u64> {
    principal.require(Role::Admin)?;
    let new_bytes = crypto::decode_key(new_key)?;
    let new = Keyring::new(&new_bytes);
    let mut guard = domain.secrets.keyring.write().await;
    // The CA keys are sealed under the same master key: re-seal them first, so a failure
    // leaves everything under the old key.
    let old_bytes = domain
        .secrets
        .current_master()
        .ok_or_else(|| Error::Unavailable("the secrets engine has no master key".into()))?;
    let ca_rows = crate::identity::reseal_ca(domain.store.as_ref(), &old_bytes, &new_bytes).await?;
    // Webhook signing secrets too; undone with the CA keys if what follows fails.
    let undo_ca = || async {
        if let Err(undo) =
            crate::identity::reseal_ca(domain.store.as_ref(), &new_bytes, &old_bytes).await
        {
            tracing::error!(error = %undo, "CA keys could not be re-sealed under the old master key");
        }
    };
    let webhook_rows = match crate::webhooks::reseal_secrets(
        domain.store.as_ref(),
        &old_bytes,
        &new_bytes,
    )
    .await
    {
        Ok(count) => count,
        Err(e) => {
            undo_ca().await;
            return Err(e);
        }
    };
    let old = guard
        .as_ref()
        .ok_or_else(|| Error::Unavailable("the secrets engine has no master key".into()))?;
    let rewrap = |wrapped: Wrapped<'_>, value: &str| -> Result<String> {
        if wrapped == Wrapped::MasterCheck {
            return crypto::rewrap_master_check(&old.master, &new.master, value);
        }
        let aad = wrapped_aad(wrapped);
        let key = old.unwrap_key(value, &aad, "master rotation")?;
        Ok(new.wrap(&key, &aad))
    };
    let count = match domain
        .store
        .secrets()
        .rotate_master(&rewrap, &clock::now_rfc3339())
        .await
    {
        Ok(count) => count,
        Err(e) => {
            // Put the CA keys and webhook secrets back under the old master, which stays
            // in force.
            undo_ca().await;
            if let Err(undo) =
                crate::webhooks::reseal_secrets(domain.store.as_ref(), &new_bytes, &old_bytes).await
            {
                tracing::error!(error = %undo, "webhook secrets could not be re-sealed under the old master key");
            }
            return Err(e);
        }
    };
    *guard = Some(new);
    *domain
        .secrets
        .current_master
        .write()
        .expect("master lock poisoned") = Some(new_bytes);
    let count = count + ca_rows + webhook_rows;
    domain
        .secrets
        .transit_cache
        .lock()
        .expect("cache lock poisoned")
        .clear();
    tracing::info!(
        rewrapped = count,
        "master key rotated; set master_key in server.yaml to the new key"
    );
    Ok(count)
}

/// Drops cached transit keys (all when `name` is None): another cluster member changed them.
pub fn forget_transit_keys(domain: &Domain, name: Option<&str>) {
    let mut cache = domain
        .secrets
        .transit_cache
        .lock()
        .expect("cache lock poisoned");
    match name {
        Some(name) => {
            cache.remove(name);
        }
        None => cache.clear(),
    }
}

/// Records `result` of a secrets operation as one audit row and returns it.
async fn audited<T>(
    domain: &Domain,
    principal: &Principal,
    action: Action,
    result: Result<T>,
) -> Result<T> {
    domain.auditor.record(principal, action, &result).await;
    result
}

fn store(domain: &Domain) -> &dyn SecretStore {
    domain.store.secrets()
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A domain on a temp SQLite file, unlocked with a random master key.
    pub async fn domain() -> (Domain, tempfile::TempDir, [u8; 32]) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn crate::store::Store> =
            Arc::new(crate::store::SqliteStore::open(&dir.path().join("svc.db")).unwrap());
        let domain = Domain::in_dir(store, dir.path()).unwrap();
        let key = crypto::random_key();
        start(&domain, &key, &SecretsConfig::default())
            .await
            .unwrap();
        (domain, dir, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::collections::BTreeMap;

    #[tokio::test]
    async fn wrong_master_key_is_refused_and_rotation_moves_everything() {
        let (domain, dir, key) = testing::domain().await;
        let admin = Principal::server();
        let data = BTreeMap::from([("password".to_string(), "s3cret".to_string())]);
        kv::put(&domain, &admin, "db/prod", data.clone())
            .await
            .unwrap();
        transit::create_key(&domain, &admin, "orders", "aes256-gcm")
            .await
            .unwrap();
        let sealed = transit::encrypt(&domain, &admin, "orders", b"card")
            .await
            .unwrap();

        let wrong = Domain::in_dir(domain.store.clone(), dir.path()).unwrap();
        let error = start(&wrong, &crypto::random_key(), &SecretsConfig::default())
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("master_key does not match"),
            "{error}"
        );
        assert!(start(&wrong, &key, &SecretsConfig::default()).await.is_ok());

        let new_key = crypto::random_key();
        let new_text = base64::engine::general_purpose::STANDARD.encode(new_key);
        let count = rotate_master(&domain, &admin, &new_text).await.unwrap();
        assert_eq!(count, 3, "check value, one data key, one transit version");
        assert_eq!(
            kv::get(&domain, &admin, "db/prod", None)
                .await
                .unwrap()
                .data,
            data
        );
        let plain = transit::decrypt(&domain, &admin, "orders", &sealed.ciphertext)
            .await
            .unwrap();
        assert_eq!(plain, b"card");

        let restarted = Domain::in_dir(domain.store.clone(), dir.path()).unwrap();
        assert!(start(&restarted, &key, &SecretsConfig::default())
            .await
            .is_err());
        start(&restarted, &new_key, &SecretsConfig::default())
            .await
            .unwrap();
        assert_eq!(
            kv::get(&restarted, &admin, "db/prod", None)
                .await
                .unwrap()
                .data,
            data
        );
    }
}
