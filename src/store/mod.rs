//! The state store: the `Store` trait every domain module talks to, and its drivers.
//!
//! SQLite (default) lives in `sqlite.rs`; PostgreSQL follows behind the same trait. The SQL is
//! kept portable (TEXT timestamps in RFC 3339, no driver-specific types), and the migrations in
//! `migrations/` are embedded in the binary and applied in order at start.

mod sqlite;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{StoreConfig, StoreDriver};
use crate::Result;

pub use sqlite::SqliteStore;

/// Every migration, in order. A migration is never edited once released: add a new one.
pub const MIGRATIONS: &[(i64, &str, &str)] =
    &[(1, "api_keys", include_str!("migrations/0001_api_keys.sql"))];

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
