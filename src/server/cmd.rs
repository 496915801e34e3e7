//! The `svc-server` command: flags, `--check-config` (the checks are `crate::preflight`'s),
//! `--dev`, logging and the run loop.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use argh::FromArgs;
use base64::Engine;

use super::{BoundAddrs, Context, LISTEN_ADDRS_FILE, SHUTDOWN_GRACE};
use crate::auth;
use crate::config::{self, ConfigErrors, Loaded, LogFormat, Secret, ServerConfig};
use crate::domain::Domain;
use crate::stream::{Stream, StreamConfig, StreamLog};
use crate::Result;

#[derive(FromArgs, argh::ArgsInfo)]
/// The svc control-plane daemon: REST (8080), gRPC (5397) and the message bus (4222).
#[argh(help_triggers("-h", "--help"))]
struct Args {
    /// configuration file (default /etc/svc/server.yaml; missing default = all defaults)
    #[argh(option)]
    config: Option<PathBuf>,
    /// development mode: generate hmacsecret and master_key into the data dir (mode 0600),
    /// listen on loopback, and use ./.svc-dev as the data dir unless one is configured
    #[argh(switch)]
    dev: bool,
    /// validate the configuration, list every problem, and exit (0 valid, 1 not)
    #[argh(switch)]
    check_config: bool,
    /// log level or filter (overrides log_level; SVC_LOG and RUST_LOG also work)
    #[argh(option, from_str_fn(crate::program::log_filter))]
    log_level: Option<String>,
    /// with the server stopped: mint a new admin API key into a 0600 file in the data dir
    /// (its path is printed, the key is not) and exit; audited at the next start
    #[argh(switch)]
    recover_admin: bool,
}

const DEV_DATA_DIR: &str = ".svc-dev";
/// How long after its start the server releases the start's code pages.
const START_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);
const DEV_SECRETS_FILE: &str = "dev-secrets.yaml";
const BOOTSTRAP_KEY_FILE: &str = "bootstrap-admin.key";
/// Admin keys minted by `--recover-admin` and not yet audited: one JSON object per line,
/// turned into audit rows (principal "server") at the next start, then removed.
const RECOVERIES_FILE: &str = "admin-recoveries.jsonl";

/// svc-server's argh definition: what help, completions and man pages read
/// (`cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

pub fn main(program: &str, args: Vec<String>) -> i32 {
    let args = match crate::program::parse_args::<Args>(program, &args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let loaded = match config::load_server(args.config.as_deref(), &config::process_env()) {
        Ok(loaded) => loaded,
        Err(errors) => return report_config_errors(program, &errors),
    };
    let mut server_config = match resolve(loaded, args.dev) {
        Ok(config) => config,
        Err(errors) => return report_config_errors(program, &errors),
    };
    if let Some(level) = args.log_level {
        server_config.log_level = level;
    }
    if args.check_config {
        let problems = crate::preflight::check_config(&server_config, args.dev);
        if problems.is_empty() {
            println!("{program}: configuration is valid");
            return 0;
        }
        return report_config_errors(program, &ConfigErrors(problems));
    }
    init_logging(&server_config);
    if args.recover_admin {
        return recover_admin(program, &server_config);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            notice(program, &format!("cannot start the async runtime: {e}"));
            return 1;
        }
    };
    match runtime.block_on(run(program, server_config, args.dev)) {
        Ok(()) => 0,
        Err(e) => {
            if !JSON_LOGS.load(Ordering::Relaxed) {
                eprintln!("{program}: {e}");
            }
            tracing::error!(error = %e, "server stopped with an error");
            1
        }
    }
}

fn report_config_errors(program: &str, errors: &ConfigErrors) -> i32 {
    for problem in &errors.0 {
        eprintln!("{program}: {problem}");
    }
    1
}

/// Applies `--dev` defaults to what was not set explicitly.
fn resolve(loaded: Loaded<ServerConfig>, dev: bool) -> Result<ServerConfig, ConfigErrors> {
    let mut server_config = loaded.config.clone();
    if dev {
        if !loaded.is_set("data_dir") {
            server_config.data_dir = PathBuf::from(DEV_DATA_DIR);
        }
        for (key, field) in [
            ("listen.http", &mut server_config.listen.http),
            ("listen.grpc", &mut server_config.listen.grpc),
            ("listen.bus", &mut server_config.listen.bus),
        ] {
            if !loaded.is_set(key) {
                if let Some((_, port)) = field.rsplit_once(':') {
                    *field = format!("127.0.0.1:{port}");
                }
            }
        }
    }
    Ok(server_config)
}

fn init_logging(config: &ServerConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("SVC_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| config.log_level.clone());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(crate::program::output::stderr_colour())
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Json => {
            JSON_LOGS.store(true, Ordering::Relaxed);
            builder.json().try_init()
        }
        LogFormat::Text => builder.try_init(),
    };
}

/// Set when the server logs JSON (`log_format: json`): then every line it writes is a log
/// record, notices for the operator included.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A line for the operator on stderr: `program: message` with text logs; a log record (info)
/// with JSON logs, so that every line the server writes parses as JSON.
fn notice(program: &str, message: &str) {
    if JSON_LOGS.load(Ordering::Relaxed) {
        tracing::info!("{message}");
    } else {
        eprintln!("{program}: {message}");
    }
}

/// Creates a directory (and parents) readable only by the owner.
fn create_private_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| crate::Error::Internal(format!("cannot create {}: {e}", path.display())))
}

/// In dev mode: loads the generated secrets from the data dir, or generates them (0600).
fn ensure_dev_secrets(program: &str, config: &mut ServerConfig) -> Result<()> {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct DevSecrets {
        hmacsecret: Secret,
        master_key: Secret,
    }
    if !config.hmacsecret.is_empty() && !config.master_key.is_empty() {
        return Ok(());
    }
    let path = config.data_dir.join(DEV_SECRETS_FILE);
    let secrets = match std::fs::read_to_string(&path) {
        Ok(text) => config::parse_yaml::<DevSecrets>(&text)
            .map_err(|e| crate::Error::Invalid(format!("{}: {e}", path.display())))?,
        Err(_) => {
            let mut key = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key);
            let secrets = DevSecrets {
                hmacsecret: Secret(crate::ids::random_base62(48)),
                master_key: Secret(base64::engine::general_purpose::STANDARD.encode(key)),
            };
            let text = config::to_yaml(&secrets).map_err(crate::Error::Internal)?;
            auth::write_private_file(&path, text.as_bytes())?;
            notice(
                program,
                &format!(
                    "dev mode: generated hmacsecret and master_key in {} (mode 0600)",
                    path.display()
                ),
            );
            secrets
        }
    };
    if config.hmacsecret.is_empty() {
        config.hmacsecret = secrets.hmacsecret;
    }
    if config.master_key.is_empty() {
        config.master_key = secrets.master_key;
    }
    Ok(())
}

/// `svc-server --recover-admin`: for when no admin key is left. Needs the server stopped (its
/// lock) and write access to the data dir; mints an admin key into a 0600 file there, prints
/// the file's path, and leaves a line in `admin-recoveries.jsonl` for the next start to audit.
fn recover_admin(program: &str, config: &ServerConfig) -> i32 {
    let data_dir = &config.data_dir;
    if !data_dir.join("svc.db").exists() && config.store.driver == config::StoreDriver::Sqlite {
        eprintln!(
            "{program}: no store in {}: start the server once (it creates the bootstrap admin key)",
            data_dir.display()
        );
        return 1;
    }
    let _lock = match crate::datadir::lock(data_dir) {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("{program}: {e}; stop it first");
            return 1;
        }
    };
    let runtime = match crate::program::runtime(program) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let now = crate::clock::now_rfc3339();
    // 2026-05-01T12:30:00.000Z → 2026-05-01T12-30-00Z: a name and a file name.
    let stamp = format!("{}Z", now[..19].replace(':', "-"));
    let name = format!("recovered-admin-{stamp}");
    let key_file = data_dir.join(format!("{name}.key"));
    let result = runtime.block_on(async {
        let store = crate::store::open(&config.store, data_dir).await?;
        let keys = crate::identity::Keys::from_config(config)?;
        let at_rest = unlock_at_rest(store.as_ref(), &keys).await?;
        let record = auth::recover_admin_key(store.as_ref(), &at_rest, &key_file, &name).await?;
        let line = serde_json::json!({
            "key_id": record.id, "name": record.name, "at": now,
            "file": key_file.display().to_string(),
            // SAFETY: getuid has no preconditions and cannot fail.
            "uid": unsafe { libc::getuid() },
        });
        append_line(&data_dir.join(RECOVERIES_FILE), &line.to_string())?;
        Ok::<_, crate::Error>(record)
    });
    match result {
        Ok(record) => {
            println!("{}", key_file.display());
            eprintln!(
                "{program}: new admin API key '{}' (id {}) written to {} (mode 0600); \
                 the next server start records it in the audit log",
                record.name,
                record.id,
                key_file.display()
            );
            0
        }
        Err(e) => {
            eprintln!("{program}: cannot recover an admin key: {e}");
            1
        }
    }
}

/// Appends one line to a 0600 file, synced.
fn append_line(path: &Path, line: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| crate::Error::Internal(format!("cannot write {}: {e}", path.display())))?;
    file.write_all(format!("{line}\n").as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// Turns the keys `--recover-admin` minted while the server was stopped into audit rows
/// (action `apikey.recover`, principal "server"), then removes the file. A row that cannot
/// be written leaves the file for the next start.
async fn audit_admin_recoveries(domain: &Domain, data_dir: &Path) {
    let path = data_dir.join(RECOVERIES_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let principal = auth::Principal::server();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let detail: serde_json::Value = match serde_json::from_str(line) {
            Ok(detail) => detail,
            Err(e) => {
                tracing::warn!(error = %e, file = %path.display(), "skipping an unreadable admin recovery line");
                continue;
            }
        };
        let id = detail["key_id"].as_str().unwrap_or_default().to_string();
        let action = crate::audit::Action::new("apikey.recover", "apikey", id.clone())
            .detail(detail.clone());
        if let Err(e) = domain.auditor.append(&principal, action, "success").await {
            tracing::error!(error = %e, "cannot audit an admin key recovery; kept for the next start");
            return;
        }
        tracing::warn!(key_id = %id, "an admin API key was minted with --recover-admin while the server was stopped");
        let payload = serde_json::json!({"id": id, "name": detail["name"], "role": "admin", "by": "svc-server --recover-admin"});
        domain
            .events
            .emit_system(crate::events::EventKind::ApikeyCreated, "server", payload)
            .await;
    }
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::error!(error = %e, file = %path.display(), "cannot remove the audited admin recoveries");
    }
}

/// Checks the configured master key against the store (a wrong one is refused, saying so)
/// and unwraps the store's at-rest key with it.
async fn unlock_at_rest(
    store: &dyn crate::store::Store,
    keys: &crate::identity::Keys,
) -> Result<crate::secrets::crypto::AeadKey> {
    crate::secrets::verify_master_key(store, keys.master_key()).await?;
    crate::secrets::at_rest::load(store, keys.master_key()).await
}

async fn run(program: &str, mut config: ServerConfig, dev: bool) -> Result<()> {
    let mut signals = StopSignals::install()?;
    create_private_dir(&config.data_dir)?;
    // Held until run returns (and by the kernel until the process ends): one server per data
    // dir, and `--recover-admin` only while none runs.
    let _lock = crate::datadir::lock(&config.data_dir)?;
    if dev {
        ensure_dev_secrets(program, &mut config)?;
    }
    let problems = crate::preflight::check_config(&config, dev);
    if !problems.is_empty() {
        return Err(crate::Error::Invalid(problems.join("; ")));
    }
    let tls = crate::tls::server_tls(&config.tls).map_err(crate::Error::Invalid)?;
    let data_dir = config.data_dir.clone();
    let _ = std::fs::remove_file(data_dir.join(LISTEN_ADDRS_FILE));
    let store = crate::store::open(&config.store, &data_dir).await?;

    // Start-up order: store (above) → master-key check → sealed rows → bootstrap key → CA →
    // stream logs → listeners bound → broker → the server's bus client → Domain::start → REST
    // and gRPC serve. The CA comes before the broker because bus.tls verifies agents'
    // certificates against its root; a wrong master_key is refused (with what to do) before
    // anything sealed is opened. The key is decoded here, once, and checked against the store
    // once; the domain gets these keys.
    let keys = crate::identity::Keys::from_config(&config)?;
    let at_rest = unlock_at_rest(store.as_ref(), &keys).await?;
    // Rows from before migration 0012 (or an older member's writes) are sealed before any
    // request is served.
    crate::secrets::at_rest::seal_stored(store.as_ref(), &at_rest).await?;

    let key_file = data_dir.join(BOOTSTRAP_KEY_FILE);
    let preset = std::env::var("SVC_BOOTSTRAP_API_KEY").ok();
    if let Some(id) =
        auth::ensure_bootstrap_key(store.as_ref(), &at_rest, &key_file, preset.as_deref()).await?
    {
        if preset.is_some() {
            tracing::info!(key_id = %id, "created bootstrap-admin key from SVC_BOOTSTRAP_API_KEY");
        } else {
            tracing::info!(key_id = %id, file = %key_file.display(), "created bootstrap-admin key (mode 0600)");
            notice(
                program,
                &format!("bootstrap admin API key written to {}", key_file.display()),
            );
        }
    }
    crate::identity::ensure_ca(store.as_ref(), &keys).await?;
    // JWT login on the external cluster: the keys are made now if `svc-cluster nats-config`
    // has not made them yet (the cluster then refuses everyone until its nodes include that
    // command's output).
    let nats_keys = if config.bus.external_auth == crate::config::ExternalAuth::Jwt {
        Some(Arc::new(
            crate::identity::nats::ensure(store.as_ref(), &keys)
                .await?
                .with_agent_ttl(config.agents.bus_jwt_ttl.0),
        ))
    } else {
        None
    };
    let keys = keys.with_nats(nats_keys.clone());

    let (stop_sender, stop) = tokio::sync::watch::channel(false);
    let jetstream = data_dir.join("jetstream");
    let stream_config = StreamConfig {
        max_age: Some(config.streams.max_age.0),
        max_bytes: Some(config.streams.max_bytes),
        ..StreamConfig::default()
    };
    // The local logs are opened (and recovered) before anything listens; in cluster mode the
    // streams are JetStream's on the NATS cluster, opened once the bus is connected.
    let local_logs = if config.cluster.enabled {
        None
    } else {
        let events: Arc<dyn Stream> =
            StreamLog::open(&jetstream.join("events"), stream_config.clone())?;
        let audit: Arc<dyn Stream> =
            StreamLog::open(&jetstream.join("audit"), stream_config.clone())?;
        Some((events, audit))
    };

    // Every listener's cap fits under the open-file limit, with a reserve (server::fds).
    let (soft, hard) = super::fds::raise_nofile_limit();
    let caps = super::fds::fit(&config, soft);
    tracing::info!(
        soft,
        hard,
        http = caps.http,
        grpc = caps.grpc,
        bus = caps.bus,
        "open-file limit and connection caps"
    );
    if caps.http < config.limits.max_connections || caps.bus < config.bus.max_connections {
        tracing::warn!(nofile = soft, reserve = super::fds::RESERVE, "the configured connection caps do not fit the open-file limit: scaled down (raise LimitNOFILE)");
    }
    config.bus.max_connections = caps.bus;
    let handshake = config.limits.handshake_timeout.0;
    // A REST connection that sends nothing is idle from the start.
    let http_first_byte = handshake.min(config.limits.idle_timeout.0);
    let http_listener = super::tls::Listener::new(
        bind(&config.listen.http, "listen.http").await?,
        "listen.http",
        caps.http,
        config.limits.per_address(caps.http),
        super::tls::HTTP_BUSY,
        http_first_byte,
    );
    let grpc_listener = super::tls::Listener::new(
        bind(&config.listen.grpc, "listen.grpc").await?,
        "listen.grpc",
        caps.grpc,
        config.limits.per_address(caps.grpc),
        super::tls::GRPC_BUSY,
        handshake,
    );
    // With bus.tls, agents may log in by mutual TLS: client certificates are requested (not
    // required) and must chain to the embedded root CA.
    // (preflight::check_config has checked both files are set, or neither.)
    let bus_tls = if config.bus.tls.cert.is_empty() {
        None
    } else {
        let root = crate::identity::root_der(store.as_ref()).await?;
        crate::tls::bus_server_tls(&config.bus.tls, &[root.into()])
            .map_err(crate::Error::Invalid)?
    };
    let bus_listener = if config.bus.external_urls.is_empty() {
        Some(super::bus::EmbeddedListener {
            listener: bind(&config.listen.bus, "listen.bus").await?,
            tls: bus_tls,
        })
    } else {
        None
    };
    let bus = super::bus::start(&config, store.clone(), bus_listener, nats_keys.as_deref()).await?;
    let (events_log, audit_log) = match local_logs {
        Some(logs) => logs,
        None => shared_streams(&config, &bus.client, &stream_config).await?,
    };
    let replicas = jetstream_replicas(&config, &bus.client);
    let logs = crate::domain::Logs {
        events: events_log.clone(),
        audit: audit_log.clone(),
        files: super::files::object_store(&config, &data_dir, &bus.client, replicas).await?,
    };
    let cluster = if config.cluster.enabled {
        crate::cluster::Cluster::join(&config, bus.client.clone(), grpc_listener.local_addr()?)
            .await?
    } else {
        crate::cluster::Cluster::single(&config.bus.server_name, &config.listen.grpc)
    };
    let domain = Domain::start(
        &config,
        crate::domain::Unlocked { store, keys },
        logs,
        bus.client.clone(),
        bus.local_publisher(),
        cluster,
        stop.clone(),
    )
    .await?;
    audit_admin_recoveries(&domain, &data_dir).await;
    bus.report_health(domain.events.clone());
    let bus_monitor = super::bus_monitor::start(&config, &domain, &bus, stop.clone()).await?;
    let bound = BoundAddrs {
        http: http_listener.local_addr()?,
        grpc: grpc_listener.local_addr()?,
        bus: bus.address.clone(),
        tls: tls.is_some(),
        bus_monitor,
    };
    let streams = vec![("events", events_log.clone()), ("audit", audit_log.clone())];
    let context = Arc::new(Context::new(config, data_dir.clone(), domain, bus, streams));
    tokio::spawn(enforce_retention(vec![events_log, audit_log]));
    tokio::spawn(super::enrol::serve(context.clone()));
    super::fleet::start(context.clone()).await?;
    super::files::start(context.clone()).await?;
    super::fleet::serve_content(context.clone()).await?;
    crate::secrets::leases::spawn_reaper(context.domain.clone());
    crate::identity::spawn_token_cleanup(context.domain.clone());
    crate::identity::spawn_command_key_retirement(context.domain.clone());
    crate::fleet::history::spawn_pruner(context.domain.clone());
    crate::cluster::spawn(context.domain.clone());
    crate::webhooks::delivery::spawn(context.domain.clone());
    crate::runbooks::engine::resume(&context.domain).await;
    crate::runbooks::engine::spawn_triggers(context.domain.clone());

    let http_task = tokio::spawn(super::http::serve(
        context.clone(),
        http_listener,
        tls.as_ref().map(|tls| tls.rest.clone()),
        stop.clone(),
    ));
    let grpc_task = tokio::spawn(super::grpc::serve(
        context.clone(),
        grpc_listener,
        tls.as_ref().map(|tls| tls.grpc.clone()),
        stop.clone(),
    ));
    context.grpc_serving.store(true, Ordering::Relaxed);

    let addrs = serde_json::to_vec_pretty(&bound).map_err(crate::Error::internal)?;
    std::fs::write(data_dir.join(LISTEN_ADDRS_FILE), addrs)?;
    tracing::info!(http = %bound.http, grpc = %bound.grpc, bus = %bound.bus, tls = bound.tls, data_dir = %data_dir.display(), "svc-server started");
    let started = serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "http": bound.http, "grpc": bound.grpc, "bus": bound.bus});
    context
        .domain
        .events
        .emit_system(crate::events::EventKind::ServerStarted, "server", started)
        .await;
    // The start's code (configuration, migrations, the CA, TLS set-up) is not run again:
    // once the first tasks have run, its pages are released (program/trim.rs).
    tokio::spawn(async {
        tokio::time::sleep(START_SETTLE).await;
        let released = tokio::task::spawn_blocking(crate::program::trim::release_code_pages)
            .await
            .unwrap_or_default();
        tracing::debug!(released, "start-up code pages released");
    });

    signals.wait(&context).await;
    tracing::info!(grace = ?SHUTDOWN_GRACE, "stop requested: no new connections; draining in-flight requests");
    context
        .domain
        .events
        .emit_system(
            crate::events::EventKind::ServerStopping,
            "server",
            serde_json::json!({}),
        )
        .await;
    context.grpc_serving.store(false, Ordering::Relaxed);
    // Heartbeat times are saved in batches; keep the last ones for the next start.
    crate::fleet::save_heartbeats(&context.domain).await;
    let _ = stop_sender.send(true);
    // The lease and the member row go now, so the next leader need not wait the lease out.
    context.domain.cluster.leave().await;
    // Both servers drain on their own; the grace bounds them together.
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        let _ = http_task.await;
        let _ = grpc_task.await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!("grace period over: closing the remaining connections");
    }
    context
        .bus
        .shutdown(std::time::Duration::from_secs(2))
        .await;
    let _ = std::fs::remove_file(data_dir.join(LISTEN_ADDRS_FILE));
    tracing::info!("svc-server stopped");
    Ok(())
}

/// Cluster mode: the events and audit streams in JetStream on the NATS cluster, with
/// min(3, cluster size) replicas. The size is what the cluster tells its clients (INFO's
/// connect_urls: every node's client address) or the configured URLs, whichever is more.
async fn shared_streams(
    config: &ServerConfig,
    client: &async_nats::Client,
    stream_config: &StreamConfig,
) -> Result<(Arc<dyn Stream>, Arc<dyn Stream>)> {
    let replicas = jetstream_replicas(config, client);
    tracing::info!(
        replicas,
        "cluster mode: the events and audit streams are in JetStream"
    );
    let events =
        crate::stream::JetStreamLog::open(client.clone(), "events", stream_config, replicas);
    let audit = crate::stream::JetStreamLog::open(client.clone(), "audit", stream_config, replicas);
    let (events, audit) = tokio::try_join!(events, audit)?;
    Ok((events, audit))
}

/// Replicas for svc's JetStream streams: min(3, NATS cluster size), the size being what the
/// cluster tells its clients (INFO's connect_urls) or the configured URLs, whichever is more.
fn jetstream_replicas(config: &ServerConfig, client: &async_nats::Client) -> usize {
    let advertised = client.server_info().connect_urls.len();
    advertised.max(config.bus.external_urls.len()).clamp(1, 3)
}

/// Connections the kernel completes and queues for accept. tokio's 1024 overflows when a few
/// thousand agents reconnect at once: the overflow's handshakes stall until the client's
/// connect timeout (5 s) and retry. Linux caps it at `net.core.somaxconn` (4096 by default).
const LISTEN_BACKLOG: u32 = 4096;

async fn bind(address: &str, key: &str) -> Result<tokio::net::TcpListener> {
    let fail = |e: std::io::Error| {
        crate::Error::Unavailable(format!("{key}: cannot listen on {address}: {e}"))
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address");
    for socket_address in tokio::net::lookup_host(address).await.map_err(fail)? {
        let socket = match socket_address {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .map_err(fail)?;
        // As tokio's TcpListener::bind: a restarted server rebinds its port at once.
        socket.set_reuseaddr(true).map_err(fail)?;
        match socket.bind(socket_address) {
            Ok(()) => return socket.listen(LISTEN_BACKLOG).map_err(fail),
            Err(error) => last = error,
        }
    }
    Err(fail(last))
}

/// The signals the server handles, installed before the server announces its addresses:
/// a SIGTERM that arrives during start-up must drain the server, not kill it.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let install =
            |kind| signal(kind).map_err(|e| crate::Error::Internal(format!("signal handler: {e}")));
        Ok(StopSignals {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
            hup: install(SignalKind::hangup())?,
            usr2: install(SignalKind::user_defined2())?,
        })
    }

    /// Waits for SIGTERM or SIGINT, or for this member's eviction from the cluster; SIGHUP
    /// reloads the policies and runbooks meanwhile, and SIGUSR2 puts the bus in lame duck
    /// (REST and gRPC keep serving until SIGTERM).
    async fn wait(&mut self, context: &Context) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return,
                _ = context.domain.cluster.until_evicted() => {
                    tracing::error!("removed from the cluster (svc-cluster remove): stopping");
                    return;
                }
                _ = self.int.recv() => return,
                _ = self.hup.recv() => {
                    let count = context.domain.auditor.reload_policies();
                    tracing::info!(count, "SIGHUP: policies reloaded");
                    let count = context.domain.runbooks.reload();
                    tracing::info!(count, "SIGHUP: runbooks reloaded");
                }
                _ = self.usr2.recv() => {
                    let bus = &context.config.bus;
                    if !context.bus.enter_lame_duck(bus.lame_duck_duration.0, bus.lame_duck_grace_period.0) {
                        tracing::warn!("SIGUSR2: no embedded broker (bus.external_urls): nothing to put in lame duck");
                    }
                }
            }
        }
    }
}

/// Applies stream retention once a minute (whole segments; cheap when nothing is due).
async fn enforce_retention(logs: Vec<Arc<dyn Stream>>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        tick.tick().await;
        for log in &logs {
            match log.enforce_retention().await {
                Ok(0) => {}
                Ok(dropped) => tracing::info!(dropped, "stream retention dropped old records"),
                Err(e) => tracing::warn!(error = %e, "stream retention failed"),
            }
        }
    }
}
