//! The domain: what every domain function receives first, built once and whole at start.
//!
//! Start-up order (server::cmd): store → the master key, decoded and checked against the store
//! once ([`Unlocked`]) → CA → stream logs → listeners bound → broker → the server's bus client
//! → [`Domain::start`] → bus subscribers → REST and gRPC serve. `Domain::start` returns a
//! finished `Arc<Domain>`: nothing in it is set later (no late-bound bus client, publisher
//! callback or swapped-in part), so a domain function can never meet a half-built domain.
//!
//! Transports (REST, gRPC, bus) hold an `Arc<Domain>`; they authenticate with
//! [`Domain::authenticate`] and call domain functions with the `Principal` it returns. REST
//! and gRPC check the caller's role against `auth::access` first, before they read the
//! request, so a caller without the role learns nothing from its input's errors; every domain
//! function checks it again (`Principal::require`), so a transport that forgot cannot skip
//! it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::audit::Auditor;
use crate::auth::{self, Admission, InFlight, KeyLimits, Principal, RateLimiter};
use crate::config::ServerConfig;
use crate::events::Events;
use crate::identity::Keys;
use crate::store::Store;
use crate::stream::{Stream, StreamLog};
use crate::Result;

pub struct Domain {
    pub store: Arc<dyn Store>,
    /// The one writer of audit rows.
    pub auditor: Auditor,
    /// The one emitter of events, with the live fan-out on the bus.
    pub events: Arc<Events>,
    /// The secrets engine: master key in force, caches and backends.
    pub secrets: crate::secrets::Secrets,
    /// Agents' liveness, jobs waiting for answers, and the bus client commands go out on.
    pub fleet: crate::fleet::Fleet,
    /// This server's place in the cluster: membership, leadership, agent ownership (the one
    /// member, leader and owner of everything outside cluster mode).
    pub cluster: Arc<crate::cluster::Cluster>,
    /// The file service (`svc-files`, and the state plans too large for a command).
    pub files: Arc<crate::files::Files>,
    /// Outbound webhooks: settings, the HTTP client, the delivery workers.
    pub webhooks: crate::webhooks::Webhooks,
    /// The runbooks loaded from runbook_dir (reloaded on SIGHUP).
    pub runbooks: crate::runbooks::Runbooks,
    /// The server secrets identity needs (hmacsecret; the master key follows `secrets`).
    keys: Keys,
    /// Per-key token buckets, applied to every authenticated request on every transport,
    /// and per-key requests in progress (`rate_limit.max_in_flight`), taken by
    /// [`Domain::admit`].
    limits: KeyLimits,
    /// API keys already verified (`auth::cache`): on for SQLite only.
    key_cache: auth::KeyCache,
}

/// The parts of the domain built from their own configuration alone.
struct Parts {
    fleet: crate::fleet::Fleet,
    files: Arc<crate::files::Files>,
    webhooks: crate::webhooks::Webhooks,
    runbooks: crate::runbooks::Runbooks,
}

/// The store, open and migrated, and the keys decoded from the configuration whose master key
/// that store accepted (`secrets::verify_master_key`): the server decodes and checks them once,
/// before anything sealed is opened, and the domain takes them as they are.
pub struct Unlocked {
    pub store: Arc<dyn Store>,
    pub keys: Keys,
}

/// What the domain keeps beside the store: the durable streams it writes and the file
/// service's objects.
pub struct Logs {
    pub events: Arc<dyn Stream>,
    /// The copy of every audit row (`audit/commit.rs`).
    pub audit: Arc<dyn Stream>,
    /// Local disk, or JetStream in cluster mode (`server::files::object_store`).
    pub files: Arc<dyn crate::files::ObjectStore>,
}

impl Domain {
    /// Builds the whole domain over an open store whose master key was checked, its logs and
    /// the server's bus client: unseals secrets with that key (the server made or opened the
    /// embedded CA with it already) and loads the agent registry. `stopping` flips when the
    /// server stops, ending live streams. With `broker` (the embedded one), stored events are
    /// fanned out into it in process rather than through `bus`.
    pub async fn start(
        config: &ServerConfig,
        unlocked: Unlocked,
        logs: Logs,
        bus: async_nats::Client,
        broker: Option<crate::bus::broker::LocalPublisher>,
        cluster: Arc<crate::cluster::Cluster>,
        stopping: watch::Receiver<bool>,
    ) -> Result<Arc<Domain>> {
        let Unlocked { store, keys } = unlocked;
        let events = match broker {
            Some(broker) => Events::new(logs.events, stopping, None).with_broker(broker),
            None => Events::new(logs.events, stopping, Some(bus.clone())),
        };
        let events = Arc::new(events);
        // The file service's chunks fit the bus the server is on: the embedded broker's
        // max_payload, or, on an external cluster, the one its INFO announces.
        let files = {
            let bus = bus.clone();
            crate::files::Files::new(logs.files, config.files.clone())
                .with_max_payload(move || bus.server_info().max_payload as u64)
        };
        let mut domain = Domain::assemble(
            store,
            config.policy_dir.clone(),
            events,
            Some(logs.audit),
            Parts {
                fleet: crate::fleet::Fleet::new(
                    config.agents.heartbeat_timeout.0,
                    config.agents.command_key_grace.0,
                    Some(bus),
                )
                .with_retention(&config.jobs)
                .with_accept_unsigned(config.agents.accept_unsigned),
                files: Arc::new(files),
                webhooks: crate::webhooks::Webhooks::new(&config.webhooks)?,
                runbooks: crate::runbooks::Runbooks::load(config.runbook_dir.clone()),
            },
            keys,
            KeyLimits {
                rate: RateLimiter::new(
                    config.rate_limit.requests_per_second,
                    config.rate_limit.burst,
                ),
                in_flight: InFlight::new(config.rate_limit.max_in_flight),
            },
        );
        domain.cluster = cluster;
        crate::secrets::unlock(&domain, domain.keys.master_key(), &config.secrets).await;
        let agents = crate::fleet::load(&domain).await?;
        tracing::debug!(agents, "agent registry loaded");
        Ok(Arc::new(domain))
    }

    fn assemble(
        store: Arc<dyn Store>,
        policy_dir: std::path::PathBuf,
        events: Arc<Events>,
        audit_mirror: Option<Arc<dyn Stream>>,
        parts: Parts,
        keys: Keys,
        limits: KeyLimits,
    ) -> Self {
        let Parts {
            fleet,
            files,
            webhooks,
            runbooks,
        } = parts;
        let auditor = Auditor::new(store.clone(), policy_dir)
            .with_events(events.clone())
            .with_mirror(audit_mirror);
        // Only a store no one else writes may be cached (see auth::cache).
        let key_cache = auth::KeyCache::new(store.driver() == "sqlite");
        Domain {
            store,
            key_cache,
            auditor,
            events,
            secrets: Default::default(),
            fleet,
            // The one server; `start` puts the real membership in before sharing the domain.
            cluster: crate::cluster::Cluster::single("local", ""),
            files,
            webhooks,
            runbooks,
            keys,
            limits,
        }
    }

    /// A domain over `store` with its events log under `dir/jetstream/events` and policies
    /// from `dir/policies`: no bus, no audit mirror, secrets sealed until `secrets::start`.
    /// For unit tests and offline tools.
    pub fn in_dir(store: Arc<dyn Store>, dir: &std::path::Path) -> Result<Self> {
        let log = StreamLog::open(&dir.join("jetstream/events"), Default::default())?;
        // The sender is leaked on purpose: nothing here ever stops.
        let (stop, stopping) = watch::channel(false);
        std::mem::forget(stop);
        let events = Arc::new(Events::new(log, stopping, None));
        Ok(Domain::assemble(
            store,
            dir.join("policies"),
            events,
            None,
            Parts {
                fleet: crate::fleet::Fleet::new(
                    Duration::from_secs(30),
                    crate::config::AgentsConfig::default().command_key_grace.0,
                    None,
                ),
                files: Arc::new(crate::files::Files::new(
                    Arc::new(crate::files::local::LocalStore::new(dir.join("files"))),
                    Default::default(),
                )),
                webhooks: crate::webhooks::Webhooks::new(&Default::default())?,
                runbooks: crate::runbooks::Runbooks::load(dir.join("runbooks")),
            },
            Keys::new([0; 32], b"test-hmac-secret".to_vec()),
            KeyLimits {
                rate: RateLimiter::new(1000.0, 1000),
                in_flight: InFlight::new(1000),
            },
        ))
    }

    /// The request chain of contract §4 up to the role check, which each domain function
    /// makes itself: the bearer key must resolve to a principal (through the verified-key
    /// cache, which a delete empties before it returns), then pass the key's rate limit.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal> {
        let key = auth::bearer_token(authorization)?;
        let principal =
            auth::authenticate_cached(self.store.as_ref(), &self.key_cache, key).await?;
        // The transport's request span (server::request_span) names the caller from here on.
        tracing::Span::current().record("key_id", principal.id.as_str());
        self.limits.rate.check(&principal.id)?;
        Ok(principal)
    }

    /// [`Domain::authenticate`], then a slot among the key's `rate_limit.max_in_flight`
    /// requests in progress (429 past it), held until the returned admission is dropped:
    /// what a transport calls for a request whose handling can last (REST reads its body
    /// after this).
    pub async fn admit(&self, authorization: Option<&str>) -> Result<(Principal, Admission)> {
        let principal = self.authenticate(authorization).await?;
        let admission = self.limits.in_flight.admit(&principal.id)?;
        Ok((principal, admission))
    }

    /// Drops key `id`'s verified row (`auth::cache`): called after the store committed a
    /// delete or change of it and before that is answered.
    pub fn uncache_key(&self, id: &str) {
        self.key_cache.forget(id);
    }

    /// Drops a deleted key's token bucket.
    pub fn forget_key(&self, id: &str) {
        self.limits.rate.forget(id);
    }

    /// The identity keys in force: the master key follows a `rotate-master`, which the
    /// configuration file only learns at the next restart.
    pub fn identity_keys(&self) -> Keys {
        match self.secrets.current_master() {
            Some(master) => self.keys.with_master(master),
            None => self.keys.clone(),
        }
    }
}
