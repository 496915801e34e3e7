//! The secrets tables (migration 0003): rows and the `SecretStore` trait over them.
//!
//! Every column that could reveal a secret holds ciphertext only: wrapped data keys, encrypted
//! versions, wrapped transit key material. The store never sees a master key or a cleartext
//! value; `secrets::` does all the crypto and hands this layer base64 text.

use async_trait::async_trait;

use crate::Result;

/// A KV secret's metadata and its wrapped data key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRow {
    pub path: String,
    /// The data key, AES-256-GCM-wrapped by the master key (base64 nonce||ciphertext||tag).
    pub wrapped_key: String,
    pub current_version: i64,
    pub created_at: String,
    pub updated_at: String,
}

/// One version of a secret's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretVersionRow {
    pub path: String,
    pub version: i64,
    /// base64 nonce||ciphertext||tag under the data key; empty once destroyed.
    pub ciphertext: String,
    pub created_at: String,
    pub deleted_at: Option<String>,
    pub is_destroyed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitKeyRow {
    pub name: String,
    pub key_type: String,
    pub latest_version: i64,
    pub min_decryption_version: i64,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitVersionRow {
    pub name: String,
    pub version: i64,
    /// The key material wrapped by the master key (base64).
    pub material: String,
    /// Ed25519 public key (base64); empty for symmetric keys.
    pub public_key: String,
    pub created_at: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: String,
    pub path: String,
    pub backend: String,
    /// What revocation needs (JSON, no password).
    pub backend_data: String,
    pub created_at: String,
    pub expires_at: String,
    pub max_expires_at: String,
    pub is_renewable: bool,
    pub revoked_at: Option<String>,
    pub last_error: Option<String>,
}

/// Which wrapped value `rotate_master` hands to its re-wrap function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrapped<'a> {
    MasterCheck,
    SecretKey {
        path: &'a str,
    },
    TransitKey {
        name: &'a str,
        version: i64,
    },
    /// A data key of `data_keys` (what seals stored plans and signing keys at rest).
    DataKey {
        name: &'a str,
    },
}

/// Re-wraps one value from the old master key to the new one.
pub type Rewrap<'a> = dyn Fn(Wrapped<'_>, &str) -> Result<String> + Send + Sync + 'a;

#[async_trait]
pub trait SecretStore: Send + Sync {
    /// The key-check value, if one was stored.
    async fn master_check(&self) -> Result<Option<String>>;
    /// Stores the key-check value on first start; returns the stored one if another start won.
    async fn init_master_check(&self, check_value: &str, at: &str) -> Result<String>;
    /// Re-wraps every wrapped value (check, secrets' data keys, transit material, `data_keys`)
    /// in one transaction:
    /// either all move to the new master key or none does. Returns how many were re-wrapped.
    async fn rotate_master(&self, rewrap: &Rewrap<'_>, at: &str) -> Result<u64>;
    /// The wrapped data key `name` (`data_keys`), if one was stored.
    async fn data_key(&self, name: &str) -> Result<Option<String>>;
    /// Stores data key `name` unless one is (servers sharing a database may start together);
    /// returns the stored one.
    async fn init_data_key(&self, name: &str, wrapped: &str, at: &str) -> Result<String>;

    async fn get_secret(&self, path: &str) -> Result<Option<SecretRow>>;
    async fn get_secret_version(
        &self,
        path: &str,
        version: i64,
    ) -> Result<Option<SecretVersionRow>>;
    async fn secret_versions(&self, path: &str) -> Result<Vec<SecretVersionRow>>;
    /// Secrets whose path starts with `prefix`, ordered by path, each with the time its
    /// current version was deleted (soft or destroyed; None while it is readable).
    async fn list_secrets(&self, prefix: &str) -> Result<Vec<(SecretRow, Option<String>)>>;
    /// Adds `version` (which must be `secret.current_version`) to the secret, creating the
    /// secret when `version.version` is 1. `Conflict` if another writer got there first.
    async fn write_secret_version(
        &self,
        secret: &SecretRow,
        version: &SecretVersionRow,
    ) -> Result<()>;
    /// Marks versions deleted (soft); returns how many changed.
    async fn delete_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64>;
    /// Erases the ciphertext of versions for good; returns how many changed.
    async fn destroy_secret_versions(&self, path: &str, versions: &[i64], at: &str) -> Result<u64>;
    /// Removes a secret and all its versions; whether it existed.
    async fn destroy_secret(&self, path: &str) -> Result<bool>;

    /// `Conflict` if the name exists.
    async fn insert_transit_key(
        &self,
        key: &TransitKeyRow,
        first: &TransitVersionRow,
    ) -> Result<()>;
    async fn get_transit_key(&self, name: &str) -> Result<Option<TransitKeyRow>>;
    async fn transit_key_versions(&self, name: &str) -> Result<Vec<TransitVersionRow>>;
    async fn list_transit_keys(&self) -> Result<Vec<TransitKeyRow>>;
    /// Adds the next version (must be latest + 1, else `Conflict`) and makes it the latest.
    async fn add_transit_version(&self, version: &TransitVersionRow, at: &str) -> Result<()>;
    async fn set_transit_min_decryption(&self, name: &str, version: i64, at: &str) -> Result<bool>;

    async fn insert_lease(&self, lease: &LeaseRow) -> Result<()>;
    async fn get_lease(&self, id: &str) -> Result<Option<LeaseRow>>;
    /// Unrevoked leases whose id starts with `prefix`, ordered by id.
    async fn list_leases(&self, prefix: &str) -> Result<Vec<LeaseRow>>;
    async fn set_lease_expiry(&self, id: &str, expires_at: &str) -> Result<bool>;
    /// Records a revocation (or, with `error`, a failed attempt that the reaper retries).
    async fn mark_lease_revoked(&self, id: &str, at: &str) -> Result<bool>;
    async fn set_lease_error(&self, id: &str, error: &str) -> Result<()>;
    /// Unrevoked leases with `expires_at <= now`, oldest first, at most `limit`.
    async fn expired_leases(&self, now: &str, limit: usize) -> Result<Vec<LeaseRow>>;
}
