//! Cluster mode (docs/cluster.md): several svc-servers share PostgreSQL (state, membership,
//! the leader's lease) and a NATS cluster with JetStream (the bus and the durable streams).
//! There is no consensus of our own: PostgreSQL decides who leads, JetStream replicates.
//!
//! - Membership: each member writes a heartbeat into `cluster_members` every
//!   `heartbeat_interval`; one older than `member_timeout` is down. A member whose heartbeat
//!   finds its row gone (`svc-cluster remove`) or taken by a newer process of the same id
//!   stops serving.
//! - Leadership: a lease row with a fencing token (`store::postgres::cluster`). The leader
//!   renews it every `heartbeat_interval` and counts its lease from *before* each renewal, less
//!   a margin, so it steps down on its own clock before the database could hand the lease to
//!   another member: at most one leader at a time, even when its connection is cut.
//!   Leader-only work asks [`Cluster::is_leader`] (lease reaping, token cleanup).
//! - Agent ownership: every member receives every heartbeat (so each can answer for every
//!   agent), and one member — the owner — acts on an agent's heartbeats: it writes its times,
//!   and emits its connected / disconnected / rejected events. The owner is chosen by
//!   rendezvous hashing over the live members, so a member joining or dying moves only its
//!   share of agents, with no coordination: every member computes the same answer from the
//!   same member list.
//! - Changes made on one member to what others keep in memory (agents, transit keys) are
//!   announced by PostgreSQL triggers on the `svc_changes` channel (LISTEN/NOTIFY).
//!
//! Outside cluster mode the same type describes the one server: it is the only member,
//! always the leader, and owns every agent.

pub mod ops;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::config::ServerConfig;
use crate::store::postgres::cluster::{ClusterDb, Lease, MemberRow, Renewal};
use crate::store::postgres::Target;
use crate::{Error, Result};

/// What this member knows of the cluster, refreshed every heartbeat interval.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every member row, down ones included.
    pub members: Vec<MemberRow>,
    /// The ids of live members, sorted: the ones agents are spread over.
    pub live: Vec<String>,
    pub lease: Lease,
    /// Whether the last round trip to PostgreSQL worked.
    pub database_ok: bool,
}

impl View {
    /// The member holding an unexpired lease.
    pub fn leader(&self) -> Option<&str> {
        self.lease
            .holder
            .as_deref()
            .filter(|_| self.lease.remaining_ms > 0)
    }
}

struct Backend {
    target: Target,
    incarnation: String,
    db: tokio::sync::Mutex<Option<Arc<ClusterDb>>>,
    bus: async_nats::Client,
}

/// Timing settings, checked by [`config_problems`].
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub heartbeat_interval: Duration,
    pub member_timeout: Duration,
    pub lease_ttl: Duration,
}

pub struct Cluster {
    id: String,
    advertise: String,
    timing: Timing,
    backend: Option<Backend>,
    view: watch::Sender<View>,
    /// Until when this member may act as the leader (None: it is not the leader), and under
    /// which fencing token.
    leadership: Mutex<Option<(Instant, i64)>>,
    evicted: watch::Sender<bool>,
    /// Wakes the membership loop before its next tick (a NOTIFY, a transfer).
    wake: Notify,
}

/// Problems with the `cluster` settings, each named (part of config validation).
pub fn config_problems(config: &ServerConfig) -> Vec<String> {
    let cluster = &config.cluster;
    let mut problems = Vec::new();
    if !cluster.enabled {
        return problems;
    }
    if config.store.driver != crate::config::StoreDriver::Postgres {
        problems.push(
            "cluster.enabled needs store.driver: postgres (the members share its state and \
             its leader lease)"
                .into(),
        );
    }
    if config.bus.external_urls.is_empty() {
        problems.push(
            "cluster.enabled needs bus.external_urls: the members share a NATS cluster with \
             JetStream (the embedded broker is per server)"
                .into(),
        );
    }
    if !cluster.member_id.is_empty() && !valid_member_id(&cluster.member_id) {
        problems.push(format!(
            "cluster.member_id '{}' must be 1-64 letters, digits, '.', '_' or '-'",
            cluster.member_id
        ));
    }
    if cluster.advertise.is_empty() {
        let grpc = &config.listen.grpc;
        let wildcard = grpc
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified());
        if wildcard {
            problems.push(format!(
                "cluster.advertise is required when listen.grpc ({grpc}) is a wildcard address: \
                 the host:port other members and operators reach this member on"
            ));
        }
    }
    let timing = timing_of(config);
    if timing.heartbeat_interval.is_zero() {
        problems.push("cluster.heartbeat_interval must be longer than 0s (default 1s)".into());
    }
    if timing.member_timeout < timing.heartbeat_interval * 2 {
        problems.push(
            "cluster.member_timeout must be at least twice cluster.heartbeat_interval".into(),
        );
    }
    if timing.lease_ttl < timing.heartbeat_interval * 3 {
        problems.push(
            "cluster.lease_ttl must be at least three times cluster.heartbeat_interval (the \
             leader renews every interval and steps down one interval early)"
                .into(),
        );
    }
    problems
}

fn valid_member_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.chars().all(member_id_char)
}

fn member_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn timing_of(config: &ServerConfig) -> Timing {
    Timing {
        heartbeat_interval: config.cluster.heartbeat_interval.0,
        member_timeout: config.cluster.member_timeout.0,
        lease_ttl: config.cluster.lease_ttl.0,
    }
}

/// This member's id: `cluster.member_id`, else the host name.
fn member_id(config: &ServerConfig) -> String {
    if !config.cluster.member_id.is_empty() {
        return config.cluster.member_id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let cleaned: String = host
        .chars()
        .map(|c| if member_id_char(c) { c } else { '-' })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "svc".into()
    } else {
        cleaned
    }
}

/// Rendezvous (highest random weight) hashing: the member with the highest weight for this
/// agent owns it. FNV-1a, not the std hasher: every member, whatever its build, must agree.
fn weight(member: &str, agent: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain([0]).chain(agent.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV's low bits mix poorly for short keys: finish with a 64-bit avalanche (splitmix).
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The owner of `agent` among `members` (None when there are none).
pub fn owner_of<'a>(members: &'a [String], agent: &str) -> Option<&'a str> {
    members
        .iter()
        .max_by_key(|member| (weight(member, agent), member.as_str()))
        .map(String::as_str)
}

impl Cluster {
    /// The one server outside cluster mode.
    pub fn single(id: &str, advertise: &str) -> Arc<Cluster> {
        let view = View {
            live: vec![id.to_string()],
            lease: Lease {
                holder: Some(id.to_string()),
                remaining_ms: i64::MAX,
                ..Lease::default()
            },
            database_ok: true,
            ..View::default()
        };
        Arc::new(Cluster {
            id: id.to_string(),
            advertise: advertise.to_string(),
            timing: Timing {
                heartbeat_interval: Duration::from_secs(1),
                member_timeout: Duration::from_secs(5),
                lease_ttl: Duration::from_secs(5),
            },
            backend: None,
            view: watch::channel(view).0,
            leadership: Mutex::new(None),
            evicted: watch::channel(false).0,
            wake: Notify::new(),
        })
    }

    /// Joins the cluster of `config` (cluster mode): registers this member and reads the
    /// member list once, so ownership is known before the first heartbeat arrives. The loop
    /// that keeps it current starts with [`spawn`].
    /// `grpc` is the bound gRPC address, advertised when `cluster.advertise` is empty.
    pub async fn join(
        config: &ServerConfig,
        bus: async_nats::Client,
        grpc: std::net::SocketAddr,
    ) -> Result<Arc<Cluster>> {
        let id = member_id(config);
        let advertise = if config.cluster.advertise.is_empty() {
            grpc.to_string()
        } else {
            config.cluster.advertise.clone()
        };
        let target = Target::from_config(&config.store)?;
        let incarnation = crate::ids::ulid();
        let db = ClusterDb::connect(&target).await?;
        db.register(&id, &advertise, env!("CARGO_PKG_VERSION"), &incarnation)
            .await?;
        let cluster = Arc::new(Cluster {
            id,
            advertise,
            timing: timing_of(config),
            backend: Some(Backend {
                target,
                incarnation,
                db: tokio::sync::Mutex::new(Some(Arc::new(db))),
                bus,
            }),
            view: watch::channel(View::default()).0,
            leadership: Mutex::new(None),
            evicted: watch::channel(false).0,
            wake: Notify::new(),
        });
        cluster.tick().await;
        tracing::info!(member = %cluster.id, advertise = %cluster.advertise, members = ?cluster.view().live, "joined the cluster");
        Ok(cluster)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    pub fn is_clustered(&self) -> bool {
        self.backend.is_some()
    }

    pub fn view(&self) -> View {
        self.view.borrow().clone()
    }

    /// Whether this member may do leader-only work now.
    pub fn is_leader(&self) -> bool {
        if self.backend.is_none() {
            return true;
        }
        self.leadership_now().is_some()
    }

    fn leadership_now(&self) -> Option<i64> {
        let guard = self
            .leadership
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        guard
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, token)| token)
    }

    fn set_leadership(&self, value: Option<(Instant, i64)>) {
        *self
            .leadership
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = value;
    }

    /// Whether this member acts on `agent`'s heartbeats.
    pub fn owns(&self, agent: &str) -> bool {
        if self.backend.is_none() {
            return true;
        }
        let view = self.view.borrow();
        match owner_of(&view.live, agent) {
            Some(owner) => owner == self.id,
            // Not even this member is known live (the database has not answered yet): act,
            // rather than leave the agent to no one.
            None => true,
        }
    }

    /// Flips to true when this member was removed (or replaced): the server then stops.
    pub fn evicted(&self) -> watch::Receiver<bool> {
        self.evicted.subscribe()
    }

    /// Resolves once this member has been evicted.
    pub async fn until_evicted(&self) {
        let mut evicted = self.evicted();
        let _ = evicted.wait_for(|e| *e).await.map(|_| ());
    }

    /// Runs the loop now instead of at the next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The dedicated connection, reconnected when it was lost.
    async fn db(&self) -> Result<Arc<ClusterDb>> {
        let backend = self.backend.as_ref().ok_or_else(not_clustered)?;
        let mut slot = backend.db.lock().await;
        if let Some(db) = slot.as_ref().filter(|db| !db.is_closed()) {
            return Ok(db.clone());
        }
        let db = Arc::new(ClusterDb::connect(&backend.target).await?);
        *slot = Some(db.clone());
        Ok(db)
    }

    /// One round: heartbeat, lease, member list. A leader's safety does not depend on the
    /// round finishing (its lease is counted from before the request, on its own clock); the
    /// bound only keeps a stuck connection from stopping the loop for good.
    async fn tick(&self) {
        let bound = self.timing.lease_ttl.max(Duration::from_secs(1));
        match tokio::time::timeout(bound, self.round()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => self.round_failed(&error.to_string()),
            Err(_) => self.round_failed("PostgreSQL did not answer within the lease time"),
        }
    }

    fn round_failed(&self, why: &str) {
        let was_ok = self.view.borrow().database_ok;
        self.view.send_modify(|view| view.database_ok = false);
        if was_ok {
            tracing::warn!(error = why, "cluster: PostgreSQL round failed; the leader steps down when its lease runs out locally");
        }
    }

    async fn round(&self) -> Result<()> {
        let backend = self.backend.as_ref().ok_or_else(not_clustered)?;
        let db = self.db().await?;
        if !db.heartbeat(&self.id, &backend.incarnation).await? {
            tracing::error!(member = %self.id, "this member was removed from the cluster (or another process took its id): stopping");
            if let Some(token) = self.leadership_now() {
                let _ = db.release(&self.id, token).await;
            }
            self.set_leadership(None);
            self.evicted.send_replace(true);
            return Ok(());
        }
        self.lead(&db).await?;
        let members = db.members().await?;
        let lease = db.lease().await?;
        let timeout_ms = i64::try_from(self.timing.member_timeout.as_millis()).unwrap_or(i64::MAX);
        let live: Vec<String> = members
            .iter()
            .filter(|m| m.heartbeat_age_ms < timeout_ms)
            .map(|m| m.id.clone())
            .collect();
        let before = self.view.borrow().live.clone();
        if before != live && !before.is_empty() {
            tracing::info!(was = ?before, now = ?live, "cluster: live members changed; agent ownership rebalanced");
        }
        self.view.send_replace(View {
            members,
            live,
            lease,
            database_ok: true,
        });
        Ok(())
    }

    /// Renews the lease this member holds, or tries to take a free one.
    async fn lead(&self, db: &ClusterDb) -> Result<()> {
        let ttl = self.timing.lease_ttl;
        // Counted from before the request: the database's expiry is at least this late.
        let started = Instant::now();
        let valid_until = started + ttl - self.timing.heartbeat_interval;
        let held = *self
            .leadership
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((until, token)) = held.filter(|(until, _)| started >= *until) {
            // Paused or cut off for longer than the lease: another member may lead now.
            self.set_leadership(None);
            tracing::warn!(member = %self.id, term = token, late = ?started - until, "the leader lease ran out before it could be renewed: stepped down");
        }
        match self.leadership_now() {
            Some(token) => match db.renew(&self.id, token, ttl).await? {
                Renewal::Renewed => self.set_leadership(Some((valid_until, token))),
                Renewal::Lost => {
                    self.set_leadership(None);
                    tracing::warn!(member = %self.id, term = token, "lost the leader lease: stepped down");
                }
                Renewal::Yielded => {
                    self.set_leadership(None);
                    tracing::info!(member = %self.id, term = token, "leadership handed over (transfer-leader)");
                    self.notify("cluster:refresh").await;
                }
            },
            None => {
                if let Some(token) = db.acquire(&self.id, ttl).await? {
                    self.set_leadership(Some((valid_until, token)));
                    tracing::info!(member = %self.id, term = token, "became the leader");
                }
            }
        }
        Ok(())
    }

    /// Announces `payload` on `svc_changes` to every member (best effort).
    pub async fn notify(&self, payload: &str) {
        let Ok(db) = self.db().await else { return };
        if let Err(error) = db.notify(payload).await {
            tracing::debug!(%error, "cluster notify failed");
        }
    }

    /// Leaves the cluster at a clean stop: gives up the lease (so the next leader need not
    /// wait it out) and deletes this member's row.
    pub async fn leave(&self) {
        let Some(backend) = &self.backend else { return };
        let Ok(db) = self.db().await else { return };
        if let Some(token) = self.leadership_now() {
            self.set_leadership(None);
            if let Err(error) = db.release(&self.id, token).await {
                tracing::warn!(%error, "could not release the leader lease");
            }
        }
        if !*self.evicted.borrow() {
            let _ = db.leave(&self.id, &backend.incarnation).await;
        }
        self.notify("cluster:refresh").await;
    }

    /// Whether the NATS cluster answers JetStream requests (its meta leader is elected).
    pub async fn nats_ok(&self) -> bool {
        let Some(backend) = &self.backend else {
            return true;
        };
        let request = backend.bus.request("$JS.API.INFO", "".into());
        match tokio::time::timeout(Duration::from_secs(2), request).await {
            Ok(Ok(reply)) => serde_json::from_slice::<serde_json::Value>(&reply.payload)
                .is_ok_and(|v| v.get("error").is_none()),
            _ => false,
        }
    }

    async fn database_ok(&self) -> bool {
        if self.backend.is_none() {
            return true;
        }
        let Ok(db) = self.db().await else {
            return false;
        };
        tokio::time::timeout(Duration::from_secs(2), db.ping())
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

fn not_clustered() -> Error {
    Error::FailedPrecondition(
        "cluster mode is off (cluster.enabled: false): this server is the only member".into(),
    )
}

/// Starts the membership loop and the change listener of a clustered member; they run until
/// the runtime stops (or the member is evicted).
pub fn spawn(domain: Arc<crate::domain::Domain>) {
    let cluster = domain.cluster.clone();
    if !cluster.is_clustered() {
        return;
    }
    let looping = cluster.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(looping.timing.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = looping.wake.notified() => {}
                _ = looping.until_evicted() => return,
            }
            looping.tick().await;
        }
    });
    tokio::spawn(listen(domain));
}

/// LISTEN svc_changes: reads again what another member changed. Reconnects when the
/// connection drops; after a reconnect everything cached is read again, since announcements
/// made meanwhile were missed.
async fn listen(domain: Arc<crate::domain::Domain>) {
    let cluster = domain.cluster.clone();
    let Some(backend) = &cluster.backend else {
        return;
    };
    let evicted = cluster.evicted();
    let mut first = true;
    loop {
        if *evicted.borrow() {
            return;
        }
        let connected = backend.target.connect_listening().await;
        let (client, mut notes) = match connected {
            Ok(pair) => pair,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot LISTEN for changes; retrying");
                tokio::time::sleep(cluster.timing.heartbeat_interval).await;
                continue;
            }
        };
        if let Err(error) = client.batch_execute("LISTEN svc_changes").await {
            tracing::warn!(%error, "cluster: LISTEN failed; retrying");
            tokio::time::sleep(cluster.timing.heartbeat_interval).await;
            continue;
        }
        if !first {
            ops::reload_cached(&domain).await;
        }
        first = false;
        loop {
            tokio::select! {
                note = notes.recv() => match note {
                    Some(note) => ops::changed(&domain, note.payload()).await,
                    None => break,
                },
                _ = cluster.until_evicted() => return,
            }
        }
        tracing::warn!("cluster: change listener lost its connection; reconnecting");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_spreads_agents_and_moves_only_a_dead_members_share() {
        let three: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let agents: Vec<String> = (0..3000).map(|i| format!("agent-{i:04}")).collect();
        let mut counts = std::collections::BTreeMap::new();
        for agent in &agents {
            *counts.entry(owner_of(&three, agent).unwrap()).or_insert(0) += 1;
        }
        for (member, count) in &counts {
            assert!((850..1150).contains(count), "{member}: {count} of 3000");
        }
        let two: Vec<String> = ["a", "c"].iter().map(|s| s.to_string()).collect();
        for agent in &agents {
            let before = owner_of(&three, agent).unwrap();
            let after = owner_of(&two, agent).unwrap();
            if before != "b" {
                assert_eq!(before, after, "{agent} moved although its owner lives");
            }
        }
        assert_eq!(owner_of(&[], "x"), None);
    }

    #[test]
    fn member_ids_are_checked() {
        assert!(valid_member_id("svc-1.example_a"));
        assert!(!valid_member_id(""));
        assert!(!valid_member_id("a b"));
        assert!(!valid_member_id(&"x".repeat(65)));
    }
}
