//! The state store: the `Store` trait every domain module talks to, and its drivers.
//!
//! SQLite (default) lives in `sqlite.rs`; PostgreSQL follows behind the same trait. The SQL is
//! kept portable (TEXT timestamps in RFC 3339, no driver-specific types), and the migrations in
//! `migrations/` are embedded in the binary and applied in order at start.

mod secrets;
mod sqlite;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{StoreConfig, StoreDriver};
use crate::Result;

pub use secrets::{
    LeaseRow, Rewrap, SecretRow, SecretStore, SecretVersionRow, TransitKeyRow, TransitVersionRow,
    Wrapped,
};
pub use sqlite::SqliteStore;

/// Every migration, in order. A migration is never edited once released: add a new one.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "api_keys", include_str!("migrations/0001_api_keys.sql")),
    (2, "audit", include_str!("migrations/0002_audit.sql")),
    (3, "secrets", include_str!("migrations/0003_secrets.sql")),
];

/// A stored API key (never the key itself: only its hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub id: String,
    pub name: String,
    pub role: String,
    pub key_hash: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub expires_at: Option<String>,
}

/// A change to an API key; `None` leaves the field as it is.
#[derive(Clone, Debug, Default)]
pub struct ApiKeyChange {
    pub name: Option<String>,
    pub role: Option<String>,
}

/// One audit row as stored. `seq` orders the hash chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditRow {
    pub seq: i64,
    pub id: String,
    pub timestamp: String,
    pub user: String,
    pub action: String,
    pub resource_type: String,
    pub resource_id: String,
    pub outcome: String,
    pub policy_id: Option<String>,
    pub decision: Option<String>,
    pub severity: String,
    /// Redacted JSON object, as text.
    pub detail: String,
    pub prev_hash: String,
    pub hash: String,
}

/// Filters of an audit query; every field narrows the result.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub since: Option<String>,
    pub until: Option<String>,
    pub user: Option<String>,
    /// A glob on the dotted action (`secret.*`); `*` matches any run of characters.
    pub action: Option<String>,
    pub resource_type: Option<String>,
    pub policy_id: Option<String>,
    pub outcome: Option<String>,
    /// `allow` or `deny`: the policy decision recorded on the row.
    pub decision: Option<String>,
    /// Only these severities (the domain expands `--min-severity`).
    pub severities: Vec<String>,
    /// Newest first, strictly before this seq (paging).
    pub before_seq: Option<i64>,
}

/// Seals a row about to be appended: given the row with `prev_hash` set, returns its hash.
pub type AuditSeal = dyn Fn(&AuditRow) -> String + Send + Sync;

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// "sqlite" or "postgres", for health and logs.
    fn driver(&self) -> &'static str;
    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<()>;
    /// The highest applied migration.
    async fn schema_version(&self) -> Result<i64>;

    async fn insert_api_key(&self, row: &ApiKeyRow) -> Result<()>;
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>>;
    async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>>;
    async fn find_api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRow>>;
    async fn update_api_key(&self, id: &str, change: &ApiKeyChange) -> Result<Option<ApiKeyRow>>;
    /// Whether a row was deleted.
    async fn delete_api_key(&self, id: &str) -> Result<bool>;
    async fn touch_api_key(&self, id: &str, used_at: &str) -> Result<()>;

    /// Appends an audit row at the end of the chain: sets `seq` and `prev_hash` (the last
    /// row's hash, or `genesis`), then `hash` from `seal`, all in one write transaction.
    async fn append_audit(
        &self,
        row: AuditRow,
        genesis: &str,
        seal: &AuditSeal,
    ) -> Result<AuditRow>;
    /// Rows matching `filter`, newest first, at most `limit`.
    async fn query_audit(&self, filter: &AuditFilter, limit: usize) -> Result<Vec<AuditRow>>;
    /// Rows in chain order with `seq > after_seq`, at most `limit` (verify and export).
    async fn audit_chain(&self, after_seq: i64, limit: usize) -> Result<Vec<AuditRow>>;

    /// The secrets tables (KV, transit, leases, master-key check).
    fn secrets(&self) -> &dyn SecretStore;
}

/// Opens the configured store and applies pending migrations.
pub fn open(config: &StoreConfig, data_dir: &Path) -> Result<Arc<dyn Store>> {
    match config.driver {
        StoreDriver::Sqlite => Ok(Arc::new(SqliteStore::open(&data_dir.join("svc.db"))?)),
        StoreDriver::Postgres => Err(crate::Error::Unimplemented(
            "store driver 'postgres'".into(),
        )),
    }
}
