//! What the server benchmarks share: the real `svc` server in a child process on loopback
//! ports, with a temporary data dir and an admin key, and the bearer metadata for requests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;

pub mod run;

/// The server's HMAC secret, from which an agent's bootstrap PSK is derived.
pub const HMAC_SECRET: &str = "bench-hmac-secret";

/// A running server, killed on drop. Each bench reads only some of the addresses.
#[allow(dead_code)]
pub struct Server {
    pub child: Child,
    /// Holds `server.yaml`, `server.log` and the data dir; removed on drop.
    pub root: tempfile::TempDir,
    /// `http://host:port`, for tonic clients.
    pub grpc: String,
    /// `host:port` of the same, for the CLIs' `--server`.
    pub grpc_addr: String,
    pub http: String,
    pub bus: String,
    /// The bootstrap admin API key.
    pub key: String,
}

/// The data dir of a server started on `root`, for a bench that fills it before the start.
pub fn data_dir(root: &Path) -> PathBuf {
    root.join("data")
}

/// The svc binary the bench runs: the one cargo built with it, or `SVC_BENCH_SERVER`, so that
/// two builds can be compared back to back with the same client code and machine load.
pub fn server_binary() -> PathBuf {
    std::env::var_os("SVC_BENCH_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_svc").into())
}

impl Server {
    /// Starts the server on `root` (its data dir may already hold state) with the rate limit
    /// raised, since the default 50 req/s per key would measure the limiter, and the lines of
    /// `extra_config` added to its configuration. Returns once it has written its addresses;
    /// panics with its log if it exits or does not get there in time.
    pub fn start(root: tempfile::TempDir, extra_config: &str) -> Server {
        let master: [u8; 32] = rand::random();
        let key = format!("svc_{}", svc::ids::random_base62(40));
        Server::start_member(root, extra_config, master, &key)
    }

    /// [`Server::start`] with a given master key and admin key: servers sharing one store
    /// (cluster members) need the same.
    pub fn start_member(
        root: tempfile::TempDir,
        extra_config: &str,
        master: [u8; 32],
        key: &str,
    ) -> Server {
        let data = data_dir(root.path());
        let config = root.path().join("server.yaml");
        std::fs::write(
            &config,
            format!(
                "data_dir: {}\nlisten: {{ http: 127.0.0.1:0, grpc: 127.0.0.1:0, bus: 127.0.0.1:0, bus_monitor: 127.0.0.1:0 }}\n\
                 hmacsecret: {HMAC_SECRET}\nmaster_key: {}\nlog_level: \"{}\"\n\
                 rate_limit: {{ requests_per_second: 1000000000, burst: 1000000000, max_in_flight: 4096 }}\n{extra_config}",
                data.display(),
                base64::engine::general_purpose::STANDARD.encode(master),
                // SVC_BENCH_LOG: the server's log filter (server.log), e.g. svc::fleet=debug.
                std::env::var("SVC_BENCH_LOG").unwrap_or_else(|_| "warn".into())
            ),
        )
        .unwrap();
        // The admin key is preset (`svc_` and 40 base62 characters) rather than read back
        // from the file the server would write.
        let key = key.to_string();
        let (child, addrs) = spawn(root.path(), &key);
        let address = |name: &str| addrs[name].as_str().unwrap().to_string();
        Server {
            child,
            grpc: format!("http://{}", address("grpc")),
            grpc_addr: address("grpc"),
            http: address("http"),
            bus: address("bus"),
            key,
            root,
        }
    }

    /// Kills the server with SIGKILL (a crash: nothing is flushed or said goodbye) and starts
    /// it again on the same data dir and the same ports, returning once it listens.
    #[allow(dead_code)]
    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.start_again();
    }

    /// Stops the server with SIGTERM (a planned restart: it drains) and starts it again on the
    /// same data dir and ports, returning once it listens.
    #[allow(dead_code)]
    pub fn stop_and_restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Starts the server again, after it exited, on the same data dir and ports.
    fn start_again(&mut self) {
        let config = self.root.path().join("server.yaml");
        let text = std::fs::read_to_string(&config).unwrap();
        // A cluster member's bus is the external NATS cluster (its `bus` address lists those
        // nodes): its own listener stays unused, on any port.
        let bus = if text.contains("external_urls") {
            "127.0.0.1:0"
        } else {
            self.bus.trim_start_matches("nats://")
        };
        let fixed = format!(
            "listen: {{ http: {}, grpc: {}, bus: {bus}, bus_monitor: 127.0.0.1:0 }}",
            self.http, self.grpc_addr,
        );
        let text: Vec<String> = text
            .lines()
            .map(|line| {
                if line.starts_with("listen:") {
                    fixed.clone()
                } else {
                    line.to_string()
                }
            })
            .collect();
        std::fs::write(&config, text.join("\n") + "\n").unwrap();
        let _ = std::fs::remove_file(data_dir(self.root.path()).join("listen-addrs.json"));
        self.child = spawn(self.root.path(), &self.key).0;
    }

    /// Sends `signal` to the server (SIGUSR2: lame duck).
    #[allow(dead_code)]
    pub fn signal(&self, signal: i32) {
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Shuts the server down with SIGTERM, as an operator would, and waits for it.
    #[allow(dead_code)]
    pub fn stop(&mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// Runs the server on `root`'s server.yaml (log to server.log, appended) and waits until it
/// writes its addresses; panics with its log if it exits or does not get there in time.
fn spawn(root: &Path, key: &str) -> (Child, serde_json::Value) {
    let data = data_dir(root);
    let log_path = root.join("server.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    // A clean environment: cargo sets SVC_* build variables that the server would read as
    // configuration.
    let mut child = Command::new(server_binary())
        .env_clear()
        .env("SVC_BOOTSTRAP_API_KEY", key)
        .args(["server", "--config"])
        .arg(root.join("server.yaml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let addrs_file = data.join("listen-addrs.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(addrs) = std::fs::read_to_string(&addrs_file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
        {
            return (child, addrs);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "server exited ({status}): {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "server did not start: {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // With SVC_BENCH_LOG the log was asked for: it outlives the temporary root.
        if std::env::var_os("SVC_BENCH_LOG").is_some() {
            let kept =
                std::env::temp_dir().join(format!("svc-bench-server-{}.log", self.child.id()));
            if std::fs::copy(self.root.path().join("server.log"), &kept).is_ok() {
                eprintln!("server log kept in {}", kept.display());
            }
        }
        // A bench that fails mid-run may fail because the server did: say what it logged.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.root.path().join("server.log"));
            eprintln!("server log: {}", log.unwrap_or_default());
        }
    }
}

/// CPU time (user + system) a process has used so far, from /proc/PID/stat (clock ticks,
/// usually 10 ms: read it around phases of seconds). Over a phase, the server's CPU divided by
/// the calls it answered is its CPU per call, whatever else loads the machine.
#[allow(dead_code)]
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// A request carrying `key` as its bearer token.
pub fn authorized<T>(key: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

/// `svc-audit log --action 'secret.*' --user user-3` (limit 50) over gRPC, `queries` times on
/// one channel: (p50, p99). The store must hold at least 50 matching rows.
#[allow(dead_code)]
pub async fn audit_log_latency(grpc_url: &str, key: &str, queries: usize) -> (Duration, Duration) {
    let channel = tonic::transport::Endpoint::from_shared(grpc_url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = svc::proto::policy_service_client::PolicyServiceClient::new(channel);
    let mut times = Vec::new();
    for _ in 0..queries {
        let request = svc::proto::AuditLogRequest {
            action: "secret.*".into(),
            user: "user-3".into(),
            page: Some(svc::proto::PageRequest {
                limit: 50,
                cursor: String::new(),
            }),
            ..Default::default()
        };
        let started = Instant::now();
        let page = client
            .audit_log(authorized(key, request))
            .await
            .unwrap()
            .into_inner();
        times.push(started.elapsed());
        assert_eq!(page.items.len(), 50);
    }
    times.sort();
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

#[allow(dead_code)]
const ACTIONS: &[&str] = &[
    "apikey.create",
    "apikey.delete",
    "secret.read",
    "secret.write",
    "exec.run",
    "agent.quarantine",
    "event.emit",
    "transit.encrypt",
];

/// Writes `events` events (one hour back, 300 a millisecond apart) straight into the events
/// stream log of `data`, in batches of 1,000: the set-up of a bench, not a figure.
#[allow(dead_code)]
pub async fn fill_events(data: &Path, events: u64) {
    let log = svc::stream::StreamLog::open(
        &data.join("jetstream/events"),
        svc::stream::StreamConfig::default(),
    )
    .unwrap();
    let start = svc::clock::now_millis() - 3_600_000;
    let mut n = 0u64;
    while n < events {
        let batch: Vec<(i64, Vec<u8>)> = (0..1000u64)
            .map(|i| {
                let millis = start + ((n + i) as i64) / 300;
                let event = serde_json::json!({
                    "id": svc::ids::ulid(), "type": "command_completed", "category": "job",
                    "severity": "info", "source": format!("agent-{}", (n + i) % 100),
                    "timestamp": svc::clock::format_rfc3339(millis), "payload": {"exit_code": 0, "n": n + i},
                });
                (millis, serde_json::to_vec(&event).unwrap())
            })
            .collect();
        log.append_batch(batch).await.unwrap();
        n += 1000;
    }
}

/// Writes `rows` hash-chained audit rows straight into `data/svc.db` (created with the
/// store's schema), in one transaction: a valid chain that `svc-audit verify` accepts.
#[allow(dead_code)]
pub fn fill_audit(data: &Path, rows: i64) {
    let store = svc::store::SqliteStore::open(&data.join("svc.db")).unwrap();
    drop(store);
    let mut db = rusqlite::Connection::open(data.join("svc.db")).unwrap();
    let tx = db.transaction().unwrap();
    let mut prev = svc::audit::chain::GENESIS.to_string();
    let start = svc::clock::now_millis() - 86_400_000;
    {
        let mut insert = tx.prepare(svc::store::INSERT_AUDIT_SQL).unwrap();
        for seq in 1..=rows {
            let action = ACTIONS[(seq as usize) % ACTIONS.len()];
            let mut row = svc::store::AuditRow {
                seq,
                id: svc::ids::ulid(),
                timestamp: svc::clock::format_rfc3339(start + seq * 80),
                user: format!("user-{}", seq % 10),
                action: action.into(),
                resource_type: action.split('.').next().unwrap().into(),
                resource_id: format!("r{}", seq % 1000),
                outcome: "success".into(),
                policy_id: None,
                decision: None,
                severity: "medium".into(),
                detail: "{}".into(),
                prev_hash: prev.clone(),
                hash: String::new(),
            };
            row.hash = svc::audit::chain::seal(&row);
            prev = row.hash.clone();
            svc::store::insert_audit_row(&mut insert, &row).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The bootstrap PSK of `agent_id` on a bench server (derived from its HMAC secret).
#[allow(dead_code)]
pub fn psk(agent_id: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, HMAC_SECRET.as_bytes());
    hex::encode(ring::hmac::sign(&key, agent_id.as_bytes()).as_ref())
}

/// Enrols a real svc-agent as `id` on `server` (its home under the server's root) and returns
/// the path of its agent.yaml, for `svc agent --config PATH`. The agent is the server's build
/// ([`server_binary`]), so `SVC_BENCH_SERVER` measures both sides of one build.
#[allow(dead_code)]
pub fn enrol_real_agent(server: &Server, id: &str) -> PathBuf {
    let home = server.root.path().join(id);
    std::fs::create_dir_all(&home).unwrap();
    let config = home.join("agent.yaml");
    std::fs::write(
        &config,
        format!("agent:\n  state_dir: {}\n", home.join("state").display()),
    )
    .unwrap();
    let enrolled = Command::new(server_binary())
        .env_clear()
        .args(["agent", "--config"])
        .arg(&config)
        .args(["bootstrap", "--non-interactive", "--server", &server.bus])
        .args(["--agent-id", id, "--psk", &psk(id)])
        .output()
        .unwrap();
    assert!(enrolled.status.success(), "{enrolled:?}");
    config
}

/// Enrols a real svc-agent as `id` ([`enrol_real_agent`]) and starts it, its output
/// discarded; the caller stops it.
#[allow(dead_code)]
pub fn spawn_real_agent(server: &Server, id: &str) -> std::process::Child {
    let config = enrol_real_agent(server, id);
    Command::new(server_binary())
        .env_clear()
        .args(["agent", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}
