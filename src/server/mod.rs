//! svc-server: builds the domain and its context, starts REST, gRPC and the bus (the embedded
//! broker, or a client of `bus.external_urls`), and shuts them down in order on SIGTERM/SIGINT
//! (or when `svc-cluster remove` evicts this member).
//!
//! Start-up order (`cmd::run`): config → data dir and its lock → the configuration's checks
//! (`preflight`) → store (migrations) → bootstrap admin key → master key (decoded once,
//! checked against the store) → embedded CA → NATS operator keys (`bus.external_auth: jwt`
//! only) → local stream logs → REST, gRPC and bus listeners bound → broker → the server's bus
//! client (then, in cluster mode, the JetStream streams and membership) → `Domain::start` →
//! admin recoveries audited → bus subscribers (enrolment, fleet, files, plan content) and
//! background tasks → REST and gRPC serve → `listen-addrs.json` (so tests and tools can find
//! ports bound as `:0`).
//!
//! Also here, shared by the transports: the request span every REST call, gRPC call and bus
//! request runs in, the bus replies' helpers, and the role check REST and gRPC make before
//! they read a request (`role_check`, against `auth::access`) with the `denied` audit row of
//! such a refusal, so both transports refuse the same way.

pub mod bus;
mod bus_monitor;
mod cmd;
mod enrol;
pub mod fds;
mod files;
mod fleet;
pub mod grpc;
mod health;
pub mod http;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ServerConfig;
use crate::domain::Domain;
use crate::metrics::Metrics;

pub use cmd::{args_info, main};
pub use health::{Component, Readiness};

/// How long in-flight requests and streams may run after a stop signal (contract §6).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// The file in the data dir that records the bound addresses.
pub const LISTEN_ADDRS_FILE: &str = "listen-addrs.json";

/// What the transports share: the finished domain, plus what only servers need (the
/// configuration, the bus handle, readiness and metrics). Handlers authenticate with
/// `context.domain.authenticate` and call domain functions with `&context.domain`.
pub struct Context {
    pub config: ServerConfig,
    pub data_dir: PathBuf,
    pub domain: Arc<Domain>,
    pub bus: bus::Bus,
    /// The durable streams, by name, for readiness.
    pub streams: Vec<(&'static str, Arc<dyn crate::stream::Stream>)>,
    pub metrics: Metrics,
    pub started: Instant,
    /// Set while the gRPC server is accepting; readiness reports it.
    pub grpc_serving: AtomicBool,
}

impl Context {
    pub fn new(
        config: ServerConfig,
        data_dir: PathBuf,
        domain: Arc<Domain>,
        bus: bus::Bus,
        streams: Vec<(&'static str, Arc<dyn crate::stream::Stream>)>,
    ) -> Self {
        Context {
            config,
            data_dir,
            domain,
            bus,
            streams,
            metrics: Metrics::default(),
            started: Instant::now(),
            grpc_serving: AtomicBool::new(false),
        }
    }

    pub fn is_grpc_serving(&self) -> bool {
        self.grpc_serving.load(Ordering::Relaxed)
    }
}

/// Addresses the listeners actually bound (ports may have been `:0`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BoundAddrs {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// The embedded broker's URL (`tls://` with `bus.tls`, else `nats://`), or the external
    /// cluster's URLs.
    pub bus: String,
    /// Whether REST and gRPC serve TLS only (`tls` configured): clients use `https://`.
    #[serde(default)]
    pub tls: bool,
    /// The embedded broker's monitoring listener (`listen.bus_monitor`), when on.
    #[serde(default)]
    pub bus_monitor: Option<SocketAddr>,
}

/// A new request id: the server's start time and a counter, unique per server and cheap
/// (no randomness on the request path).
pub fn request_id() -> String {
    use std::sync::atomic::AtomicU64;
    use std::sync::OnceLock;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    static PREFIX: OnceLock<String> = OnceLock::new();
    let prefix = PREFIX.get_or_init(|| format!("{:x}", crate::clock::now_millis()));
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The span one request runs in, on every transport: its id, the transport, the route (a
/// REST route template, a gRPC method, a bus subject) and, once authenticated, the caller's
/// key id (`Domain::authenticate` records it). Every log line inside carries them, so one
/// `grep <id>` follows a request.
pub fn request_span(transport: &'static str, route: &str, id: &str) -> tracing::Span {
    tracing::info_span!(
        "request",
        id,
        transport,
        route,
        key_id = tracing::field::Empty
    )
}

/// The reply subject of an agent's request when it is one of the agent's own (a literal
/// subject under `prefix`, inside `svc.agent.<id>.`): only that agent can read it, where an
/// `_INBOX` could be read by operator keys. None for anything else, which is then ignored.
fn own_reply(message: &async_nats::Message, prefix: &str) -> Option<async_nats::Subject> {
    message
        .reply
        .clone()
        .filter(|reply| reply.starts_with(prefix) && crate::bus::subjects::is_valid_literal(reply))
}

/// Publishes a request's answer; a failure is only logged, since the asker times out anyway.
async fn send_reply(
    context: &Context,
    reply: async_nats::Subject,
    (headers, body): (async_nats::HeaderMap, bytes::Bytes),
    what: &str,
) {
    let sent = context
        .bus
        .client
        .publish_with_headers(reply, headers, body)
        .await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, "{what} reply not sent");
    }
}

/// The role check REST and gRPC make before they read anything a request carries
/// (`auth::access`): Ok when `access` lets `principal` in, else the refusal (`Forbidden`,
/// with `Principal::require`'s message). The domain checks the role again; this one comes
/// first so that a caller without the role learns that, and nothing about its input.
fn role_check(
    principal: &crate::auth::Principal,
    access: crate::auth::Access,
) -> crate::Result<()> {
    match access {
        crate::auth::Access::Least(needed) => principal.require(needed),
        crate::auth::Access::Public | crate::auth::Access::RefusedByDesign => Ok(()),
    }
}

/// Writes the `denied` audit row of `refusal`, a refusal by role of `operation` (a name in
/// `auth::access::GRPC` or `REST`), when that operation's refusals are audited
/// (`access::AUDITED`): its action and resource type, and the resource id its `ResourceId`
/// says, where `found` is what the transport read for `Field` or `Path` (None: nothing
/// readable). The detail names the role the operation needs.
async fn audit_role_refusal(
    domain: &Domain,
    principal: &crate::auth::Principal,
    operation: &str,
    access: crate::auth::Access,
    refusal: &crate::Error,
    found: Option<String>,
) {
    use crate::auth::access::ResourceId;
    let Some(audited) = crate::auth::access::audited(operation) else {
        return;
    };
    let resource_id = match audited.id {
        ResourceId::Empty => String::new(),
        ResourceId::Fixed(id) => id.to_string(),
        ResourceId::Field(_) | ResourceId::Path => found.unwrap_or_default(),
    };
    let needs = match access {
        crate::auth::Access::Least(role) => role.as_str(),
        crate::auth::Access::Public | crate::auth::Access::RefusedByDesign => "",
    };
    let action = crate::audit::Action::new(audited.action, audited.resource_type, resource_id)
        .detail(serde_json::json!({ "needs": needs }));
    domain
        .auditor
        .record_failure(principal, action, refusal)
        .await;
}
