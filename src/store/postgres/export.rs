//! The logical export of a PostgreSQL store into a SQLite file, for snapshots.

use std::path::Path;

use super::PostgresStore;
use crate::{Error, Result};

impl PostgresStore {
    /// See `Store::export_sqlite`.
    pub(super) async fn export_into_sqlite(&self, _path: &Path) -> Result<()> {
        Err(Error::Unavailable(
            "snapshots of a PostgreSQL store are not built yet".into(),
        ))
    }
}
