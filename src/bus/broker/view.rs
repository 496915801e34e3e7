//! A read-only view of a running broker for the monitoring endpoints (`bus::monitor`).
//!
//! Owns nothing: every call takes a snapshot of the shared state (the client registry, each
//! connection's counters, the subject index) and returns plain values. Locks are held only
//! while copying, never across an await, and nothing here is on the publish path.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{BrokerConfig, BrokerStats, Shared};

/// Cloneable handle on a broker's state; see [`super::BrokerHandle::view`].
#[derive(Clone)]
pub struct BrokerView {
    pub(super) shared: Arc<Shared>,
}

/// One client connection (nats-server's `/connz` entry).
#[derive(Clone, Debug)]
pub struct ConnectionView {
    pub cid: u64,
    pub ip: String,
    pub port: u16,
    pub start: SystemTime,
    pub last_activity: SystemTime,
    /// Zero until the first PING→PONG round trip.
    pub rtt: Duration,
    pub pending_bytes: usize,
    pub in_msgs: u64,
    pub out_msgs: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// This connection's subscriptions, in no particular order.
    pub subscriptions: Vec<SubscriptionView>,
    pub name: String,
    pub lang: String,
    pub version: String,
    /// The authenticated user: an API key's id, `agent:<id>`, `server`, `anonymous`.
    pub authorized_user: String,
}

/// One subscription (nats-server's `/subsz` detail).
#[derive(Clone, Debug)]
pub struct SubscriptionView {
    pub cid: u64,
    pub subject: String,
    pub queue: Option<String>,
    pub sid: String,
    /// Messages delivered to it.
    pub msgs: u64,
}

impl BrokerView {
    pub fn server_id(&self) -> &str {
        &self.shared.server_id
    }

    pub fn host(&self) -> &str {
        &self.shared.host
    }

    pub fn port(&self) -> u16 {
        self.shared.port
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.shared.config
    }

    pub fn stats(&self) -> &BrokerStats {
        &self.shared.stats
    }

    pub fn auth_required(&self) -> bool {
        self.shared.auth.auth_required()
    }

    pub fn started(&self) -> SystemTime {
        self.shared.started
    }

    /// False once lame duck or shutdown has closed the listener.
    pub fn is_accepting(&self) -> bool {
        self.shared.accepting.load(Ordering::Relaxed)
    }

    pub fn is_lame_duck(&self) -> bool {
        self.shared.lame_duck.load(Ordering::Relaxed)
    }

    /// Every subscription in the subject index.
    pub fn subscriptions(&self) -> Vec<SubscriptionView> {
        self.shared
            .router
            .snapshot()
            .iter()
            .map(|subscription| SubscriptionView {
                cid: subscription.client_id,
                subject: subscription.subject.clone(),
                queue: subscription.queue.clone(),
                sid: String::from_utf8_lossy(&subscription.sid).into_owned(),
                msgs: subscription.delivered(),
            })
            .collect()
    }

    /// The subject index's counters and match cache.
    pub fn index_stats(&self) -> super::router::IndexStats {
        self.shared.router.stats()
    }

    /// Every client connection, by client id: not the embedding process's own
    /// (`Permissions::internal`), which nats-server's `/connz` would not list either.
    pub fn connections(&self) -> Vec<ConnectionView> {
        let clients: Vec<_> = self
            .shared
            .clients()
            .iter()
            .filter(|(_, client)| !client.meta.connect_meta().internal)
            .map(|(id, client)| (*id, client.outbound.clone(), client.meta.clone()))
            .collect();
        let mut by_client: HashMap<u64, Vec<SubscriptionView>> = HashMap::new();
        for subscription in self.subscriptions() {
            by_client
                .entry(subscription.cid)
                .or_default()
                .push(subscription);
        }
        let started = self.shared.started;
        let mut connections: Vec<ConnectionView> = clients
            .into_iter()
            .map(|(cid, outbound, meta)| {
                let counters = outbound.counters();
                let connect = meta.connect_meta().clone();
                let last_read = Duration::from_nanos(meta.last_activity.load(Ordering::Relaxed));
                let last_activity = if last_read.is_zero() {
                    meta.start
                } else {
                    started + last_read
                };
                ConnectionView {
                    cid,
                    ip: meta.peer.ip().to_string(),
                    port: meta.peer.port(),
                    start: meta.start,
                    last_activity,
                    rtt: Duration::from_nanos(meta.rtt_nanos.load(Ordering::Relaxed)),
                    pending_bytes: counters.pending_bytes,
                    in_msgs: meta.messages_in.load(Ordering::Relaxed),
                    out_msgs: counters.messages,
                    in_bytes: meta.bytes_in.load(Ordering::Relaxed),
                    out_bytes: counters.payload_bytes,
                    subscriptions: by_client.remove(&cid).unwrap_or_default(),
                    name: connect.name,
                    lang: connect.lang,
                    version: connect.version,
                    authorized_user: connect.user,
                }
            })
            .collect();
        crate::sort::sort_by_key(&mut connections, |connection| connection.cid);
        connections
    }
}
