//! One client connection: INFO, CONNECT and auth, the op loop, keepalive, and the writer.
//!
//! Owns a connection's session state (options, permissions, its subscriptions by sid) and
//! the two tasks that serve it. The reader task parses ops and routes publishes straight into
//! subscribers' [`Outbound`] buffers; it never waits on another connection. The writer task
//! drains this connection's own buffer, one write per wake-up, under the write deadline.
//! Wake-ups for subscribers are collected while a read chunk is processed and sent once at
//! the end, so a burst of publishes becomes a few large writes (nats-server's trick).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt as _;
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::auth::{AuthRequest, Permissions};
use super::outbound::{Batch, Close, Outbound, Queued, IDLE_CAPACITY};
use super::protocol::{ClientOp, Parsed, Parser, Publish};
use super::quota::{UserQuota, TOKEN_CHUNK};
use super::router::{Matches, Subscription};
use super::{ClientMeta, ConnectMeta, LoginPermit, Shared};
use crate::bus::subjects::{is_valid_literal, is_valid_pattern, subject_matches};

/// The NATS server version we match; clients gate features on it.
pub(crate) const NATS_VERSION: &str = "2.9.10";
/// Most bytes read per syscall when no large payload is pending: what a busy publisher's
/// reads grow to.
const READ_SIZE: usize = 64 * 1024;
/// What a connection's reads start at and shrink back to. Like nats-server (512 bytes to
/// 64 KiB, doubled on a full read, halved on short ones): an idle agent's connection, which
/// reads a heartbeat every 10 s, must not keep a 64 KiB buffer, which its reads would walk
/// through page by page until all of it was resident.
const READ_MIN: usize = 512;
/// Longest a publisher pauses at a time while the outbound buffers are under pressure.
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// A written batch's buffer larger than this is replaced by a READ_SIZE one.
const SHRINK_ABOVE: usize = READ_SIZE;
/// Entries in the per-connection subject cache before it is dropped wholesale.
const LOCAL_CACHE_LIMIT: usize = 256;
/// When a new client gets its first PING (nats-server's `firstClientPingInterval`).
const FIRST_PING: Duration = Duration::from_secs(2);
/// The no-responders status block: `NATS/1.0 503` and the blank line, 16 bytes.
const NO_RESPONDERS: &[u8] = b"NATS/1.0 503\r\n\r\n";

/// How many bytes the next read asks for: doubled after a read that filled the room it had
/// (more is waiting), halved after one that used less than a quarter of it.
struct ReadSize {
    now: usize,
}

impl Default for ReadSize {
    fn default() -> Self {
        ReadSize { now: READ_MIN }
    }
}

impl ReadSize {
    fn after(&mut self, read: usize, room: usize) {
        if read >= room {
            self.now = (self.now * 2).min(READ_SIZE);
        } else if read < self.now / 4 {
            self.now = (self.now / 2).max(READ_MIN);
        }
    }
}

/// The INFO a client reads first (and, with `ldm`, the lame-duck notice). Field names, order
/// and omissions are nats-server 2.9's for a server without clustering or JetStream;
/// `tests/bus_differential.rs` compares the key set with the real one.
#[derive(Serialize)]
pub(crate) struct Info<'a> {
    pub server_id: &'a str,
    pub server_name: &'a str,
    pub version: &'static str,
    pub proto: u8,
    /// The runtime, as nats-server names Go's (`go1.19.8`): `rust1.85.0`.
    pub go: &'static str,
    pub host: &'a str,
    pub port: u16,
    pub headers: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auth_required: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_required: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_verify: bool,
    pub max_payload: usize,
    pub client_id: u64,
    pub client_ip: String,
    /// Only when the authenticator lets clients sign it (agents do).
    #[serde(skip_serializing_if = "str::is_empty")]
    pub nonce: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ldm: bool,
    /// Ours, next to the NATS version we match (the one key nats-server does not send).
    pub svc_version: &'static str,
}

impl Info<'_> {
    /// `INFO {json} \r\n`, with nats-server's space before the line end.
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut line = b"INFO ".to_vec();
        // Serializing a struct of strings, bools and integers cannot fail.
        serde_json::to_writer(&mut line, self).expect("INFO serializes");
        line.extend_from_slice(b" \r\n");
        line
    }
}

/// CONNECT's JSON. Every field is optional and `null` means absent (async-nats sends unset
/// options as null); unknown fields are ignored.
#[derive(Default, Deserialize)]
struct ConnectOptions {
    verbose: Option<bool>,
    pedantic: Option<bool>,
    auth_token: Option<String>,
    user: Option<String>,
    pass: Option<String>,
    nkey: Option<String>,
    sig: Option<String>,
    jwt: Option<String>,
    name: Option<String>,
    lang: Option<String>,
    version: Option<String>,
    protocol: Option<i64>,
    echo: Option<bool>,
    headers: Option<bool>,
    no_responders: Option<bool>,
}

/// Serves one accepted socket until it closes. Runs the TLS handshake first when
/// configured, then the session.
/// Serves one accepted socket until it closes; returns whether it was the embedding process's
/// own connection (`Permissions::internal`), which the caller's connection gauge leaves out.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    socket: TcpStream,
    peer: SocketAddr,
    client_id: u64,
) -> bool {
    let _ = socket.set_nodelay(true);
    // Before INFO: a waiting client costs a socket and nothing else.
    let Some(permit) = shared.login_permit().await else {
        tracing::debug!(%peer, "bus login waited past auth_timeout; closed");
        return false;
    };
    // Without auth no CONNECT is verified: the permit covers the TLS handshake only.
    let login = |login: LoginPermit| shared.auth.auth_required().then_some(login);
    let nonce = if shared.auth.uses_nonce() {
        make_nonce()
    } else {
        String::new()
    };
    let first_info = shared.info(client_id, peer.ip(), &nonce, false);
    let Some(tls) = shared.config.tls.clone() else {
        let (reader, writer) = socket.into_split();
        let session = Session::new(shared.clone(), client_id, peer, nonce, None, login(permit));
        return session.run(reader, writer, first_info).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let handshake_deadline = shared.config.auth_timeout;
    let mut socket = socket;
    if !shared.config.tls_handshake_first {
        // INFO travels in clear; the client upgrades right after reading `tls_required`.
        if socket.write_all(&first_info).await.is_err() {
            return false;
        }
    }
    let stream = match timeout(handshake_deadline, acceptor.accept(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "bus TLS handshake failed");
            return false;
        }
        Err(_) => {
            tracing::debug!(%peer, "bus TLS handshake timed out");
            return false;
        }
    };
    let certificates = stream
        .get_ref()
        .1
        .peer_certificates()
        .filter(|chain| !chain.is_empty())
        .map(|chain| chain.iter().map(|cert| cert.clone().into_owned()).collect());
    let (reader, writer) = tokio::io::split(stream);
    let session = Session::new(
        shared.clone(),
        client_id,
        peer,
        nonce,
        certificates,
        login(permit),
    );
    // With TLS-first, INFO is the first thing inside TLS; otherwise it was already sent.
    let inner_info = if shared.config.tls_handshake_first {
        first_info
    } else {
        Vec::new()
    };
    session.run(reader, writer, inner_info).await
}

fn make_nonce() -> String {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut bytes = [0u8; 11];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What the reader decides after each op.
type Keep = bool;

struct Session {
    shared: Arc<Shared>,
    client_id: u64,
    peer: SocketAddr,
    nonce: String,
    peer_certificates: Option<Vec<CertificateDer<'static>>>,
    /// Held until CONNECT is verified (`BrokerConfig::max_concurrent_logins`).
    login: Option<LoginPermit>,
    outbound: Arc<Outbound>,
    cancel: CancellationToken,
    is_connected: bool,
    /// CONNECT's `protocol` (0 or 1).
    protocol: i64,
    verbose: bool,
    pedantic: bool,
    echo: bool,
    headers: bool,
    no_responders: bool,
    /// `None` means unrestricted, so the common case skips every permission check.
    permissions: Option<Arc<Permissions>>,
    /// Who authenticated (`Permissions::user`), for `BrokerConfig::sender_subjects`.
    user: String,
    /// `Permissions::internal`: not a client, so not in the broker's counters.
    internal: bool,
    /// This credential's share of the broker (`Permissions::quota`), from CONNECT.
    quota: Option<Arc<UserQuota>>,
    /// Publishes already taken from the quota's bucket and not yet made.
    publish_tokens: u32,
    subscriptions: HashMap<Bytes, Arc<Subscription>>,
    /// Exhausted (`UNSUB max`) subscriptions leave the map lazily, when it grows past this.
    sweep_at: usize,
    cache: HashMap<Box<str>, Arc<Matches>>,
    cache_generation: u64,
    /// The last subject published and its matches, valid for `cache_generation`.
    last_subject: Option<(Box<str>, Arc<Matches>)>,
    /// Outbounds (other connections' and ours) to wake when the current chunk is done.
    wakes: Vec<Arc<Outbound>>,
    scratch: Vec<u8>,
    random: u64,
    pings_out: u32,
    /// Whether a PONG has answered one of our PINGs. Until then the keepalive pings even
    /// an active client, like nats-server's first (RTT-measuring) ping.
    has_round_trip: bool,
    last_activity: Instant,
    /// When the oldest unanswered PING went out, for the round-trip time.
    ping_sent: Option<Instant>,
    counters: Counters,
    /// What monitoring and lame duck see of this connection.
    meta: Arc<ClientMeta>,
}

#[derive(Default)]
struct Counters {
    messages_in: u64,
    bytes_in: u64,
    messages_out: u64,
    bytes_out: u64,
}

impl Session {
    fn new(
        shared: Arc<Shared>,
        client_id: u64,
        peer: SocketAddr,
        nonce: String,
        peer_certificates: Option<Vec<CertificateDer<'static>>>,
        login: Option<LoginPermit>,
    ) -> Self {
        let outbound = Arc::new(Outbound::new(
            shared.config.max_pending_bytes,
            shared.pending.clone(),
            shared.stats.clone(),
        ));
        Session {
            client_id,
            peer,
            nonce,
            peer_certificates,
            login,
            outbound,
            cancel: CancellationToken::new(),
            is_connected: false,
            protocol: 0,
            // nats-server's defaults before (and absent from) CONNECT.
            verbose: true,
            pedantic: true,
            echo: true,
            headers: false,
            no_responders: false,
            permissions: None,
            user: "anonymous".into(),
            internal: false,
            quota: None,
            publish_tokens: 0,
            subscriptions: HashMap::new(),
            sweep_at: 64,
            cache: HashMap::new(),
            cache_generation: 0,
            last_subject: None,
            wakes: Vec::new(),
            scratch: Vec::with_capacity(256),
            random: rand::random::<u64>() | 1,
            pings_out: 0,
            has_round_trip: false,
            last_activity: Instant::now(),
            ping_sent: None,
            counters: Counters::default(),
            meta: Arc::new(ClientMeta::new(peer)),
            shared,
        }
    }

    #[tracing::instrument(name = "bus_connection", skip_all, fields(client_id = self.client_id, peer = %self.peer))]
    async fn run<R, W>(mut self, reader: R, writer: W, info: Vec<u8>) -> bool
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        self.shared.register(
            self.client_id,
            self.outbound.clone(),
            self.cancel.clone(),
            self.meta.clone(),
        );
        if !info.is_empty() {
            self.outbound.push_now(&[&info]);
        }
        let writer_task = tokio::spawn(write_loop(
            writer,
            self.outbound.clone(),
            self.shared.clone(),
            self.cancel.clone(),
        ));
        self.read_loop(reader).await;
        for subscription in self.subscriptions.values() {
            self.shared.router.remove(subscription);
        }
        self.subscriptions.clear();
        self.outbound.close(Close::AfterFlush);
        let _ = writer_task.await;
        self.shared.unregister(self.client_id);
        self.internal
    }

    async fn read_loop<R: AsyncRead + Unpin>(&mut self, mut reader: R) {
        let config = &self.shared.config;
        let parser = Parser {
            max_control_line: config.max_control_line,
            max_payload: config.max_payload,
        };
        let auth_required = self.shared.auth.auth_required();
        let auth_deadline = tokio::time::sleep(config.auth_timeout);
        tokio::pin!(auth_deadline);
        // nats-server pings a new client after 2 s (plus up to 20% jitter, so a reconnect
        // storm does not ping in lockstep), then every ping_interval.
        let ping_interval = config.ping_interval;
        let first_ping = ping_interval.min(FIRST_PING);
        let jitter = first_ping.mul_f64((self.next_random() % 1000) as f64 / 5000.0);
        let mut ping_timer =
            tokio::time::interval_at(Instant::now() + first_ping + jitter, ping_interval);
        ping_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let cancel = self.cancel.clone();
        let mut buffer = BytesMut::new();
        let mut read_size = ReadSize::default();
        loop {
            if buffer.capacity() - buffer.len() < read_size.now / 4 {
                buffer.reserve(read_size.now);
            }
            let room = buffer.capacity() - buffer.len();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = &mut auth_deadline, if auth_required && !self.is_connected => {
                    self.send_error("Authentication Timeout");
                    self.wake_all();
                    return;
                }
                _ = ping_timer.tick() => {
                    let keep = self.on_ping_timer();
                    self.wake_all();
                    if !keep {
                        return;
                    }
                }
                read = reader.read_buf(&mut buffer) => {
                    match read {
                        Ok(0) | Err(_) => return,
                        Ok(read) => read_size.after(read, room),
                    }
                    self.last_activity = Instant::now();
                    let since_start = self.last_activity.duration_since(self.shared.started_at);
                    self.meta
                        .last_activity
                        .store(since_start.as_nanos() as u64, Ordering::Relaxed);
                    let keep = self.process(&parser, &mut buffer, auth_required).await;
                    // Counters first: a client that sees its PONG reads them current.
                    self.flush_counters();
                    self.wake_all();
                    if !keep {
                        return;
                    }
                    // All read was handled: a buffer grown past what reads now take (a
                    // burst, a large payload) goes; the next read starts a small one.
                    if buffer.is_empty() && buffer.capacity() > read_size.now * 2 {
                        buffer = BytesMut::new();
                    }
                }
            }
        }
    }

    /// Handles every complete op in `buffer`; returns false when the connection must close.
    async fn process(
        &mut self,
        parser: &Parser,
        buffer: &mut BytesMut,
        auth_required: bool,
    ) -> Keep {
        loop {
            // nats-server rejects the first byte of anything but CONNECT before CONNECT.
            if auth_required && !self.is_connected {
                if let Some(&first) = buffer.first() {
                    if first != b'C' && first != b'c' {
                        self.send_error("Authorization Violation");
                        return false;
                    }
                }
            }
            match parser.parse(buffer) {
                Ok(Parsed::Op(op)) => {
                    if matches!(op, ClientOp::Publish(_)) && !self.admit_publish().await {
                        return false;
                    }
                    if !self.handle(op).await {
                        return false;
                    }
                    if self.shared.pending.is_under_pressure() {
                        self.ease_pressure().await;
                    }
                }
                Ok(Parsed::NeedMore { frame_len }) => {
                    if frame_len > buffer.capacity() {
                        buffer.reserve(frame_len - buffer.len());
                    }
                    return true;
                }
                Err(error) => {
                    tracing::debug!(?error, "bus protocol error");
                    if let Some(text) = error.error_text() {
                        self.send_error(text);
                    }
                    return false;
                }
            }
        }
    }

    async fn handle(&mut self, op: ClientOp) -> Keep {
        match op {
            ClientOp::Connect(json) => self.connect(&json).await,
            ClientOp::Publish(publish) => self.publish(publish),
            ClientOp::Subscribe {
                subject,
                queue,
                sid,
            } => self.subscribe(&subject, queue.as_deref(), sid),
            ClientOp::Unsubscribe { sid, max } => {
                self.unsubscribe(&sid, max);
                true
            }
            ClientOp::Ping => {
                self.push_own(&[b"PONG\r\n"]);
                // nats-server sends async INFO (lame duck) only to protocol-1 clients that
                // have had a PONG.
                if self.is_connected
                    && self.protocol >= 1
                    && !self.meta.takes_info.load(Ordering::Relaxed)
                {
                    self.meta.takes_info.store(true, Ordering::Relaxed);
                }
                true
            }
            ClientOp::Pong => {
                self.has_round_trip |= self.pings_out > 0;
                self.pings_out = 0;
                if let Some(sent) = self.ping_sent.take() {
                    let rtt = sent.elapsed().as_nanos().max(1) as u64;
                    self.meta.rtt_nanos.store(rtt, Ordering::Relaxed);
                }
                true
            }
            ClientOp::Ignored => true,
        }
    }

    async fn connect(&mut self, json: &[u8]) -> Keep {
        // Bad JSON closes silently, as nats-server does.
        let Ok(options) = serde_json::from_slice::<ConnectOptions>(json) else {
            return false;
        };
        // Anything queued so far goes out before we wait on the authenticator.
        self.wake_all();
        let request = AuthRequest {
            auth_token: options.auth_token.as_deref(),
            user: options.user.as_deref(),
            pass: options.pass.as_deref(),
            nkey: options.nkey.as_deref(),
            sig: options.sig.as_deref(),
            jwt: options.jwt.as_deref(),
            name: options.name.as_deref(),
            nonce: &self.nonce,
            client_ip: self.peer.ip(),
            peer_certificates: self.peer_certificates.as_deref(),
        };
        let verified = self.shared.auth.authenticate(&request).await;
        self.login = None;
        let outcome = if verified.is_some() {
            &self.shared.stats.logins_accepted
        } else {
            &self.shared.stats.logins_refused
        };
        outcome.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(permissions) = verified else {
            tracing::info!(
                user = options.user.as_deref().unwrap_or(""),
                "bus authorization violation"
            );
            self.send_error("Authorization Violation");
            return false;
        };
        let protocol = options.protocol.unwrap_or(0);
        if !matches!(protocol, 0 | 1) {
            self.send_error("invalid client protocol");
            return false;
        }
        self.protocol = protocol;
        *self.meta.connect_meta() = ConnectMeta {
            name: options.name.clone().unwrap_or_default(),
            lang: options.lang.clone().unwrap_or_default(),
            version: options.version.clone().unwrap_or_default(),
            user: permissions.user.clone(),
            internal: permissions.internal,
        };
        self.verbose = options.verbose.unwrap_or(true);
        self.pedantic = options.pedantic.unwrap_or(true);
        self.echo = options.echo.unwrap_or(true);
        self.headers = options.headers.unwrap_or(false);
        self.no_responders = options.no_responders.unwrap_or(false);
        if self.no_responders && !self.headers {
            self.send_error("no responders requires headers support");
            return false;
        }
        self.user = permissions.user.clone();
        self.set_internal(permissions.internal);
        self.publish_tokens = 0;
        self.quota = match &self.shared.quotas {
            Some(quotas) if permissions.quota && !permissions.internal => {
                Some(quotas.join(&permissions.user, &self.outbound))
            }
            _ => None,
        };
        self.permissions = (!permissions.is_unrestricted()).then(|| Arc::new(permissions));
        self.is_connected = true;
        self.send_ok();
        true
    }

    fn publish(&mut self, publish: Publish) -> Keep {
        if publish.header_len.is_some() && !self.headers {
            return false;
        }
        let Ok(subject) = std::str::from_utf8(publish.subject()) else {
            return false;
        };
        self.counters.messages_in += 1;
        self.counters.bytes_in += publish.payload().len() as u64;
        // nats-server's order: the pedantic check (which reports but still routes), then
        // permissions (which drop), then +OK, then delivery.
        if self.pedantic && !is_valid_literal(subject) {
            self.send_error("Invalid Publish Subject");
        }
        if let Some(permissions) = &self.permissions {
            if !permissions.publish.allows(subject) {
                let text = format!("Permissions Violation for Publish to \"{subject}\"");
                self.send_error(&text);
                return true;
            }
        }
        self.send_ok();
        let matches = self.lookup(subject);
        let reply = publish.reply();
        let stamped = self
            .shared
            .config
            .sender_subjects
            .as_deref()
            .filter(|pattern| subject_matches(pattern, subject))
            .map(|_| stamp_sender(publish.header_len, publish.payload(), &self.user));
        let (header_len, payload) = match &stamped {
            Some((header_len, payload)) => (Some(*header_len), &payload[..]),
            None => (publish.header_len, publish.payload()),
        };
        let delivered = self.deliver(&matches, subject, reply, header_len, payload);
        if !delivered && self.no_responders && self.headers {
            if let Some(reply) = reply.and_then(|reply| std::str::from_utf8(reply).ok()) {
                self.send_no_responders(reply);
            }
        }
        true
    }

    /// Delivers to every matching plain subscription and one member per queue group;
    /// returns whether anyone got the message.
    fn deliver(
        &mut self,
        matches: &Matches,
        subject: &str,
        reply: Option<&[u8]>,
        header_len: Option<usize>,
        payload: &[u8],
    ) -> bool {
        let mut delivered = false;
        for subscription in &matches.plain {
            if !self.echo && subscription.client_id == self.client_id {
                continue;
            }
            delivered |= self.deliver_to(subscription, subject, reply, header_len, payload);
        }
        for group in &matches.groups {
            let start = self.next_random() as usize % group.len();
            for offset in 0..group.len() {
                let subscription = &group[(start + offset) % group.len()];
                if !self.echo && subscription.client_id == self.client_id {
                    continue;
                }
                if self.deliver_to(subscription, subject, reply, header_len, payload) {
                    delivered = true;
                    break;
                }
            }
        }
        delivered
    }

    fn deliver_to(
        &mut self,
        subscription: &Arc<Subscription>,
        subject: &str,
        reply: Option<&[u8]>,
        header_len: Option<usize>,
        payload: &[u8],
    ) -> bool {
        let queued = subscription.offer(
            &self.shared.router,
            &mut self.scratch,
            subject,
            reply,
            header_len,
            payload,
        );
        match queued {
            None | Some(Queued::Closed) => return false,
            Some(Queued::Wake) => self.wakes.push(subscription.outbound.clone()),
            Some(Queued::Pending) => {}
        }
        if !subscription.internal {
            self.counters.messages_out += 1;
            self.counters.bytes_out += payload.len() as u64;
        }
        true
    }

    /// The 503 status goes to the first of our own subscriptions that matches the reply
    /// subject, in match order (what nats-server picks).
    fn send_no_responders(&mut self, reply: &str) {
        if !is_valid_literal(reply) {
            return;
        }
        let matches = self.shared.router.lookup(reply);
        let own = matches
            .plain
            .iter()
            .find(|subscription| subscription.client_id == self.client_id)
            .cloned();
        if let Some(subscription) = own {
            self.deliver_to(
                &subscription,
                reply,
                None,
                Some(NO_RESPONDERS.len()),
                NO_RESPONDERS,
            );
        }
    }

    fn subscribe(&mut self, subject: &[u8], queue: Option<&[u8]>, sid: Bytes) -> Keep {
        let (Ok(subject), Ok(queue)) = (
            std::str::from_utf8(subject),
            queue.map(std::str::from_utf8).transpose(),
        ) else {
            return false;
        };
        if !is_valid_pattern(subject) || queue.is_some_and(|queue| !is_valid_literal(queue)) {
            self.send_error("Invalid Subject");
            return true;
        }
        let mut deny = Vec::new();
        if let Some(permissions) = &self.permissions {
            if !permissions.subscribe.allows(subject) {
                let text = match queue {
                    Some(queue) => format!(
                        "Permissions Violation for Subscription to \"{subject}\" using queue \"{queue}\""
                    ),
                    None => format!("Permissions Violation for Subscription to \"{subject}\""),
                };
                self.send_error(&text);
                return true;
            }
            deny = permissions.subscribe.partial_denials(subject);
        }
        let is_taken = self
            .subscriptions
            .get(&sid)
            .is_some_and(|existing| !existing.is_exhausted());
        if !is_taken {
            if self.subscriptions.len() >= self.sweep_at {
                self.subscriptions
                    .retain(|_, subscription| !subscription.is_exhausted());
                self.sweep_at = (self.subscriptions.len() * 2).max(64);
            }
            let subscription = Arc::new(Subscription::new(
                self.client_id,
                self.internal,
                self.outbound.clone(),
                // Copied: a slice would pin the whole read chunk for the subscription's life.
                Bytes::copy_from_slice(&sid),
                subject.to_owned(),
                queue.map(str::to_owned),
                deny,
            ));
            self.shared.router.insert(subscription.clone());
            self.subscriptions
                .insert(subscription.sid.clone(), subscription);
        }
        self.send_ok();
        true
    }

    fn unsubscribe(&mut self, sid: &[u8], max: Option<u64>) {
        if let Some(subscription) = self.subscriptions.get(sid) {
            let remove_now = match max {
                Some(max) if max > 0 => subscription.set_max(max),
                _ => true,
            };
            if remove_now {
                self.shared.router.remove(subscription);
                self.subscriptions.remove(sid);
            }
        }
        self.send_ok();
    }

    fn lookup(&mut self, subject: &str) -> Arc<Matches> {
        let generation = self.shared.router.generation();
        if generation != self.cache_generation {
            self.cache.clear();
            self.last_subject = None;
            self.cache_generation = generation;
        }
        // Most publishers repeat one subject: compare bytes before paying for a hash.
        if let Some((last, matches)) = &self.last_subject {
            if **last == *subject {
                return matches.clone();
            }
        }
        if let Some(matches) = self.cache.get(subject) {
            let matches = matches.clone();
            self.last_subject = Some((subject.into(), matches.clone()));
            return matches;
        }
        let matches = self.shared.router.lookup(subject);
        if self.cache.len() >= LOCAL_CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(subject.into(), matches.clone());
        self.last_subject = Some((subject.into(), matches.clone()));
        matches
    }

    /// Server-side keepalive: skipped while the client is active; a third outstanding ping
    /// is a stale connection.
    fn on_ping_timer(&mut self) -> Keep {
        let config = &self.shared.config;
        if self.has_round_trip && self.last_activity.elapsed() < config.ping_interval {
            return true;
        }
        if self.pings_out + 1 > config.max_pings_out {
            self.send_error("Stale Connection");
            return false;
        }
        self.pings_out += 1;
        if self.ping_sent.is_none() {
            self.ping_sent = Some(Instant::now());
        }
        self.push_own(&[b"PING\r\n"]);
        true
    }

    /// Takes one publish from this credential's rate (`UserLimits::publish_rate`), waiting
    /// while its bucket is empty: the client's next ops stay in its socket meanwhile, so a
    /// fast publisher is slowed, never dropped, and other credentials are not slowed. False
    /// when the connection closed while waiting.
    async fn admit_publish(&mut self) -> Keep {
        if self.publish_tokens > 0 {
            self.publish_tokens -= 1;
            return true;
        }
        let Some(quota) = self.quota.clone() else {
            return true;
        };
        loop {
            match quota.take_publishes(TOKEN_CHUNK) {
                Ok(granted) => {
                    self.publish_tokens = granted - 1;
                    return true;
                }
                Err(wait) => {
                    self.shared
                        .stats
                        .publishes_throttled
                        .fetch_add(1, Ordering::Relaxed);
                    // What was handled so far goes out before the pause.
                    self.flush_counters();
                    self.wake_all();
                    tokio::select! {
                        _ = self.cancel.cancelled() => return false,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// The outbound buffers together are past three quarters of `max_pending_total`: wake
    /// the writers queued for so far, then stop reading (this client's next ops wait in
    /// its socket) while they drain, cutting clients that stopped reading, for at most
    /// [`MAX_PAUSE`]. nats-server similarly stalls a fast producer when a subscriber's
    /// buffer fills. Costs the publish path one relaxed load per op.
    async fn ease_pressure(&mut self) {
        self.flush_counters();
        self.wake_all();
        let budget = self.shared.pending.clone();
        let started = Instant::now();
        while budget.is_under_pressure() && started.elapsed() < MAX_PAUSE {
            self.shared.shed(0, false);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn send_ok(&mut self) {
        if self.verbose {
            self.push_own(&[b"+OK\r\n"]);
        }
    }

    fn send_error(&mut self, text: &str) {
        self.push_own(&[b"-ERR '", text.as_bytes(), b"'\r\n"]);
    }

    fn push_own(&mut self, pieces: &[&[u8]]) {
        if self.outbound.push(pieces) == Queued::Wake {
            self.wakes.push(self.outbound.clone());
        }
    }

    fn wake_all(&mut self) {
        for outbound in self.wakes.drain(..) {
            outbound.wake();
        }
    }

    /// The connection's kind from CONNECT: an internal one leaves the connection counters
    /// (it was counted at accept); a second CONNECT that changes it puts it back.
    fn set_internal(&mut self, internal: bool) {
        if internal == self.internal {
            return;
        }
        self.internal = internal;
        let stats = &self.shared.stats;
        if internal {
            stats.connections.fetch_sub(1, Ordering::Relaxed);
            stats.total_connections.fetch_sub(1, Ordering::Relaxed);
        } else {
            stats.connections.fetch_add(1, Ordering::Relaxed);
            stats.total_connections.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn flush_counters(&mut self) {
        let stats = &self.shared.stats;
        let counters = std::mem::take(&mut self.counters);
        if counters.messages_in > 0 {
            self.meta
                .messages_in
                .fetch_add(counters.messages_in, Ordering::Relaxed);
            self.meta
                .bytes_in
                .fetch_add(counters.bytes_in, Ordering::Relaxed);
        }
        // An internal connection's publishes are not client traffic (nats-server counts
        // what its clients' read loops parse).
        if counters.messages_in > 0 && !self.internal {
            stats
                .messages_in
                .fetch_add(counters.messages_in, Ordering::Relaxed);
            stats
                .bytes_in
                .fetch_add(counters.bytes_in, Ordering::Relaxed);
        }
        if counters.messages_out > 0 {
            stats
                .messages_out
                .fetch_add(counters.messages_out, Ordering::Relaxed);
            stats
                .bytes_out
                .fetch_add(counters.bytes_out, Ordering::Relaxed);
        }
    }

    /// xorshift64: queue-member choice needs spread, not cryptographic randomness, and this
    /// avoids a thread-local RNG lookup per message.
    fn next_random(&mut self) -> u64 {
        let mut value = self.random;
        value ^= value << 13;
        value ^= value >> 7;
        value ^= value << 17;
        self.random = value;
        value
    }
}

/// Drains the outbound buffer into the socket until it is closed. A write that exceeds the
/// write deadline marks the client a slow consumer. When this ends, the reader is cancelled.
/// The message with `SENDER_HEADER: user` as its only sender header: any the client sent
/// (in any letter case) is dropped, a message without headers gets a header block. Returns
/// the new header length and the whole new payload.
pub(crate) fn stamp_sender(
    header_len: Option<usize>,
    payload: &[u8],
    user: &str,
) -> (usize, Vec<u8>) {
    let (headers, body) = match header_len {
        Some(length) if length <= payload.len() => payload.split_at(length),
        _ => (&b""[..], payload),
    };
    let mut out = Vec::with_capacity(payload.len() + user.len() + 32);
    let mut lines = headers
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    match lines.next() {
        Some(status) if status.starts_with(b"NATS/") => out.extend_from_slice(status),
        _ => out.extend_from_slice(b"NATS/1.0"),
    }
    out.extend_from_slice(b"\r\n");
    for line in lines.filter(|line| !line.is_empty()) {
        let name = line.split(|&b| b == b':').next().unwrap_or_default();
        if name
            .trim_ascii()
            .eq_ignore_ascii_case(super::SENDER_HEADER.as_bytes())
        {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(super::SENDER_HEADER.as_bytes());
    out.extend_from_slice(b": ");
    // A user name never holds CR or LF (key ids, agent ids); drop them if one ever did.
    out.extend(user.bytes().filter(|b| !matches!(b, b'\r' | b'\n')));
    out.extend_from_slice(b"\r\n\r\n");
    let header_len = out.len();
    out.extend_from_slice(body);
    (header_len, out)
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    outbound: Arc<Outbound>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let deadline = shared.config.write_deadline;
    let mut batch = Vec::new();
    loop {
        match outbound.take(&mut batch) {
            Batch::Write => {
                let write = async {
                    writer.write_all(&batch).await?;
                    writer.flush().await
                };
                let mut write = std::pin::pin!(timeout(deadline, write));
                let written = match (&mut write).now_or_never() {
                    Some(written) => written,
                    None => {
                        // The socket is full: tell the shedder, which cuts such clients
                        // first, and drop the batch as soon as it does rather than at the
                        // write deadline.
                        outbound.mark_blocked();
                        tokio::select! {
                            _ = outbound.killed() => break,
                            written = write => written,
                        }
                    }
                };
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        outbound.close(Close::Now);
                        break;
                    }
                    Err(_) => {
                        tracing::info!("bus slow consumer: write deadline exceeded");
                        shared.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
                        outbound.close(Close::Now);
                        break;
                    }
                }
                batch.clear();
                // One burst must not pin a big buffer for the connection's whole life (it
                // comes back through `take` as the publishers' next buffer).
                if batch.capacity() > SHRINK_ABOVE {
                    batch = Vec::new();
                }
            }
            Batch::Wait => {
                if batch.capacity() > IDLE_CAPACITY {
                    batch = Vec::new();
                }
                outbound.wait().await;
            }
            Batch::Close(Close::AfterFlush) => {
                let _ = timeout(Duration::from_secs(1), writer.shutdown()).await;
                break;
            }
            Batch::Close(Close::Now) => break,
        }
    }
    cancel.cancel();
}

#[cfg(test)]
mod tests {
    use super::{stamp_sender, ReadSize, READ_MIN, READ_SIZE};

    #[test]
    fn reads_grow_while_they_fill_and_shrink_back_when_short() {
        let mut size = ReadSize::default();
        assert_eq!(size.now, READ_MIN);
        // A busy publisher: every read fills what it was given.
        for _ in 0..20 {
            let room = size.now;
            size.after(room, room);
        }
        assert_eq!(size.now, READ_SIZE);
        // A read of half its room changes nothing; an idle agent's small reads shrink it.
        size.after(READ_SIZE / 2, READ_SIZE);
        assert_eq!(size.now, READ_SIZE);
        for _ in 0..20 {
            size.after(100, size.now);
        }
        assert_eq!(size.now, READ_MIN);
    }

    #[test]
    fn the_broker_stamps_the_sender_and_drops_forgeries() {
        type Case<'a> = (Option<&'a [u8]>, &'a [u8], &'a str);
        let cases: &[Case] = &[
            (None, b"body", "NATS/1.0\r\nSvc-Bus-User: k1\r\n\r\nbody"),
            (
                Some(b"NATS/1.0\r\nA: 1\r\nsvc-bus-user: admin\r\nSvc-Bus-User : x\r\n\r\n"),
                b"b",
                "NATS/1.0\r\nA: 1\r\nSvc-Bus-User: k1\r\n\r\nb",
            ),
            (
                Some(b"NATS/1.0\r\n\r\n"),
                b"",
                "NATS/1.0\r\nSvc-Bus-User: k1\r\n\r\n",
            ),
        ];
        for (headers, body, expected) in cases {
            let mut payload = headers.unwrap_or_default().to_vec();
            payload.extend_from_slice(body);
            let (header_len, stamped) = stamp_sender(headers.map(<[u8]>::len), &payload, "k1");
            assert_eq!(String::from_utf8_lossy(&stamped), *expected);
            assert_eq!(&stamped[header_len..], *body);
        }
    }
}
