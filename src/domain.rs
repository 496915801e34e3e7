//! The domain's shared state: what every domain function receives first.
//!
//! Transports (REST, gRPC, bus) hold a `Domain` through the server `Context`; domain modules
//! take `&Domain` and a `&Principal` and never know which transport called them.

use std::sync::Arc;

use crate::audit::Auditor;
use crate::store::Store;

pub struct Domain {
    pub store: Arc<dyn Store>,
    /// The one writer of audit rows.
    pub auditor: Auditor,
    /// The secrets engine's master key, caches and backends (sealed until `secrets::start`).
    pub secrets: crate::secrets::Secrets,
}

impl Domain {
    pub fn new(store: Arc<dyn Store>, policy_dir: std::path::PathBuf) -> Self {
        let auditor = Auditor::new(store.clone(), policy_dir);
        Domain {
            store,
            auditor,
            secrets: Default::default(),
        }
    }
}
