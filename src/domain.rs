//! The domain's shared state: what every domain function receives first.
//!
//! Transports (REST, gRPC, bus) hold a `Domain` through the server `Context`; domain modules
//! take `&Domain` and a `&Principal` and never know which transport called them.

use std::sync::Arc;

use crate::audit::Auditor;
use crate::events::Events;
use crate::store::Store;
use crate::stream::StreamLog;

pub struct Domain {
    pub store: Arc<dyn Store>,
    /// The one writer of audit rows.
    pub auditor: Auditor,
    /// The one emitter of events.
    pub events: Arc<Events>,
    /// The secrets engine's master key, caches and backends (sealed until `secrets::start`).
    pub secrets: crate::secrets::Secrets,
    /// Agents' liveness, jobs waiting for answers, and the bus client commands go out on.
    pub fleet: crate::fleet::Fleet,
}

impl Domain {
    /// `audit_mirror` is the `audit` stream log the auditor copies every row to.
    pub fn new(
        store: Arc<dyn Store>,
        policy_dir: std::path::PathBuf,
        events: Arc<Events>,
        audit_mirror: Option<Arc<StreamLog>>,
    ) -> Self {
        let auditor = Auditor::new(store.clone(), policy_dir)
            .with_events(events.clone())
            .with_mirror(audit_mirror);
        Domain {
            store,
            auditor,
            events,
            secrets: Default::default(),
            fleet: Default::default(),
        }
    }

    /// A domain over `store` with its events log under `dir/jetstream/events` and policies
    /// from `dir/policies`, no audit mirror: for unit tests and offline tools.
    pub fn in_dir(store: Arc<dyn Store>, dir: &std::path::Path) -> crate::Result<Self> {
        let log = StreamLog::open(&dir.join("jetstream/events"), Default::default())?;
        // The sender is leaked on purpose: nothing here ever stops.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        std::mem::forget(stop);
        let events = Arc::new(Events::new(log, stopping));
        Ok(Domain::new(store, dir.join("policies"), events, None))
    }
}
