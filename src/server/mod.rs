//! svc-server: builds the domain context, starts REST, gRPC (and later the bus), and shuts
//! them down in order on SIGTERM/SIGINT.
//!
//! Start-up order: config → data dir → store (migrations) → bootstrap admin key → listeners →
//! `listen-addrs.json` (so tests and tools can find ports bound as `:0`) → serve.

pub mod bus;
mod bus_monitor;
mod cmd;
mod enrol;
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

use crate::auth::{self, Principal, RateLimiter};
use crate::config::ServerConfig;
use crate::domain::Domain;
use crate::metrics::Metrics;
use crate::Result;

pub use cmd::main;
pub use health::{Component, Readiness};

/// How long in-flight requests and streams may run after a stop signal (contract §6).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// The file in the data dir that records the bound addresses.
pub const LISTEN_ADDRS_FILE: &str = "listen-addrs.json";

/// Everything a request handler needs: the domain's shared state. Transports hold an
/// `Arc<Context>` and call domain functions with it.
pub struct Context {
    pub config: ServerConfig,
    pub data_dir: PathBuf,
    pub domain: Domain,
    pub bus: bus::Bus,
    /// The durable streams, by name, for readiness.
    pub streams: Vec<(&'static str, Arc<crate::stream::StreamLog>)>,
    pub rate_limiter: RateLimiter,
    pub metrics: Metrics,
    pub started: Instant,
    /// Set while the gRPC server is accepting; readiness reports it.
    pub grpc_serving: AtomicBool,
}

impl Context {
    pub fn new(
        config: ServerConfig,
        data_dir: PathBuf,
        domain: Domain,
        bus: bus::Bus,
        streams: Vec<(&'static str, Arc<crate::stream::StreamLog>)>,
    ) -> Self {
        let rate_limiter = RateLimiter::new(
            config.rate_limit.requests_per_second,
            config.rate_limit.burst,
        );
        Context {
            config,
            data_dir,
            domain,
            bus,
            streams,
            rate_limiter,
            metrics: Metrics::default(),
            started: Instant::now(),
            grpc_serving: AtomicBool::new(false),
        }
    }

    /// The request chain of contract §4 up to the role check, which each domain function makes
    /// itself: the bearer key must resolve to a principal, then pass the key's rate limit.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal> {
        let key = auth::bearer_token(authorization)?;
        let principal = auth::authenticate(self.domain.store.as_ref(), key).await?;
        self.rate_limiter.check(&principal.id)?;
        Ok(principal)
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
