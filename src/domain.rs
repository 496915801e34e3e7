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
        }
    }
}
