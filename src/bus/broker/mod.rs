//! The embedded broker: the accept loop, the connection cap, shared state, and shutdown.
//!
//! Owns the [`Broker`] entry point and what every connection shares (config, authenticator,
//! subject index, stats, the client registry used for lame duck). Each accepted socket gets
//! its own task (`connection.rs`); a semaphore caps how many run at once, and an mpsc sender
//! held by every task tells shutdown when the last one has finished (mini-redis' pattern).
//! Invariant: nothing here, nor in any connection, awaits while holding a lock.

mod auth;
mod connection;
mod local;
mod outbound;
mod protocol;
mod quota;
pub(crate) mod router;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use local::LocalPublisher;
pub use quota::UserLimits;
pub use router::IndexStats;
pub use view::{BrokerView, ConnectionView, SubscriptionView};

mod view;

pub use auth::{
    constant_time_eq, AllowDeny, AuthRequest, Authenticator, NoAuth, Permissions, StaticAuth,
    SubjectRule,
};

use connection::Info;
pub(crate) use connection::NATS_VERSION;
use outbound::{Close, Outbound, PendingBudget};
use router::Router;

/// Broker limits and identity. `Default` matches nats-server's defaults.
#[derive(Clone)]
pub struct BrokerConfig {
    /// Largest PUB/HPUB payload (headers included); announced in INFO.
    pub max_payload: usize,
    /// Longest control line, counted from the first argument (as nats-server counts).
    pub max_control_line: usize,
    /// How often an idle client is pinged.
    pub ping_interval: Duration,
    /// Unanswered pings tolerated; one more is `Stale Connection`.
    pub max_pings_out: u32,
    /// Time allowed for CONNECT when auth is required, and for a TLS handshake.
    pub auth_timeout: Duration,
    /// Bytes queued for one client before it is dropped as a slow consumer.
    pub max_pending_bytes: usize,
    /// Bytes queued for all clients together. An append that would exceed it first drops
    /// the clients with the most bytes queued as slow consumers (svc's own limit; nats-server
    /// has only the per-client one).
    pub max_pending_total: usize,
    /// Longest a single socket write may take before the client is a slow consumer.
    pub write_deadline: Duration,
    /// Connections served at once; the next gets `-ERR 'maximum connections exceeded'`.
    pub max_connections: usize,
    /// New connections between accept and a verified CONNECT (TLS handshake, INFO, the
    /// authenticator) at once. The rest wait, before INFO, up to `auth_timeout`, then are
    /// closed (the client retries with its backoff): a reconnect storm queues here instead of
    /// crowding the runtime every other listener shares. 0: no bound.
    pub max_concurrent_logins: usize,
    /// Announced in INFO as `server_name`.
    pub server_name: String,
    /// TLS for every client (INFO says `tls_required`); rustls with ring.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Announced as `tls_verify`, which in nats-server means every client *must* present a
    /// certificate (`verify: true`). Set it only when `tls` requires client certificates; not
    /// when it merely requests them (rustls `allow_unauthenticated`, as svc-server's bus does),
    /// since clients without a certificate are then still welcome.
    pub tls_verify: bool,
    /// Handshake before INFO (nats-server ≥ 2.10.4 `handshake_first`; async-nats
    /// `tls_first()`).
    pub tls_handshake_first: bool,
    /// Publishes on subjects matching this pattern reach subscribers with the publisher's
    /// user (`Permissions::user`: an API key id, `agent:<id>`, `server`) in the header
    /// [`SENDER_HEADER`], set by the broker; whatever the client put there is dropped. This is
    /// how a service behind the broker learns which credential a request came with (svc's
    /// file service, `svc.files.>`), as nats-server's `Nats-Request-Info` tells an exporting
    /// account who is asking. None: messages pass unchanged.
    pub sender_subjects: Option<String>,
    /// Limits per credential (`Permissions::quota`), over all its connections together: a
    /// publish rate and a pending-bytes budget. None (nats-server's default): none.
    pub user_limits: Option<UserLimits>,
}

/// The header [`BrokerConfig::sender_subjects`] stamps.
pub const SENDER_HEADER: &str = "Svc-Bus-User";

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_payload: 1024 * 1024,
            max_control_line: 4096,
            ping_interval: Duration::from_secs(120),
            max_pings_out: 2,
            auth_timeout: Duration::from_secs(2),
            max_pending_bytes: 64 * 1024 * 1024,
            max_pending_total: 64 * 1024 * 1024,
            write_deadline: Duration::from_secs(10),
            max_connections: 64 * 1024,
            max_concurrent_logins: 64,
            server_name: "svc".into(),
            tls: None,
            tls_verify: false,
            tls_handshake_first: false,
            sender_subjects: None,
            user_limits: None,
        }
    }
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BrokerConfig")
            .field("max_payload", &self.max_payload)
            .field("max_control_line", &self.max_control_line)
            .field("ping_interval", &self.ping_interval)
            .field("max_pings_out", &self.max_pings_out)
            .field("auth_timeout", &self.auth_timeout)
            .field("max_pending_bytes", &self.max_pending_bytes)
            .field("max_pending_total", &self.max_pending_total)
            .field("write_deadline", &self.write_deadline)
            .field("max_connections", &self.max_connections)
            .field("max_concurrent_logins", &self.max_concurrent_logins)
            .field("server_name", &self.server_name)
            .field("tls", &self.tls.is_some())
            .field("tls_verify", &self.tls_verify)
            .field("tls_handshake_first", &self.tls_handshake_first)
            .field("user_limits", &self.user_limits)
            .finish()
    }
}

/// Live counters, updated with relaxed atomics (read them for metrics, not for ordering).
/// Message counters are added once per read chunk, so they lag by at most one chunk.
///
/// They count client traffic only, as nats-server's `/varz` does: the embedding process's
/// own connection ([`Permissions::internal`]) is not among the connections, its publishes
/// (and in-process ones, [`LocalPublisher`]) are not messages in, and deliveries to it are
/// not messages out. What it sends to clients is delivered to them, so that counts out.
#[derive(Debug, Default)]
pub struct BrokerStats {
    /// Client connections open now (a gauge); a connection counts from its accept until
    /// CONNECT shows it internal.
    pub connections: AtomicU64,
    /// Client connections accepted since start.
    pub total_connections: AtomicU64,
    /// PUB/HPUB received from clients.
    pub messages_in: AtomicU64,
    /// MSG/HMSG queued to clients' subscriptions.
    pub messages_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Clients dropped for exceeding `max_pending_bytes`, `max_pending_total` or
    /// `write_deadline`.
    pub slow_consumers: AtomicU64,
    /// Connections holding a login permit now (`max_concurrent_logins`; a gauge).
    pub logins_in_progress: AtomicU64,
    /// Connections closed because no login permit came within `auth_timeout`.
    pub logins_timed_out: AtomicU64,
    /// Times a connection stopped reading to wait for its user's publish rate
    /// (`UserLimits::publish_rate`).
    pub publishes_throttled: AtomicU64,
    /// CONNECTs the authenticator accepted (agents, keys and the server's own clients).
    pub logins_accepted: AtomicU64,
    /// CONNECTs the authenticator refused.
    pub logins_refused: AtomicU64,
}

/// One of `max_concurrent_logins`, held from accept until CONNECT is verified (or the
/// connection ends); keeps `BrokerStats::logins_in_progress`.
pub(crate) struct LoginPermit {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    stats: Arc<BrokerStats>,
}

impl Drop for LoginPermit {
    fn drop(&mut self) {
        self.stats
            .logins_in_progress
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every connection task shares.
pub(crate) struct Shared {
    pub config: BrokerConfig,
    pub auth: Arc<dyn Authenticator>,
    pub router: Router,
    pub stats: Arc<BrokerStats>,
    pub server_id: String,
    pub host: String,
    pub port: u16,
    /// When the broker started, on both clocks (connections keep `Instant`s; monitoring
    /// reports wall time).
    pub started: SystemTime,
    pub started_at: tokio::time::Instant,
    /// Set while the accept loop runs; cleared by lame duck and shutdown.
    pub accepting: AtomicBool,
    pub lame_duck: AtomicBool,
    /// Every outbound buffer together, against `config.max_pending_total`.
    pub pending: Arc<PendingBudget>,
    /// One shedder at a time: the others wait for it and then usually find room.
    shedding: Mutex<()>,
    /// `config.max_concurrent_logins` permits; None when unbounded.
    logins: Option<Arc<Semaphore>>,
    /// Each credential's share (`config.user_limits`); None when there are no such limits.
    pub quotas: Option<quota::Quotas>,
    clients: Mutex<HashMap<u64, Client>>,
}

struct Client {
    outbound: Arc<Outbound>,
    cancel: CancellationToken,
    meta: Arc<ClientMeta>,
}

/// One connection as monitoring and lame duck see it. Its session writes the counters once
/// per read chunk (relaxed atomics, no lock on the publish path) and the rest at CONNECT.
pub(crate) struct ClientMeta {
    pub peer: SocketAddr,
    pub start: SystemTime,
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    /// Nanoseconds after `Shared::started_at` of the last read.
    pub last_activity: AtomicU64,
    /// The last PING→PONG round trip, in nanoseconds (0: none yet).
    pub rtt_nanos: AtomicU64,
    /// CONNECT said `protocol: 1` and the client has had a PONG: it takes an async INFO
    /// (nats-server's condition for sending the lame-duck INFO).
    pub takes_info: AtomicBool,
    pub connect: Mutex<ConnectMeta>,
}

/// From CONNECT and the authenticator.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectMeta {
    pub name: String,
    pub lang: String,
    pub version: String,
    /// The authenticated user (`Permissions::user`; an API key's id, never the key).
    pub user: String,
    /// `Permissions::internal`: the embedding process's own connection, which monitoring
    /// does not list.
    pub internal: bool,
}

impl ClientMeta {
    pub(crate) fn new(peer: SocketAddr) -> Self {
        ClientMeta {
            peer,
            start: SystemTime::now(),
            messages_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            last_activity: AtomicU64::new(0),
            rtt_nanos: AtomicU64::new(0),
            takes_info: AtomicBool::new(false),
            connect: Mutex::new(ConnectMeta::default()),
        }
    }

    pub(crate) fn connect_meta(&self) -> std::sync::MutexGuard<'_, ConnectMeta> {
        self.connect
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Shared {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Client>> {
        self.clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn register(
        &self,
        client_id: u64,
        outbound: Arc<Outbound>,
        cancel: CancellationToken,
        meta: Arc<ClientMeta>,
    ) {
        self.clients().insert(
            client_id,
            Client {
                outbound,
                cancel,
                meta,
            },
        );
    }

    pub(crate) fn unregister(&self, client_id: u64) {
        self.clients().remove(&client_id);
    }

    /// Frees room in the pending budget by cutting clients as slow consumers, until an
    /// eighth of the budget is free below the pressure mark (so one scan of the clients
    /// serves many appends, not one).
    ///
    /// First those whose socket has been full for [`MIN_BLOCKED`] (the client is not
    /// reading what the kernel already holds for it), longest blocked first. A client that
    /// reads, even one whose writer waits for a busy CPU, is never among them. Only when an
    /// append of `needed` bytes would still exceed the limit itself (`hard`) are the others
    /// cut too, blocked ones first and then the largest buffers: the bound holds whatever
    /// the clients do. Which connection the append was for does not matter.
    pub(crate) fn shed(&self, needed: usize, hard: bool) {
        let _one = self
            .shedding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let budget = &self.pending;
        let goal = budget.pressure() - budget.limit() / 8;
        let fits = |limit: usize| budget.total() + needed <= limit;
        if fits(if hard {
            budget.limit()
        } else {
            budget.pressure()
        }) {
            return; // Another shedder made room meanwhile.
        }
        let outbounds: Vec<(u64, Arc<Outbound>)> = self
            .clients()
            .iter()
            .map(|(id, client)| (*id, client.outbound.clone()))
            .collect();
        // ((pending bytes, blocked for), client id, buffer)
        type Sized = ((usize, Option<Duration>), u64, Arc<Outbound>);
        let mut sized: Vec<Sized> = outbounds
            .into_iter()
            .map(|(id, outbound)| (outbound.pending(), id, outbound))
            .filter(|((pending, _), _, _)| *pending > 0)
            .collect();
        // Longest blocked first, then (never blocked) largest first.
        sized.sort_unstable_by(|(a, _, _), (b, _, _)| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        for ((pending, blocked), client_id, outbound) in sized {
            if fits(goal) {
                break;
            }
            let is_stuck = blocked.is_some_and(|blocked| blocked >= MIN_BLOCKED);
            if !is_stuck && (!hard || fits(budget.limit() - budget.limit() / 8)) {
                break;
            }
            if outbound.cut_slow() {
                tracing::info!(
                    client_id,
                    pending,
                    ?blocked,
                    total = budget.total(),
                    "bus slow consumer: max_pending_total reached"
                );
            }
        }
    }

    /// Waits for a login permit, at most `auth_timeout`; None (counted) when none came.
    pub(crate) async fn login_permit(&self) -> Option<LoginPermit> {
        let permit = match &self.logins {
            None => None,
            Some(logins) => {
                let wait = logins.clone().acquire_owned();
                match tokio::time::timeout(self.config.auth_timeout, wait).await {
                    Ok(Ok(permit)) => Some(permit),
                    _ => {
                        self.stats.logins_timed_out.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        };
        self.stats
            .logins_in_progress
            .fetch_add(1, Ordering::Relaxed);
        Some(LoginPermit {
            _permit: permit,
            stats: self.stats.clone(),
        })
    }

    /// An INFO line: the first one of a connection, or (`ldm`) the lame-duck notice, which
    /// nats-server sends with the same client fields and no nonce.
    pub(crate) fn info(
        &self,
        client_id: u64,
        client_ip: std::net::IpAddr,
        nonce: &str,
        ldm: bool,
    ) -> Vec<u8> {
        let tls_required = self.config.tls.is_some();
        Info {
            server_id: &self.server_id,
            server_name: &self.config.server_name,
            version: connection::NATS_VERSION,
            proto: 1,
            go: env!("BUILT_RUSTC_VERSION"),
            host: &self.host,
            port: self.port,
            headers: true,
            auth_required: self.auth.auth_required(),
            tls_required,
            tls_verify: tls_required && self.config.tls_verify,
            max_payload: self.config.max_payload,
            client_id,
            client_ip: client_ip.to_string(),
            nonce,
            ldm,
            svc_version: env!("CARGO_PKG_VERSION"),
        }
        .to_line()
    }
}

/// The embedded NATS-protocol broker.
pub struct Broker;

impl Broker {
    /// Starts serving `listener` on the current runtime and returns at once. The listener is
    /// taken already bound so the caller owns address choice (and port 0 in tests).
    pub async fn start(
        config: BrokerConfig,
        auth: Arc<dyn Authenticator>,
        listener: TcpListener,
    ) -> std::io::Result<BrokerHandle> {
        let local_addr = listener.local_addr()?;
        let pending = Arc::new(PendingBudget::new(config.max_pending_total));
        let shared = Arc::new(Shared {
            auth,
            router: Router::default(),
            stats: Arc::new(BrokerStats::default()),
            server_id: make_server_id(),
            host: local_addr.ip().to_string(),
            port: local_addr.port(),
            started: SystemTime::now(),
            started_at: tokio::time::Instant::now(),
            accepting: AtomicBool::new(true),
            lame_duck: AtomicBool::new(false),
            pending: pending.clone(),
            shedding: Mutex::new(()),
            logins: (config.max_concurrent_logins > 0)
                .then(|| Arc::new(Semaphore::new(config.max_concurrent_logins))),
            quotas: config.user_limits.clone().map(quota::Quotas::new),
            clients: Mutex::new(HashMap::new()),
            config,
        });
        let weak = Arc::downgrade(&shared);
        pending.set_shedder(Box::new(move |needed| {
            if let Some(shared) = weak.upgrade() {
                shared.shed(needed, true);
            }
        }));
        tokio::spawn(give_back_memory(Arc::downgrade(&shared)));
        let stop = CancellationToken::new();
        let (done_sender, done) = mpsc::channel(1);
        let accept_task = tokio::spawn(accept_loop(
            shared.clone(),
            listener,
            stop.clone(),
            done_sender,
        ));
        tracing::info!(%local_addr, "bus broker listening");
        Ok(BrokerHandle {
            shared,
            local_addr,
            stop,
            accept_task: Some(accept_task),
            done,
        })
    }
}

/// Controls a running broker. Dropping it stops accepting and closes every connection
/// at once; [`BrokerHandle::shutdown`] does it gracefully.
pub struct BrokerHandle {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    stop: CancellationToken,
    accept_task: Option<JoinHandle<()>>,
    done: mpsc::Receiver<()>,
}

impl BrokerHandle {
    /// Publishes into this broker from inside the process (`local`).
    pub fn local_publisher(&self) -> LocalPublisher {
        LocalPublisher::new(self.shared.clone())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> &BrokerStats {
        &self.shared.stats
    }

    /// Lame duck, then close: stop accepting, send every client INFO with `ldm: true` (so
    /// clients reconnect elsewhere or back off), wait up to `grace` for them to leave, then
    /// flush what is queued and close the rest. Returns when every connection task has
    /// finished, or after one more write deadline if some peer will not take its bytes.
    pub async fn shutdown(mut self, grace: Duration) {
        self.stop.cancel();
        if let Some(task) = self.accept_task.take() {
            let _ = task.await;
        }
        if !self.shared.lame_duck.swap(true, Ordering::Relaxed) {
            self.shared.send_lame_duck_info();
        }
        if timeout_recv(&mut self.done, grace).await {
            return;
        }
        for client in self.shared.clients().values() {
            client.cancel.cancel();
        }
        let flush_budget = self.shared.config.write_deadline + Duration::from_secs(1);
        if !timeout_recv(&mut self.done, flush_budget).await {
            tracing::warn!("bus shutdown: some connections did not finish flushing");
            for client in self.shared.clients().values() {
                client.outbound.close(Close::Now);
            }
        }
    }
}

impl BrokerHandle {
    /// What the monitoring endpoints read.
    pub fn view(&self) -> BrokerView {
        BrokerView {
            shared: self.shared.clone(),
        }
    }

    /// nats-server's lame-duck mode (SIGUSR2), without the exit: stop accepting at once,
    /// send every client that takes async INFO one with `ldm: true`, wait `grace`, then close
    /// the connections spread over the rest of `duration` (at most one a second apart, so a
    /// small server is empty soon after the grace period), so that clients reconnect to
    /// other servers gradually rather than all at once. Returns at once; the broker object
    /// stays usable (counters, monitoring) and [`BrokerHandle::shutdown`] still works.
    /// Calling it again does nothing.
    pub fn enter_lame_duck(&self, duration: Duration, grace: Duration) {
        if self.shared.lame_duck.swap(true, Ordering::Relaxed) {
            return;
        }
        self.stop.cancel();
        let shared = self.shared.clone();
        tracing::info!(?duration, ?grace, "bus lame duck: no new connections");
        tokio::spawn(async move {
            shared.send_lame_duck_info();
            tokio::time::sleep(grace).await;
            let mut targets: Vec<(u64, Arc<Outbound>, CancellationToken)> = shared
                .clients()
                .iter()
                .map(|(id, client)| (*id, client.outbound.clone(), client.cancel.clone()))
                .collect();
            crate::sort::sort_by_key(&mut targets, |(id, _, _)| *id);
            let count = targets.len();
            if count == 0 {
                return;
            }
            tracing::info!(count, "bus lame duck: closing existing clients");
            let spread = duration.saturating_sub(grace);
            let (interval, batch) = close_schedule(spread, count);
            for (index, chunk) in targets.chunks(batch).enumerate() {
                if index > 0 {
                    tokio::time::sleep(interval).await;
                }
                for (_, outbound, cancel) in chunk {
                    outbound.close(Close::AfterFlush);
                    cancel.cancel();
                }
            }
            tracing::info!("bus lame duck: every client closed; still serving monitoring");
        });
    }
}

/// How lame duck spreads closing `count` clients over `spread`: (pause, clients per step).
/// At most one second between steps, and at least a millisecond (larger batches then).
fn close_schedule(spread: Duration, count: usize) -> (Duration, usize) {
    let count = count.max(1) as u32;
    let interval = (spread / count).min(Duration::from_secs(1));
    if interval >= Duration::from_millis(1) {
        return (interval, 1);
    }
    let steps = (spread.as_millis() as usize).max(1);
    let batch = (count as usize).div_ceil(steps);
    (Duration::from_millis(1), batch)
}

impl Shared {
    fn send_lame_duck_info(&self) {
        let targets: Vec<(u64, Arc<Outbound>, Arc<ClientMeta>)> = self
            .clients()
            .iter()
            .map(|(id, client)| (*id, client.outbound.clone(), client.meta.clone()))
            .collect();
        for (client_id, outbound, meta) in targets {
            if meta.takes_info.load(Ordering::Relaxed) {
                let info = self.info(client_id, meta.peer.ip(), "", true);
                outbound.push_now(&[&info]);
            }
        }
    }
}

/// True when every sender is gone (all connection tasks finished) within `limit`.
async fn timeout_recv(done: &mut mpsc::Receiver<()>, limit: Duration) -> bool {
    matches!(tokio::time::timeout(limit, done.recv()).await, Ok(None))
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        self.stop.cancel();
        for client in self.shared.clients().values() {
            client.outbound.close(Close::Now);
            client.cancel.cancel();
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    stop: CancellationToken,
    done: mpsc::Sender<()>,
) {
    let slots = Arc::new(Semaphore::new(shared.config.max_connections));
    let mut next_client_id: u64 = 0;
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => {
                shared.accepting.store(false, Ordering::Relaxed);
                return;
            }
            accepted = listener.accept() => accepted,
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Usually EMFILE: back off instead of spinning, and keep serving.
                tracing::warn!(%error, "bus accept failed; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(5);
        next_client_id += 1;
        let client_id = next_client_id;
        let shared = shared.clone();
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(reject_connection(shared, socket, peer, client_id));
            continue;
        };
        let done = done.clone();
        tokio::spawn(async move {
            shared.stats.connections.fetch_add(1, Ordering::Relaxed);
            shared
                .stats
                .total_connections
                .fetch_add(1, Ordering::Relaxed);
            let internal = connection::serve(shared.clone(), socket, peer, client_id).await;
            // An internal connection left the gauge at its CONNECT.
            if !internal {
                shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
            }
            drop(permit);
            drop(done);
        });
    }
}

/// How long a client's socket must have been full before the pending budget's shedder
/// treats it as not reading.
pub(crate) const MIN_BLOCKED: Duration = Duration::from_millis(100);

/// How often the housekeeping task looks at the pending total.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// A drop in pending bytes worth giving memory back for.
const TRIM_AFTER_DROP: usize = 4 * 1024 * 1024;
/// At most one trim in this long.
const TRIM_INTERVAL: Duration = Duration::from_secs(5);

/// Gives freed outbound buffers back to the OS after a burst. Dropped buffers go back to
/// the allocator, but glibc keeps freed memory in its arenas (one per thread that
/// allocated; and after freeing one large mmap'ed block it raises its mmap threshold, so
/// the next large buffers come from the arenas too). So once slow consumers have been cut,
/// or the pending total has fallen by [`TRIM_AFTER_DROP`] from its high mark, this calls
/// `malloc_trim(0)`, which returns every arena's free pages. Sampled once a second: no
/// cost on the publish path. Ends with the broker.
///
/// The mmap threshold itself is left to glibc. Pinning it at 128 KiB (issue 23) made every
/// outbound buffer past that its own mapping, grown by mremap, faulted in page by page and
/// unmapped with TLB shootdowns when dropped: about half the broker's CPU in the bus bench,
/// and pub->sub of 64 KiB at half speed (issue 35, docs/performance.md). Without the pin the
/// 500-slow-consumer burst of `bench/bus_slow.rs` still ends at 5.9 MiB.
async fn give_back_memory(shared: std::sync::Weak<Shared>) {
    let mut ticks = tokio::time::interval(HOUSEKEEPING);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut high = 0;
    let mut slow_seen = 0;
    let mut last_trim: Option<tokio::time::Instant> = None;
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let total = shared.pending.total();
        let slow = shared.stats.slow_consumers.load(Ordering::Relaxed);
        high = high.max(total);
        let due = last_trim.is_none_or(|at| at.elapsed() >= TRIM_INTERVAL);
        if due && (slow != slow_seen || high - total >= TRIM_AFTER_DROP) {
            let took = trim_allocator();
            tracing::info!(
                ?took,
                pending = total,
                high,
                "bus: freed buffers given back"
            );
            last_trim = Some(tokio::time::Instant::now());
            high = total;
            slow_seen = slow;
        }
    }
}

/// `malloc_trim(0)` where the allocator is glibc's; returns how long it took.
fn trim_allocator() -> Duration {
    let started = std::time::Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
    started.elapsed()
}

/// Over the connection cap: INFO, the error nats-server sends, close.
async fn reject_connection(
    shared: Arc<Shared>,
    mut socket: tokio::net::TcpStream,
    peer: SocketAddr,
    client_id: u64,
) {
    tracing::warn!(%peer, "bus connection cap reached");
    let mut reply = shared.info(client_id, peer.ip(), "", false);
    reply.extend_from_slice(b"-ERR 'maximum connections exceeded'\r\n");
    let write = async {
        socket.write_all(&reply).await?;
        socket.shutdown().await
    };
    let _ = tokio::time::timeout(shared.config.write_deadline, write).await;
}

/// 56 characters from A–Z and 2–7, starting with `N`, shaped like nats-server's ids.
fn make_server_id() -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut random = rand::thread_rng();
    std::iter::once('N')
        .chain((0..55).map(|_| char::from(ALPHABET[random.gen_range(0..ALPHABET.len())])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lame_duck_spreads_closes_at_most_a_second_apart() {
        let second = Duration::from_secs(1);
        assert_eq!(close_schedule(Duration::from_secs(20), 3), (second, 1));
        assert_eq!(
            close_schedule(Duration::from_secs(20), 40),
            (Duration::from_millis(500), 1)
        );
        // 100,000 clients over 20 s: 1 ms steps of 5.
        assert_eq!(
            close_schedule(Duration::from_secs(20), 100_000),
            (Duration::from_millis(1), 5)
        );
        assert_eq!(
            close_schedule(Duration::ZERO, 7),
            (Duration::from_millis(1), 7)
        );
    }
}
