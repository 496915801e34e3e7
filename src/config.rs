//! Configuration: YAML files, the `SVC_` environment overlay, and validation (contract §2).
//!
//! Both daemons load the same way: parse the file into a YAML tree, lay the environment over
//! it, check every key against the tree of defaults (so every unknown key is reported at once,
//! named with its file or variable), then deserialize. serde_yaml is archived upstream, so
//! configuration goes through [`parse_yaml`] (`serde_yaml_ng`); state has its own
//! (`state/compile.rs`), and blueprints, modules, runbooks, svc-gitops, svc-bootstrap's seed
//! and svc-agent's bootstrap still call `serde_yaml_ng` themselves.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_yaml_ng::{Mapping, Value};

pub const DEFAULT_SERVER_CONFIG: &str = "/etc/svc/server.yaml";
pub const DEFAULT_AGENT_CONFIG: &str = "/etc/svc/agent.yaml";

/// Environment variables with the `SVC_` prefix that are not configuration keys (CLI settings
/// and one-shot bootstrap values); the overlay skips them instead of calling them unknown.
const NON_CONFIG_VARIABLES: &[&str] = &[
    "SVC_API_KEY",
    "SVC_SERVER",
    "SVC_HTTP_URL",
    "SVC_CA_FILE",
    "SVC_LOG",
    "SVC_BOOTSTRAP_API_KEY",
    "SVC_NATS_URL",
    "SVC_CLUSTER",
    "SVC_PRINCIPAL_ID",
    "SVC_PRINCIPAL_ROLE",
    "SVC_CONFIG",
    "SVC_BACKUP_PASSPHRASE",
    "SVC_BACKUP_BUCKET",
];

/// Parses YAML text into any deserializable type (configuration, policies, svc-secrets' files).
pub fn parse_yaml<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}

/// Serializes a value as YAML text.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, String> {
    serde_yaml_ng::to_string(value).map_err(|e| e.to_string())
}

/// A secret string: deserialized like a string, never printed by `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "[REDACTED]"
        })
    }
}

/// A duration written as `30s`, `5m`, `500ms` (or a plain number of seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&crate::clock::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Seconds(seconds) => Ok(ConfigDuration(Duration::from_secs(seconds))),
            Raw::Text(text) => crate::clock::parse_duration(&text)
                .map(ConfigDuration)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "invalid duration '{text}' (use e.g. 500ms, 30s, 5m, 24h)"
                    ))
                }),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// svc.db, jetstream/, files/, ca/, snapshots/ and the bootstrap key live here.
    pub data_dir: PathBuf,
    pub listen: ListenConfig,
    pub store: StoreConfig,
    pub bus: BusConfig,
    /// Derives agent bootstrap PSKs; changing it invalidates every PSK.
    pub hmacsecret: Secret,
    /// Base64 of 32 bytes; encrypts secrets and CA keys at rest.
    pub master_key: Secret,
    pub log_level: String,
    pub log_format: LogFormat,
    pub rate_limit: RateLimitConfig,
    pub agents: AgentsConfig,
    pub tls: TlsConfig,
    pub policy_dir: PathBuf,
    pub limits: LimitsConfig,
    /// Retention of the durable streams (events, audit mirror) under data_dir/jetstream/.
    pub streams: StreamsConfig,
    pub secrets: SecretsConfig,
    /// The file service (`svc-files`, docs/files.md).
    pub files: FilesConfig,
    /// Several servers sharing PostgreSQL and a NATS cluster (docs/cluster.md).
    pub cluster: ClusterConfig,
    /// Outbound webhooks (docs/webhooks.md).
    pub webhooks: WebhooksConfig,
    /// Runbooks (*.yaml), loaded at start and on SIGHUP (docs/runbooks.md).
    pub runbook_dir: PathBuf,
    /// Fleet jobs kept in the store for `svcctl job list|show` (docs/fleet.md, "Jobs").
    pub jobs: JobsConfig,
}

/// How many fleet jobs (exec, state, module runs) the store keeps, and for how long: both
/// bounds apply, whichever drops a job first; pruned when a job starts and every few minutes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// The newest jobs kept (with every agent's result); older ones are deleted.
    pub keep: u64,
    /// Jobs older than this are deleted.
    pub max_age: ConfigDuration,
    /// Each stored stdout and stderr (and each state diff) is cut at this many bytes; the
    /// live stream of a job that is watched is not.
    pub max_output_bytes: u64,
    /// A fan-out to at most this many agents emits each agent's routine events
    /// (command_dispatched, command_completed, state_apply_started, state_apply_succeeded);
    /// a larger one only job_started, job_finished and each agent's failures and drift
    /// (its stored results still hold every agent's outcome).
    pub per_agent_events: u64,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            keep: 1000,
            max_age: ConfigDuration(Duration::from_secs(30 * 86_400)),
            max_output_bytes: 64 * 1024,
            per_agent_events: 1000,
        }
    }
}

/// Outbound webhook delivery (docs/webhooks.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Allow URLs that reach loopback and private addresses (10/8, 172.16/12, 192.168/16,
    /// fc00::/7, 100.64/10). Link-local and cloud metadata addresses stay refused.
    pub allow_private: bool,
    /// PEM bundle to trust for https:// receivers instead of the system's store.
    pub ca_file: String,
    /// One attempt's limit: connect, send, and the receiver's answer.
    pub timeout: ConfigDuration,
    /// The first retry's delay; each next one doubles (with jitter), up to an hour.
    pub retry_base: ConfigDuration,
    /// How long a failing delivery is retried before it is dead-lettered.
    pub max_retry_age: ConfigDuration,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            allow_private: false,
            ca_file: String::new(),
            timeout: ConfigDuration(Duration::from_secs(10)),
            retry_base: ConfigDuration(Duration::from_secs(5)),
            max_retry_age: ConfigDuration(Duration::from_secs(86_400)),
        }
    }
}

/// Cluster mode: this server is one member of several sharing `store.driver: postgres` and
/// `bus.external_urls`; membership and the leader's lease live in PostgreSQL, the streams in
/// JetStream on the NATS cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    pub enabled: bool,
    /// This member's name, unique in the cluster (default: the host name).
    pub member_id: String,
    /// host:port other members and operators reach this member's gRPC on (default:
    /// listen.grpc, which is only right when that is not a wildcard address).
    pub advertise: String,
    /// How often a member writes its heartbeat and the leader renews its lease.
    pub heartbeat_interval: ConfigDuration,
    /// A member whose heartbeat is older than this is down: its agents go to the others.
    pub member_timeout: ConfigDuration,
    /// How long a leader's lease lasts without renewal: after a leader dies, another takes
    /// over within about this long. The leader steps down on its own before it runs out.
    pub lease_ttl: ConfigDuration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            member_id: String::new(),
            advertise: String::new(),
            heartbeat_interval: ConfigDuration(Duration::from_secs(1)),
            member_timeout: ConfigDuration(Duration::from_secs(5)),
            lease_ttl: ConfigDuration(Duration::from_secs(5)),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamsConfig {
    /// Records older than this may be dropped (whole segments at a time).
    pub max_age: ConfigDuration,
    /// Oldest segments are dropped while a stream holds more than this many bytes.
    pub max_bytes: u64,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig {
            max_age: ConfigDuration(Duration::from_secs(30 * 86_400)),
            max_bytes: 1024 * 1024 * 1024,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("/var/lib/svc"),
            listen: ListenConfig::default(),
            store: StoreConfig::default(),
            bus: BusConfig::default(),
            hmacsecret: Secret::default(),
            master_key: Secret::default(),
            log_level: "info".into(),
            log_format: LogFormat::Text,
            rate_limit: RateLimitConfig::default(),
            agents: AgentsConfig::default(),
            tls: TlsConfig::default(),
            policy_dir: PathBuf::from("/etc/svc/policies"),
            limits: LimitsConfig::default(),
            streams: StreamsConfig::default(),
            secrets: SecretsConfig::default(),
            files: FilesConfig::default(),
            cluster: ClusterConfig::default(),
            webhooks: WebhooksConfig::default(),
            runbook_dir: PathBuf::from("/etc/svc/runbooks"),
            jobs: JobsConfig::default(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    pub http: String,
    pub grpc: String,
    pub bus: String,
    /// The embedded broker's monitoring endpoints (nats-server's `-m` port: /varz, /connz,
    /// ...); off unless set, as nats-server's is, so a second server on one host that names
    /// only the other three listeners does not collide on a port nobody configured. Set it
    /// to a loopback address: without `bus.monitor_auth` anyone who reaches it reads every
    /// connection's address.
    pub bus_monitor: String,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            http: "0.0.0.0:8080".into(),
            grpc: "0.0.0.0:5397".into(),
            bus: "0.0.0.0:4222".into(),
            bus_monitor: String::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreDriver {
    #[default]
    Sqlite,
    Postgres,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub driver: StoreDriver,
    /// postgres://user:password@host:port/db when the driver is postgres. `sslmode` and
    /// `sslrootcert` in its query string are read as the two settings below.
    pub url: Secret,
    /// TLS to PostgreSQL: `disable`, `prefer` (TLS when the server offers it, no certificate
    /// check), `require` (TLS, no certificate check), `verify-full` (TLS, the certificate
    /// chains to `ca_file` or the system store and names the host). Empty: from the URL, else
    /// `prefer`.
    pub sslmode: String,
    /// PEM CA bundle that signs the PostgreSQL server's certificate (`verify-full`).
    pub ca_file: String,
    /// Largest number of pooled connections to PostgreSQL this server holds.
    pub max_connections: usize,
    /// How long to wait for a PostgreSQL connection (new or from the pool) before failing.
    pub connect_timeout: ConfigDuration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            driver: StoreDriver::Sqlite,
            url: Secret::default(),
            sslmode: String::new(),
            ca_file: String::new(),
            max_connections: 16,
            connect_timeout: ConfigDuration(Duration::from_secs(10)),
        }
    }
}

/// `bus.external_auth`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExternalAuth {
    #[default]
    Token,
    Jwt,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BusConfig {
    /// Non-empty: use this NATS cluster instead of the embedded broker.
    pub external_urls: Vec<String>,
    /// Largest message payload the embedded broker accepts, in bytes; 0 is the default, as in
    /// nats-server (`BusConfig::effective_max_payload`). No lower bound, as nats-server has
    /// none: the file service and stored plans size their chunks to fit.
    pub max_payload: u64,
    /// Token the server presents to an external cluster (ignored for the embedded broker,
    /// where the server uses an internal credential made at start).
    pub external_token: Secret,
    /// How clients log in to the external cluster: `token` (external_token, or none; the
    /// cluster enforces nothing per agent) or `jwt` (nats-server's operator mode: every
    /// member, agent and enrolling host has a user JWT svc issues with exactly its subjects;
    /// each node includes `svc-cluster nats-config`'s output). Ignored for the embedded broker.
    pub external_auth: ExternalAuth,
    /// PEM certificate chain and key for the embedded broker's listener: both set, every
    /// client must use TLS. Not for `external_urls` (that cluster has its own settings).
    pub tls: TlsConfig,
    /// The embedded broker's name in INFO (`server_name`) and the monitoring endpoints.
    pub server_name: String,
    /// How often the embedded broker PINGs an idle client (nats-server's `ping_interval`).
    pub ping_interval: ConfigDuration,
    /// Unanswered PINGs tolerated; one more closes the client with `-ERR 'Stale Connection'`.
    pub ping_max: u32,
    /// Lame duck (SIGUSR2): bus clients are closed spread over this long (nats-server's
    /// `lame_duck_duration`)...
    pub lame_duck_duration: ConfigDuration,
    /// ...after first waiting this long for them to leave on their own.
    pub lame_duck_grace_period: ConfigDuration,
    /// Monitoring (`listen.bus_monitor`) answers only requests with an admin API key as a
    /// bearer token.
    pub monitor_auth: bool,
    /// Client connections the embedded broker holds at most (agents included); past it a
    /// client gets `-ERR 'maximum connections exceeded'`. Fitted into the open-file limit
    /// at start with the REST and gRPC caps (`server::fds`).
    pub max_connections: usize,
    /// New bus connections the embedded broker takes through TLS handshake and login (the
    /// agent's certificate and signature checks) at once; the rest wait up to the 2 s login
    /// deadline, then are closed and retry with their backoff. Bounds what a reconnect storm
    /// puts on the runtime REST and gRPC share. 0: no bound.
    pub max_concurrent_logins: usize,
    /// Bytes the embedded broker may hold queued for all clients together. Past it, the
    /// clients with the most bytes queued (those not reading) are closed as slow consumers.
    pub max_pending_total: u64,
    /// Messages per second one credential (an API key, or one agent) may publish on the
    /// embedded broker, all its connections together. Past it (after `publish_burst_per_key`)
    /// the broker reads that credential's connections more slowly: its publishers wait in
    /// their own socket, nothing is dropped, and other credentials are not slowed.
    /// 0: no rate.
    pub publish_rate_per_key: f64,
    /// Messages a credential may publish at once before `publish_rate_per_key` applies.
    pub publish_burst_per_key: u32,
    /// Bytes queued to one credential's connections together. Past it, that credential's
    /// connections that read slowest are closed as slow consumers; other clients' buffers
    /// are not touched. 0: a quarter of `max_pending_total`.
    pub max_pending_per_key: u64,
}

impl BusConfig {
    /// `max_pending_per_key`, with 0 read as a quarter of `max_pending_total`.
    pub fn effective_max_pending_per_key(&self) -> u64 {
        match self.max_pending_per_key {
            0 => (self.max_pending_total / 4).max(1),
            max => max,
        }
    }

    /// What is wrong with the per-key limits, each problem naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.publish_rate_per_key.is_finite() || self.publish_rate_per_key < 0.0 {
            problems.push(
                "bus.publish_rate_per_key must be a number of messages per second, 0 or more \
                 (0: no rate; default 50000)"
                    .into(),
            );
        }
        if self.publish_rate_per_key > 0.0 && self.publish_burst_per_key == 0 {
            problems.push(
                "bus.publish_burst_per_key must be at least 1 while bus.publish_rate_per_key \
                 is set (default 100000)"
                    .into(),
            );
        }
        problems
    }

    /// `max_payload`, with 0 read as the default 1 MiB (nats-server's reading of 0).
    pub fn effective_max_payload(&self) -> u64 {
        match self.max_payload {
            0 => BusConfig::default().max_payload,
            max => max,
        }
    }
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            external_urls: Vec::new(),
            max_payload: 1024 * 1024,
            external_token: Secret::default(),
            external_auth: ExternalAuth::Token,
            tls: TlsConfig::default(),
            server_name: "svc".into(),
            ping_interval: ConfigDuration(Duration::from_secs(120)),
            ping_max: 2,
            lame_duck_duration: ConfigDuration(Duration::from_secs(30)),
            lame_duck_grace_period: ConfigDuration(Duration::from_secs(10)),
            monitor_auth: false,
            max_connections: 65536,
            max_concurrent_logins: 64,
            max_pending_total: 64 * 1024 * 1024,
            publish_rate_per_key: 50_000.0,
            publish_burst_per_key: 100_000,
            max_pending_per_key: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Sustained requests per second per API key.
    pub requests_per_second: f64,
    /// Requests a key may make at once before the sustained rate applies.
    pub burst: u32,
    /// REST and gRPC requests one key may have in progress at once (together); past it a
    /// request gets 429 (REST) or RESOURCE_EXHAUSTED (gRPC).
    pub max_in_flight: usize,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            requests_per_second: 50.0,
            burst: 100,
            max_in_flight: 16,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsConfig {
    pub heartbeat_timeout: ConfigDuration,
    /// How long an agent's NATS user JWT is valid (`bus.external_auth: jwt`). Agents renew at
    /// half of it; a removed or re-enrolled agent's old JWT stops connecting within it.
    pub bus_jwt_ttl: ConfigDuration,
    /// After `svc-identity command-key rotate`, how long agents still accept commands signed
    /// with the previous key before the server retires it: agents offline for longer must
    /// bootstrap again.
    pub command_key_grace: ConfigDuration,
    /// Whether results and heartbeats of agents with no public key on record (enrolled before
    /// agents signed them, or by an svc-agent that does not) are accepted unsigned. An agent
    /// with a key on record must sign whatever this says. false once every agent has been
    /// bootstrapped again by a signing svc-agent.
    pub accept_unsigned: bool,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            heartbeat_timeout: ConfigDuration(Duration::from_secs(30)),
            bus_jwt_ttl: ConfigDuration(Duration::from_secs(24 * 3600)),
            command_key_grace: ConfigDuration(Duration::from_secs(7 * 24 * 3600)),
            accept_unsigned: true,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest REST request body, in bytes; larger bodies get 413.
    pub max_request_body: u64,
    /// Open connections each of the REST and gRPC listeners accepts; past it a new connection
    /// is closed at once (REST with a 503). The bus has its own cap in the broker.
    pub max_connections: usize,
    /// Open connections one source address may hold on each of the REST and gRPC listeners,
    /// so one client that keeps reopening cannot fill them for everyone. 0 (the default): a
    /// quarter of the listener's cap (after it is fitted to the open-file limit), at least 1.
    /// Not on the bus, where many agents may share one NAT address.
    pub max_connections_per_address: usize,
    /// Longest time a REST client may take to send a whole request body; past it the
    /// request gets 408 and the connection is closed.
    pub body_timeout: ConfigDuration,
    /// Slowest a REST request body may arrive, in bytes per second: the body must be whole
    /// by 5 s (`server::http::BODY_RATE_GRACE`) plus one second per `min_body_rate` bytes
    /// received so far (and by `body_timeout` in any case); slower gets 408. 0: no floor.
    pub min_body_rate: u64,
    /// How long a REST connection may go without a complete request header: from connecting,
    /// and between requests on a keep-alive connection. Past it the connection is closed.
    pub idle_timeout: ConfigDuration,
    /// How long a new REST or gRPC connection has to send its first byte and finish its TLS
    /// handshake (with `tls`); past it the connection is closed unanswered.
    pub handshake_timeout: ConfigDuration,
    /// Concurrent gRPC streams (calls) one connection may have open; more are refused by
    /// HTTP/2 flow control (the client waits or fails with RESOURCE_EXHAUSTED).
    pub max_grpc_streams: u32,
    /// How often the server pings an idle gRPC connection, and how long it waits for the
    /// answer before closing it.
    pub grpc_keepalive: ConfigDuration,
    pub grpc_keepalive_timeout: ConfigDuration,
    /// How long a server stream (event subscribe and replay, exec and state results, audit
    /// export, backup) may find its client reading nothing while it has a message to send;
    /// past it the stream's connection is closed (`server::grpc::relay`).
    pub grpc_stream_stall: ConfigDuration,
}

impl LimitsConfig {
    /// `max_connections_per_address` for a listener whose cap is `cap`.
    pub fn per_address(&self, cap: usize) -> usize {
        match self.max_connections_per_address {
            0 => (cap / 4).max(1),
            set => set.min(cap),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_body: 1024 * 1024,
            max_connections: 4096,
            max_connections_per_address: 0,
            body_timeout: ConfigDuration(Duration::from_secs(30)),
            min_body_rate: 1024,
            idle_timeout: ConfigDuration(Duration::from_secs(10)),
            handshake_timeout: ConfigDuration(Duration::from_secs(10)),
            max_grpc_streams: 256,
            grpc_keepalive: ConfigDuration(Duration::from_secs(60)),
            grpc_keepalive_timeout: ConfigDuration(Duration::from_secs(20)),
            grpc_stream_stall: ConfigDuration(Duration::from_secs(30)),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub agent: AgentSection,
    pub nats: NatsSection,
    /// Which modules the agent runs (`svc-module run --target`): `require_signature` and
    /// `trusted_keys`, as in svc-module's own configuration.
    pub modules: TrustPolicy,
}

/// Which module ZIPs may run: `modules:` of the agent's configuration (what modules sent by
/// `run --target` must be signed by) and of svc-module's own configuration file
/// ([`TrustPolicy::load`]). The check itself is `modules::sign`'s.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustPolicy {
    /// Refuse modules without a valid signature by one of `trusted_keys`.
    #[serde(default)]
    pub require_signature: bool,
    /// Public keys (base64), or paths of files holding one.
    #[serde(default)]
    pub trusted_keys: Vec<String>,
}

impl TrustPolicy {
    /// `modules:` of the module configuration: `path` (`--config`), else env
    /// SVC_MODULES_CONFIG, else /etc/svc/modules.yaml when it exists (the default policy when
    /// it does not).
    pub fn load(path: Option<&Path>) -> crate::Result<TrustPolicy> {
        #[derive(Deserialize)]
        struct ModulesFile {
            #[serde(default)]
            modules: TrustPolicy,
        }
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => match std::env::var_os("SVC_MODULES_CONFIG").filter(|v| !v.is_empty()) {
                Some(p) => (PathBuf::from(p), true),
                None => (PathBuf::from("/etc/svc/modules.yaml"), false),
            },
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(_) if !explicit => return Ok(TrustPolicy::default()),
            Err(e) => {
                return Err(crate::Error::NotFound(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        };
        let file: ModulesFile = parse_yaml(&text)
            .map_err(|e| crate::Error::Invalid(format!("{}: {e}", path.display())))?;
        Ok(file.modules)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub heartbeat_interval: ConfigDuration,
    pub state_dir: PathBuf,
    /// Where commands run: `inline` (in the daemon, as root or not) or the path of the
    /// privileged executor's unix socket (`svc-agent executor`, docs/fleet.md).
    pub executor: String,
    /// The server's command-signing certificate, written by bootstrap; empty:
    /// `<state_dir>/command-key.pem`. With a socket executor it must be a root-owned file the
    /// unprivileged daemon cannot change (e.g. /etc/svc/command-key.pem).
    pub command_key: String,
}

impl AgentSection {
    /// The command-signing certificate's path (see `command_key`).
    pub fn command_key_path(&self) -> PathBuf {
        if self.command_key.is_empty() {
            self.state_dir.join("command-key.pem")
        } else {
            PathBuf::from(&self.command_key)
        }
    }
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            id: String::new(),
            labels: BTreeMap::new(),
            heartbeat_interval: ConfigDuration(Duration::from_secs(10)),
            state_dir: PathBuf::from("/var/lib/svc-agent"),
            executor: "inline".into(),
            command_key: String::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSection {
    pub urls: Vec<String>,
    /// PEM CA bundle that issued the bus's TLS certificate (`bus.tls` on the server); empty:
    /// the system's CA store. Set, or a `tls://` URL, makes TLS required.
    pub ca_file: String,
}

impl Default for NatsSection {
    fn default() -> Self {
        NatsSection {
            urls: vec!["nats://127.0.0.1:4222".into()],
            ca_file: String::new(),
        }
    }
}

/// The secrets engine's backends (contract §11).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    pub postgres: PostgresSecretsConfig,
}

/// The PostgreSQL dynamic-credential backend; empty `url` turns it off.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresSecretsConfig {
    /// Admin connection URL (a role with CREATEROLE), e.g. postgres://vault@127.0.0.1/postgres.
    pub url: Secret,
    /// Lease length when `creds` gives no --ttl, and the renew increment by default.
    pub default_ttl: ConfigDuration,
    /// No lease outlives this from its creation, however often it is renewed.
    pub max_ttl: ConfigDuration,
}

impl Default for PostgresSecretsConfig {
    fn default() -> Self {
        PostgresSecretsConfig {
            url: Secret::default(),
            default_ttl: ConfigDuration(Duration::from_secs(3600)),
            max_ttl: ConfigDuration(Duration::from_secs(24 * 3600)),
        }
    }
}

/// The file service's limits (docs/files.md); objects live under `data_dir/files/<cluster>/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Largest object, in bytes (default 5 GiB).
    pub max_object_size: u64,
    /// Bytes per chunk on the bus and on disk (default 256 KiB), at most: where the bus's
    /// `max_payload` (the embedded broker's, or an external cluster's from its INFO) leaves
    /// less room beside the headers, new objects get smaller chunks (`files::chunk_size_for`).
    pub chunk_size: u64,
    /// Bytes of committed objects one cluster may hold; 0: no quota.
    pub cluster_quota: u64,
    /// Which clusters a key may use, by key id or name (`{ci-reader: [staging]}`); a key not
    /// listed may use every cluster.
    pub key_clusters: std::collections::BTreeMap<String, Vec<String>>,
}

/// Bytes a file-service message keeps for its headers beside its body, at most (half of a
/// smaller `max_payload`: `files::body_capacity`).
pub const FILES_HEADER_ROOM: u64 = 4096;

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            max_object_size: 5 * 1024 * 1024 * 1024,
            chunk_size: 256 * 1024,
            cluster_quota: 0,
            key_clusters: Default::default(),
        }
    }
}

impl FilesConfig {
    /// What is wrong with these limits, each problem naming its key.
    /// A `bus.max_payload` too small for `chunk_size` is none: chunks are then sized to fit.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.chunk_size < 1024 {
            problems.push("files.chunk_size must be at least 1024 bytes (default 262144)".into());
        }
        if self.max_object_size == 0 {
            problems.push("files.max_object_size must be positive (default 5 GiB)".into());
        }
        problems
    }
}

/// Which keys of a config kind hold free-form maps (any key allowed below them), and which
/// top-level keys belong to the other daemon (their variables are skipped, not rejected).
struct Schema {
    free_form: &'static [&'static str],
    foreign_roots: &'static [&'static str],
}

const SERVER_SCHEMA: Schema = Schema {
    free_form: &["files.key_clusters"],
    foreign_roots: &["agent", "nats"],
};
const AGENT_SCHEMA: Schema = Schema {
    free_form: &["agent.labels"],
    foreign_roots: &[
        "data_dir",
        "listen",
        "store",
        "bus",
        "hmacsecret",
        "master_key",
        "log_level",
        "log_format",
        "rate_limit",
        "agents",
        "tls",
        "policy_dir",
        "limits",
        "streams",
        "secrets",
        "webhooks",
        "runbook_dir",
    ],
};

/// A loaded configuration and where it came from.
#[derive(Debug)]
pub struct Loaded<T> {
    pub config: T,
    /// The file read, or None when defaults were used because the default file is absent.
    pub file: Option<PathBuf>,
    /// The merged tree of what the file and environment set, to tell "set" from "default".
    explicit: Value,
}

impl<T> Loaded<T> {
    /// Whether the dotted key was given by the file or the environment.
    pub fn is_set(&self, dotted: &str) -> bool {
        let mut node = &self.explicit;
        for part in dotted.split('.') {
            match node.get(part) {
                Some(child) => node = child,
                None => return false,
            }
        }
        true
    }
}

/// Every problem found in a configuration, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

pub fn load_server(
    path: Option<&Path>,
    env: &[(String, String)],
) -> Result<Loaded<ServerConfig>, ConfigErrors> {
    let loaded: Loaded<ServerConfig> =
        load(path, Path::new(DEFAULT_SERVER_CONFIG), env, &SERVER_SCHEMA)?;
    // The file service's and the job history's limits are checked here so --check-config
    // reports them too.
    let mut problems = loaded.config.files.problems();
    problems.extend(loaded.config.bus.problems());
    if loaded.config.jobs.keep == 0 || loaded.config.jobs.max_age.0.is_zero() {
        problems.push("jobs.keep and jobs.max_age must be positive (default 1000 and 30d)".into());
    }
    if !problems.is_empty() {
        return Err(ConfigErrors(problems));
    }
    Ok(loaded)
}

pub fn load_agent(
    path: Option<&Path>,
    env: &[(String, String)],
) -> Result<Loaded<AgentConfig>, ConfigErrors> {
    load(path, Path::new(DEFAULT_AGENT_CONFIG), env, &AGENT_SCHEMA)
}

/// The process environment as pairs, for the loaders.
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn load<T: DeserializeOwned + Serialize + Default>(
    path: Option<&Path>,
    default_path: &Path,
    env: &[(String, String)],
    schema: &Schema,
) -> Result<Loaded<T>, ConfigErrors> {
    let defaults = serde_yaml_ng::to_value(T::default())
        .map_err(|e| ConfigErrors(vec![format!("internal: {e}")]))?;
    let (file, text) = match path {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (Some(path.to_path_buf()), text),
            Err(e) => {
                return Err(ConfigErrors(vec![format!(
                    "cannot read config file {}: {e}",
                    path.display()
                )]))
            }
        },
        None => match std::fs::read_to_string(default_path) {
            Ok(text) => (Some(default_path.to_path_buf()), text),
            // A missing default file means "all defaults" (contract §2).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, String::new()),
            Err(e) => {
                return Err(ConfigErrors(vec![format!(
                    "cannot read config file {}: {e}",
                    default_path.display()
                )]))
            }
        },
    };
    let file_name = file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "defaults".into());
    let mut problems = Vec::new();
    let mut tree = if text.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        match parse_yaml::<Value>(&text) {
            Ok(Value::Mapping(map)) => Value::Mapping(map),
            Ok(Value::Null) => Value::Mapping(Mapping::new()),
            Ok(_) => {
                return Err(ConfigErrors(vec![format!(
                    "{file_name}: the top level must be a mapping of keys"
                )]))
            }
            Err(e) => return Err(ConfigErrors(vec![format!("{file_name}: {e}")])),
        }
    };
    let mut unknown = Vec::new();
    collect_unknown_keys(&tree, &defaults, "", schema, &mut unknown);
    for key in unknown {
        problems.push(format!("{file_name}: unknown key '{key}'"));
    }
    overlay_environment(&mut tree, &defaults, env, schema, &mut problems);
    if !problems.is_empty() {
        return Err(ConfigErrors(problems));
    }
    let config: T = serde_path_to_error::deserialize(tree.clone()).map_err(|e| {
        let path = e.path().to_string();
        ConfigErrors(vec![format!(
            "{file_name}: key '{path}': {}",
            e.into_inner()
        )])
    })?;
    Ok(Loaded {
        config,
        file,
        explicit: tree,
    })
}

fn collect_unknown_keys(
    user: &Value,
    defaults: &Value,
    prefix: &str,
    schema: &Schema,
    out: &mut Vec<String>,
) {
    let (Value::Mapping(user), Value::Mapping(defaults)) = (user, defaults) else {
        return;
    };
    for (key, value) in user {
        let name = match key {
            Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        let dotted = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match defaults.get(key) {
            None => out.push(dotted),
            Some(default) if !schema.free_form.contains(&dotted.as_str()) => {
                collect_unknown_keys(value, default, &dotted, schema, out)
            }
            Some(_) => {}
        }
    }
}

/// Lays `SVC_A__B=value` over the tree as `a.b: value`, typed like the default at that key:
/// lists split on commas, strings stay strings, numbers and booleans parse as YAML scalars.
fn overlay_environment(
    tree: &mut Value,
    defaults: &Value,
    env: &[(String, String)],
    schema: &Schema,
    problems: &mut Vec<String>,
) {
    let mut variables: Vec<&(String, String)> = env
        .iter()
        .filter(|(name, _)| name.starts_with("SVC_"))
        .filter(|(name, _)| !NON_CONFIG_VARIABLES.contains(&name.as_str()))
        .collect();
    variables.sort();
    for (name, raw) in variables {
        let path: Vec<String> = name["SVC_".len()..]
            .split("__")
            .map(|part| part.to_ascii_lowercase())
            .collect();
        if path.iter().any(|part| part.is_empty()) {
            problems.push(format!("environment {name}: malformed key"));
            continue;
        }
        if schema.foreign_roots.contains(&path[0].as_str()) {
            continue;
        }
        let dotted = path.join(".");
        let mut default = Some(defaults);
        let mut is_free_form = false;
        for (i, part) in path.iter().enumerate() {
            if schema.free_form.contains(&path[..i].join(".").as_str()) && i > 0 {
                is_free_form = true;
                break;
            }
            default = default.and_then(|node| node.get(part.as_str()));
        }
        let value = match (is_free_form, default) {
            (true, _) | (false, Some(Value::String(_))) => Value::String(raw.clone()),
            (false, Some(Value::Sequence(_))) => Value::Sequence(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            ),
            (false, Some(Value::Mapping(_))) => {
                problems.push(format!(
                    "environment {name}: '{dotted}' is a section; set one of its keys"
                ));
                continue;
            }
            (false, Some(_)) => match parse_yaml::<Value>(raw) {
                Ok(value) => value,
                Err(_) => Value::String(raw.clone()),
            },
            (false, None) => {
                // Cargo passes a build script's `rustc-env` values to the programs it runs, so a
                // stray variable may come from a build as well as from a typo.
                problems.push(format!(
                    "environment {name}: unknown key '{dotted}' (unset {name} or fix its name)"
                ));
                continue;
            }
        };
        set_path(tree, &path, value);
    }
}

fn set_path(tree: &mut Value, path: &[String], value: Value) {
    let mut node = tree;
    for part in &path[..path.len() - 1] {
        if !matches!(node, Value::Mapping(_)) {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = node else {
            unreachable!("made a mapping just above")
        };
        node = map
            .entry(Value::String(part.clone()))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    if !matches!(node, Value::Mapping(_)) {
        *node = Value::Mapping(Mapping::new());
    }
    if let Value::Mapping(map) = node {
        map.insert(Value::String(path[path.len() - 1].clone()), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn write(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn environment_overlays_file() {
        let file = write("listen:\n  http: 1.2.3.4:80\nrate_limit:\n  burst: 5\n");
        let loaded = load_server(
            Some(file.path()),
            &env(&[
                ("SVC_LISTEN__GRPC", "127.0.0.1:1"),
                ("SVC_RATE_LIMIT__BURST", "7"),
                ("SVC_BUS__EXTERNAL_URLS", "nats://a:4222, nats://b:4222"),
                ("SVC_BUS__TLS__CERT", "/etc/svc/bus.pem"),
                ("SVC_HMACSECRET", "12345"),
                ("SVC_API_KEY", "ignored"),
                ("SVC_AGENT__ID", "belongs-to-the-agent"),
            ]),
        )
        .unwrap();
        let config = loaded.config;
        assert_eq!(config.listen.http, "1.2.3.4:80");
        assert_eq!(config.listen.grpc, "127.0.0.1:1");
        assert_eq!(config.rate_limit.burst, 7);
        assert_eq!(config.bus.external_urls, ["nats://a:4222", "nats://b:4222"]);
        assert_eq!(config.bus.tls.cert, "/etc/svc/bus.pem");
        assert_eq!(config.hmacsecret.expose(), "12345");
        assert!(loaded.explicit.get("listen").is_some());
    }

    #[test]
    fn unknown_keys_are_all_named_with_their_source() {
        let file = write("listen:\n  htp: x\nbogus: 1\n");
        let errors = load_server(Some(file.path()), &env(&[("SVC_LISTEN__NOPE", "1")]))
            .unwrap_err()
            .0;
        let name = file.path().display().to_string();
        assert!(
            errors.contains(&format!("{name}: unknown key 'listen.htp'")),
            "{errors:?}"
        );
        assert!(
            errors.contains(&format!("{name}: unknown key 'bogus'")),
            "{errors:?}"
        );
        assert!(
            errors.contains(
                &"environment SVC_LISTEN__NOPE: unknown key 'listen.nope' (unset SVC_LISTEN__NOPE or fix its name)"
                    .to_string()
            ),
            "{errors:?}"
        );
    }

    #[test]
    fn type_errors_name_the_key() {
        let file = write("rate_limit:\n  burst: lots\n");
        let errors = load_server(Some(file.path()), &[]).unwrap_err().0;
        assert!(errors[0].contains("rate_limit.burst"), "{errors:?}");
        let file = write("agents:\n  heartbeat_timeout: soon\n");
        let errors = load_server(Some(file.path()), &[]).unwrap_err().0;
        assert!(errors[0].contains("invalid duration 'soon'"), "{errors:?}");
    }

    #[test]
    fn missing_named_file_is_an_error() {
        let errors = load_server(Some(Path::new("/nonexistent/svc.yaml")), &[]).unwrap_err();
        assert!(errors.0[0].contains("/nonexistent/svc.yaml"));
    }

    #[test]
    fn files_limits_are_checked_and_key_clusters_is_free_form() {
        let load = |yaml: &str| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("server.yaml");
            std::fs::write(&path, yaml).unwrap();
            load_server(Some(&path), &[])
        };
        let loaded = load("files:\n  key_clusters:\n    ci-reader: [staging]\n").unwrap();
        assert_eq!(loaded.config.files.key_clusters["ci-reader"], ["staging"]);
        assert_eq!(loaded.config.files.chunk_size, 256 * 1024);
        let errors = load("files:\n  chunk_size: 100\n").unwrap_err();
        assert!(errors.to_string().contains("files.chunk_size"), "{errors}");
        // A chunk larger than a message is no error: chunks are sized to fit the bus.
        let small = load("bus:\n  max_payload: 1024\nfiles:\n  chunk_size: 1048576\n").unwrap();
        assert_eq!(small.config.bus.effective_max_payload(), 1024);
        // 0 is nats-server's default, 1 MiB.
        let zero = load("bus:\n  max_payload: 0\n").unwrap();
        assert_eq!(zero.config.bus.effective_max_payload(), 1024 * 1024);
        let errors = load("files:\n  chunk_sise: 1\n").unwrap_err();
        assert!(errors.to_string().contains("files.chunk_sise"), "{errors}");
    }

    #[test]
    fn agent_labels_are_free_form() {
        let file = write("agent:\n  id: web-01\n  labels: { role: web }\n");
        let loaded = load_agent(
            Some(file.path()),
            &env(&[
                ("SVC_AGENT__LABELS__ENV", "prod"),
                ("SVC_NATS__CA_FILE", "/etc/svc/bus-ca.pem"),
                ("SVC_LISTEN__HTTP", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(loaded.config.agent.labels["role"], "web");
        assert_eq!(loaded.config.agent.labels["env"], "prod");
        assert_eq!(loaded.config.nats.ca_file, "/etc/svc/bus-ca.pem");
        assert_eq!(
            loaded.config.agent.heartbeat_interval.0,
            Duration::from_secs(10)
        );
    }

    #[test]
    fn secrets_do_not_debug_print() {
        let text = format!("{:?}", Secret("hunter2".into()));
        assert!(!text.contains("hunter2"));
    }
}
