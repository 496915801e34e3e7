//! Cluster mode under injected faults (issue 37, docs/reliability.md "Cluster mode under
//! injected faults"): three members on a PostgreSQL of this test's own and a three-node
//! nats-server JetStream cluster, clients writing through every member (API keys over REST,
//! secret versions, events and exec to three real agents over gRPC, one file put before the
//! rounds), and four rounds of faults:
//!
//! 1. `kill -9` of the leader, then its restart;
//! 2. `kill -9` of the NATS node that leads the `SVC_EVENTS` stream, then its restart;
//! 3. PostgreSQL stopped like a crash (`pg_ctl stop -m immediate`), then started again;
//! 4. one member cut from NATS (m3 reaches its nodes only through a proxy in this test, which
//!    closes every connection and refuses new ones), then healed.
//!
//! After each round: every acknowledged write is present on every member (keys authenticate,
//! secret versions read back, events are listed, exec jobs have one result per agent, the
//! file's SHA-256 matches), has its audit row, `svc-audit verify` passes on every member, no
//! write is there twice, and writes of every kind succeeded again within the failover time
//! the docs state (docs/cluster.md: `lease_ttl` + `heartbeat_interval`, 6 s by default; for a
//! NATS node, JetStream's election, within 10 s).
//! A write whose request failed or timed out is unacknowledged: it may be there or not, but
//! not twice (writers never resend one).
//!
//! Skipped with a message where PostgreSQL or nats-server is missing (required under CI).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::cluster::{self, Members, Prepared, Setup};
use common::nats_cluster::NatsCluster;
use common::postgres::Postgres;
use common::{run, with_key};
use sha2::{Digest, Sha256};
use svc::proto::event_service_client::EventServiceClient;
use svc::proto::fleet_service_client::FleetServiceClient;
use svc::proto::secrets_service_client::SecretsServiceClient;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

/// The default timing, written out: the failover time the docs state follows from it.
const TIMING: &str = "  heartbeat_interval: 1s\n  member_timeout: 5s\n  lease_ttl: 5s\n";
/// `lease_ttl` + `heartbeat_interval` (docs/cluster.md, "Failures").
const FAILOVER: Duration = Duration::from_secs(6);
/// When the NATS node that dies holds a JetStream stream's leader, writes to that stream wait
/// for the remaining replicas to elect another: nats-server's Raft election timeout (4-9 s,
/// random) and its campaign (under 1 s) (docs/cluster.md, "Failures"). Emits, and the
/// changes that emit an event (an API key's `apikey_created`, exec's `command_*`), wait
/// with them.
const NATS_FAILOVER: Duration = Duration::from_secs(10);
/// The member that reaches NATS only through the proxies (m3).
const PARTITIONED: usize = 2;
const AGENTS: usize = 3;
const EVENT_TYPE: &str = "command_completed";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    ApiKey,
    Secret,
    Event,
    Exec,
}

const KINDS: [Kind; 4] = [Kind::ApiKey, Kind::Secret, Kind::Event, Kind::Exec];

impl Kind {
    /// The pause after an acknowledged write: keeps the totals small enough to read every
    /// one back on every member within the test's time.
    fn pace(self) -> Duration {
        Duration::from_millis(match self {
            Kind::ApiKey | Kind::Secret => 300,
            Kind::Event => 100,
            Kind::Exec => 600,
        })
    }
}

/// What the members acknowledged, in order.
#[derive(Clone, Default)]
struct Acknowledged {
    /// (name, id, key)
    keys: Vec<(String, String, String)>,
    /// (path, version, value)
    secrets: Vec<(String, u32, String)>,
    /// (id, source)
    events: Vec<(String, String)>,
    /// (job id, token echoed)
    execs: Vec<(String, String)>,
}

/// How far into each list a round's checks start.
#[derive(Clone, Copy, Default)]
struct Marks {
    keys: usize,
    secrets: usize,
    events: usize,
    execs: usize,
}

/// What the writers share with the test.
struct Shared {
    /// Each member's (REST, gRPC) address; a restarted member gets new ports.
    endpoints: RwLock<Vec<(SocketAddr, SocketAddr)>>,
    admin: String,
    stop: AtomicBool,
    paused: AtomicBool,
    acknowledged: Mutex<Acknowledged>,
    /// When each acknowledged write was answered, by kind and member.
    answered: Mutex<Vec<(Kind, usize, Instant)>>,
    failed: Mutex<BTreeMap<Kind, usize>>,
    first_errors: Mutex<Vec<String>>,
    /// Writers currently inside a request (checks wait for zero after pausing).
    busy: AtomicUsize,
}

/// A TCP proxy on loopback in front of one NATS node: cut closes every proxied connection
/// and closes new ones as soon as they are accepted; heal lets them through again.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::<tokio::task::AbortHandle>::new()));
        let (is_cut, open) = (cut.clone(), connections.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if is_cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let task = tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                let mut open = open.lock().unwrap();
                open.retain(|handle| !handle.is_finished());
                open.push(task.abort_handle());
                // A connection accepted while the cut was being made goes with the others.
                if is_cut.load(Ordering::SeqCst) {
                    task.abort();
                }
            }
        });
        Proxy {
            port,
            cut,
            connections,
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn channel_to(grpc: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(15))
        .connect_lazy()
}

/// One write of `kind` through `member`; on success the acknowledgement is recorded.
async fn write_once(
    shared: &Shared,
    kind: Kind,
    member: usize,
    n: u64,
    http: SocketAddr,
    channel: &Channel,
) -> Result<(), String> {
    let admin = shared.admin.clone();
    let tag = format!("m{}-{n}", member + 1);
    match kind {
        Kind::ApiKey => {
            let name = format!("fault-{tag}");
            let body = format!(r#"{{"name":"{name}","role":"readonly"}}"#);
            let response = tokio::task::spawn_blocking(move || {
                let bearer = format!("Bearer {admin}");
                common::http_request(
                    http,
                    "POST",
                    "/api/v1/apikeys",
                    &[("Authorization", bearer.as_str())],
                    Some(body.as_bytes()),
                )
            })
            .await
            .unwrap()
            .map_err(|e| e.to_string())?;
            if response.status != 201 {
                return Err(format!("{}: {}", response.status, response.body));
            }
            let json = response.json();
            let id = json["id"].as_str().unwrap().to_string();
            let key = json["key"].as_str().unwrap().to_string();
            shared
                .acknowledged
                .lock()
                .unwrap()
                .keys
                .push((name, id, key));
        }
        Kind::Secret => {
            let path = format!("faults/m{}", member + 1);
            let request = svc::proto::PutSecretRequest {
                path: path.clone(),
                data: [("v".to_string(), tag.clone())].into(),
            };
            let put = SecretsServiceClient::new(channel.clone())
                .put(with_key(request, &admin))
                .await
                .map_err(|e| e.to_string())?;
            let version = put.into_inner().version;
            shared
                .acknowledged
                .lock()
                .unwrap()
                .secrets
                .push((path, version, tag));
        }
        Kind::Event => {
            let source = format!("writer-{tag}");
            let request = svc::proto::EmitEventRequest {
                r#type: EVENT_TYPE.into(),
                source: source.clone(),
                payload_json: format!(r#"{{"tag":"{tag}"}}"#),
                ..Default::default()
            };
            let event = EventServiceClient::new(channel.clone())
                .emit(with_key(request, &admin))
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            shared
                .acknowledged
                .lock()
                .unwrap()
                .events
                .push((event.id, source));
        }
        Kind::Exec => {
            let token = format!("x-{tag}");
            let request = svc::proto::ExecRequest {
                target: "role=fault".into(),
                argv: vec!["echo".into(), token.clone()],
                timeout_ms: 8000,
                concurrency: 0,
            };
            let mut stream = FleetServiceClient::new(channel.clone())
                .exec(with_key(request, &admin))
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            let mut results = Vec::new();
            while let Some(result) = stream.message().await.map_err(|e| e.to_string())? {
                results.push(result);
            }
            let expected = format!("{token}\n");
            let all_ok = results.len() == AGENTS
                && results
                    .iter()
                    .all(|r| r.status == "ok" && r.stdout == expected.as_bytes());
            if !all_ok {
                let statuses: Vec<String> = results
                    .iter()
                    .map(|r| format!("{}:{}:{}", r.agent_id, r.status, r.error))
                    .collect();
                return Err(format!("exec results {statuses:?}"));
            }
            shared
                .acknowledged
                .lock()
                .unwrap()
                .execs
                .push((results[0].job_id.clone(), token));
        }
    }
    Ok(())
}

/// Records a write's outcome (the writer has counted it in `busy`, which this ends).
fn record(shared: &Shared, kind: Kind, member: usize, result: Result<(), String>) {
    match result {
        Ok(()) => shared
            .answered
            .lock()
            .unwrap()
            .push((kind, member, Instant::now())),
        Err(error) => {
            *shared.failed.lock().unwrap().entry(kind).or_default() += 1;
            let mut first = shared.first_errors.lock().unwrap();
            let prefix = format!("{kind:?} ");
            if first.iter().filter(|e| e.starts_with(&prefix)).count() < 12 {
                first.push(format!(
                    "{kind:?} via m{} at {}: {error}",
                    member + 1,
                    svc::clock::now_rfc3339()
                ));
            }
        }
    }
    shared.busy.fetch_sub(1, Ordering::SeqCst);
}

/// A client loop writing `kind` through `member` until stopped. A failed write is not sent
/// again: the next one has a new name, value or token. Keys, secrets and events are written
/// one after the other (the next after the answer); an exec is started every `pace` whatever
/// the ones before are doing (at most 16 at once), since an exec whose command was lost waits
/// for its timeout and would otherwise hide that the ones after it succeed.
async fn writer(shared: Arc<Shared>, kind: Kind, member: usize) {
    let mut channel: Option<(SocketAddr, Channel)> = None;
    let mut n = 0u64;
    let in_flight = Arc::new(AtomicUsize::new(0));
    while !shared.stop.load(Ordering::SeqCst) {
        if shared.paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        shared.busy.fetch_add(1, Ordering::SeqCst);
        if shared.paused.load(Ordering::SeqCst) {
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (http, grpc) = shared.endpoints.read().unwrap()[member];
        if channel.as_ref().map(|(a, _)| *a) != Some(grpc) {
            channel = Some((grpc, channel_to(grpc)));
        }
        let channel = channel.as_ref().unwrap().1.clone();
        n += 1;
        if kind == Kind::Exec {
            if in_flight.load(Ordering::SeqCst) >= 16 {
                shared.busy.fetch_sub(1, Ordering::SeqCst);
            } else {
                in_flight.fetch_add(1, Ordering::SeqCst);
                let (shared, in_flight) = (shared.clone(), in_flight.clone());
                tokio::spawn(async move {
                    let result = write_once(&shared, kind, member, n, http, &channel).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    record(&shared, kind, member, result);
                });
            }
            tokio::time::sleep(kind.pace()).await;
            continue;
        }
        let result = write_once(&shared, kind, member, n, http, &channel).await;
        let pause = match result {
            Ok(()) => kind.pace(),
            Err(_) => Duration::from_millis(200),
        };
        record(&shared, kind, member, result);
        tokio::time::sleep(pause).await;
    }
}

/// The longest stretch in [from, to] in which no write of `kind` through `member` (None: any
/// member) was answered.
fn longest_gap_via(
    answered: &[(Kind, usize, Instant)],
    kind: Kind,
    member: Option<usize>,
    from: Instant,
    to: Instant,
) -> Duration {
    let mut times: Vec<Instant> = answered
        .iter()
        .filter(|(k, m, at)| {
            *k == kind && member.is_none_or(|member| *m == member) && *at > from && *at <= to
        })
        .map(|(_, _, at)| *at)
        .collect();
    times.sort();
    let mut previous = from;
    let mut longest = Duration::ZERO;
    for at in times.into_iter().chain([to]) {
        longest = longest.max(at - previous);
        previous = at;
    }
    longest
}

struct World {
    runtime: tokio::runtime::Runtime,
    nats: NatsCluster,
    postgres: Postgres,
    members: Members,
    proxies: Vec<Proxy>,
    shared: Arc<Shared>,
    /// The file put before the rounds: (path, SHA-256 hex).
    file: (String, String),
    work: tempfile::TempDir,
    /// Writes read back, by kind (each read on one member counts once).
    checked: BTreeMap<&'static str, usize>,
}

impl World {
    fn endpoints(&self) -> Vec<(SocketAddr, SocketAddr)> {
        self.shared.endpoints.read().unwrap().clone()
    }

    fn refresh_endpoints(&self) {
        *self.shared.endpoints.write().unwrap() = self
            .members
            .servers
            .iter()
            .map(|s| (s.http, s.grpc))
            .collect();
    }

    /// Waits until every (kind, member) pair has had a write answered after `since`; returns
    /// how long that took from `since`.
    fn wait_for_every_member(&self, since: Instant, within: Duration) -> Duration {
        loop {
            let answered = self.shared.answered.lock().unwrap();
            let mut missing = Vec::new();
            for kind in KINDS {
                for member in 0..3 {
                    if !answered
                        .iter()
                        .any(|(k, m, at)| *k == kind && *m == member && *at > since)
                    {
                        missing.push(format!("{kind:?} via m{}", member + 1));
                    }
                }
            }
            drop(answered);
            if missing.is_empty() {
                // The last pair's first answer is when every member served every kind again.
                let answered = self.shared.answered.lock().unwrap();
                let mut latest = since;
                for kind in KINDS {
                    for member in 0..3 {
                        let first = answered
                            .iter()
                            .filter(|(k, m, at)| *k == kind && *m == member && *at > since)
                            .map(|(_, _, at)| *at)
                            .min()
                            .unwrap();
                        latest = latest.max(first);
                    }
                }
                return latest - since;
            }
            assert!(
                since.elapsed() < within,
                "no write answered within {within:?} for {missing:?}; errors: {:#?}\n{}",
                self.shared.first_errors.lock().unwrap(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for (i, server) in self.members.servers.iter().enumerate() {
            let log = server.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            text.push_str(&format!("--- m{} (last lines)\n", i + 1));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Stops the writers between requests (checks then run on a quiet cluster).
    fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.shared.busy.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "writers did not pause");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }

    fn count(&mut self, what: &'static str, n: usize) {
        *self.checked.entry(what).or_default() += n;
    }

    /// Every acknowledged write present on every member, none twice; `since` marks what
    /// earlier rounds already read back one by one (lists and the audit chain are checked
    /// whole every time); `audit_since` is the time the round's audit rows are looked up from.
    fn check(&mut self, since: Marks, audit_since: &str) -> Marks {
        let endpoints = self.endpoints();
        let admin = self.shared.admin.clone();
        let acknowledged = self.shared.acknowledged.lock().unwrap().clone();
        for (member, (http, grpc)) in endpoints.iter().enumerate() {
            let m = member + 1;
            // API keys: each acknowledged one listed exactly once; the new ones authenticate.
            let listed = common::http_request(
                *http,
                "GET",
                "/api/v1/apikeys",
                &[("Authorization", &format!("Bearer {admin}"))],
                None,
            )
            .unwrap();
            assert_eq!(listed.status, 200, "m{m}: {}", listed.body);
            let mut names: HashMap<String, usize> = HashMap::new();
            for key in listed.json()["apikeys"].as_array().unwrap() {
                *names
                    .entry(key["name"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
            for (name, count) in &names {
                assert!(
                    !name.starts_with("fault-") || *count == 1,
                    "m{m}: key {name} created {count} times"
                );
            }
            for (name, _, _) in &acknowledged.keys {
                assert_eq!(
                    names.get(name),
                    Some(&1),
                    "m{m}: acknowledged key {name} lost"
                );
            }
            for (name, _, key) in &acknowledged.keys[since.keys..] {
                let bearer = format!("Bearer {key}");
                let whoami = common::http_request(
                    *http,
                    "GET",
                    "/api/v1/whoami",
                    &[("Authorization", &bearer)],
                    None,
                )
                .unwrap();
                assert_eq!(whoami.status, 200, "m{m}: key {name}: {}", whoami.body);
                assert_eq!(whoami.json()["name"], name.as_str());
            }
            let channel = self.runtime.block_on(async { channel_to(*grpc) });
            // Events: every acknowledged one listed; no writer's event twice.
            let events = self.runtime.block_on(common::events_grpc(
                &channel,
                &admin,
                Some(svc::proto::EventFilter {
                    types: vec![EVENT_TYPE.into()],
                    ..Default::default()
                }),
            ));
            let mut sources: HashMap<&str, usize> = HashMap::new();
            let mut ids = HashSet::new();
            for event in &events {
                assert!(
                    ids.insert(event.id.as_str()),
                    "m{m}: event {} listed twice",
                    event.id
                );
                if event.source.starts_with("writer-") {
                    *sources.entry(event.source.as_str()).or_default() += 1;
                }
            }
            for (source, count) in &sources {
                assert_eq!(*count, 1, "m{m}: event from {source} stored {count} times");
            }
            for (id, source) in &acknowledged.events {
                assert!(
                    ids.contains(id.as_str()),
                    "m{m}: acknowledged event {id} ({source}) lost ({} listed)",
                    events.len()
                );
            }
            // Secrets: the new acknowledged versions read back with their values.
            self.runtime.block_on(async {
                let mut client = SecretsServiceClient::new(channel.clone());
                for (path, version, value) in &acknowledged.secrets[since.secrets..] {
                    let request = svc::proto::GetSecretRequest {
                        path: path.clone(),
                        version: *version,
                    };
                    let secret = client
                        .get(with_key(request, &admin))
                        .await
                        .unwrap_or_else(|e| panic!("m{m}: secret {path} v{version}: {e:?}"))
                        .into_inner();
                    assert_eq!(secret.data.get("v"), Some(value), "m{m}: {path} v{version}");
                }
            });
            // Exec jobs: each new acknowledged job has one ok result per agent.
            self.runtime.block_on(async {
                for (job, token) in &acknowledged.execs[since.execs..] {
                    let results = job_results(&channel, &admin, job).await;
                    let agents: HashSet<&str> =
                        results.iter().map(|r| r.agent_id.as_str()).collect();
                    assert_eq!(
                        (results.len(), agents.len()),
                        (AGENTS, AGENTS),
                        "m{m}: job {job} results {results:?}"
                    );
                    for result in &results {
                        assert_eq!(result.status, "ok", "m{m}: job {job}: {result:?}");
                        assert_eq!(result.stdout, format!("{token}\n").as_bytes());
                    }
                }
            });
            // The audit chain, through the CLI.
            let verified = run(self.members.servers[member].cli("svc-audit").args([
                "--api-key",
                &admin,
                "-o",
                "json",
                "verify",
            ]));
            assert_eq!(verified.code, 0, "m{m}: svc-audit verify: {verified:?}");
            assert_eq!(common::json_of(&verified)["ok"], true, "m{m}: {verified:?}");
        }
        let members = 3;
        self.count("API keys listed", acknowledged.keys.len() * members);
        self.count(
            "API keys authenticated",
            (acknowledged.keys.len() - since.keys) * members,
        );
        self.count("events listed", acknowledged.events.len() * members);
        self.count(
            "secret versions read",
            (acknowledged.secrets.len() - since.secrets) * members,
        );
        self.count(
            "exec jobs read",
            (acknowledged.execs.len() - since.execs) * members,
        );
        self.count("audit chain verified", members);

        // Audit rows of the round's keys and secret versions (one chain: read on one member).
        let channel = self.runtime.block_on(async { channel_to(endpoints[0].1) });
        let creates = self.runtime.block_on(common::audit_rows_grpc(
            &channel,
            &admin,
            "apikey.create",
            audit_since,
        ));
        let audited_keys: HashSet<&str> = creates
            .iter()
            .filter(|row| row.outcome == "success")
            .map(|row| row.resource_id.as_str())
            .collect();
        // A change acknowledged just before the store went away may have lost its outcome
        // row: it is in the chain as its attempt alone, which the listing shows (only
        // attempts whose outcome is stored are hidden). That is the documented guarantee
        // (docs/reliability.md, "No window left"), so such an attempt stands for one
        // acknowledged change of its resource.
        let mut orphan_keys = orphan_attempts(&creates, |row| {
            let detail: serde_json::Value = serde_json::from_str(&row.detail_json).ok()?;
            Some(detail["name"].as_str()?.to_string())
        });
        for (name, id, _) in &acknowledged.keys[since.keys..] {
            if audited_keys.contains(id.as_str()) {
                continue;
            }
            assert!(
                take_orphan(&mut orphan_keys, name),
                "key {name} ({id}) acknowledged without its audit row"
            );
            println!("key {name} ({id}): its attempt row without an outcome (store fault)");
        }
        let writes = self.runtime.block_on(common::audit_rows_grpc(
            &channel,
            &admin,
            "secret.write",
            audit_since,
        ));
        let audited_versions: HashSet<(String, u64)> = writes
            .iter()
            .filter(|row| row.outcome == "success")
            .filter_map(|row| {
                let detail: serde_json::Value = serde_json::from_str(&row.detail_json).ok()?;
                Some((row.resource_id.clone(), detail["version"].as_u64()?))
            })
            .collect();
        let mut orphan_writes = orphan_attempts(&writes, |row| Some(row.resource_id.clone()));
        for (path, version, _) in &acknowledged.secrets[since.secrets..] {
            if audited_versions.contains(&(path.clone(), u64::from(*version))) {
                continue;
            }
            assert!(
                take_orphan(&mut orphan_writes, path),
                "secret {path} v{version} acknowledged without its audit row"
            );
            println!("secret {path} v{version}: its attempt row without an outcome (store fault)");
        }
        self.count(
            "audit rows matched",
            acknowledged.keys.len() - since.keys + acknowledged.secrets.len() - since.secrets,
        );

        // The file, through every NATS node (the members answer file requests as a queue
        // group: whichever member takes the request reads the object from SVC_FILES).
        for url in self.nats.urls() {
            self.check_file(&url);
        }
        self.count("file reads (SHA-256)", self.nats.len());
        Marks {
            keys: acknowledged.keys.len(),
            secrets: acknowledged.secrets.len(),
            events: acknowledged.events.len(),
            execs: acknowledged.execs.len(),
        }
    }

    fn check_file(&self, url: &str) {
        let (path, sha) = &self.file;
        let out = self.work.path().join("back");
        let _ = std::fs::remove_file(&out);
        let got = self.files(url, &["get", path, out.to_str().unwrap()]);
        assert_eq!(got.code, 0, "get {path} through {url}: {got:?}");
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&hex::encode(Sha256::digest(&bytes)), sha, "through {url}");
        let stat = self.files(url, &["stat", path, "-o", "json"]);
        assert_eq!(stat.code, 0, "{stat:?}");
        assert_eq!(common::json_of(&stat)["sha256"], sha.as_str(), "{stat:?}");
    }

    fn files(&self, url: &str, args: &[&str]) -> common::Run {
        run(self.members.servers[0]
            .cli("svc-files")
            .env("SVC_NATS_URL", url)
            .env("SVC_API_KEY", &self.shared.admin)
            .args(args))
    }

    /// Every secret version of every writer's path, read on member `i`: the values are
    /// distinct (no put was stored twice), and every acknowledged version has its value.
    fn check_secret_versions(&mut self, i: usize) {
        let admin = self.shared.admin.clone();
        let channel = self
            .runtime
            .block_on(async { channel_to(self.endpoints()[i].1) });
        let acknowledged: HashMap<(String, u32), String> = self
            .shared
            .acknowledged
            .lock()
            .unwrap()
            .secrets
            .iter()
            .map(|(p, v, value)| ((p.clone(), *v), value.clone()))
            .collect();
        let read = self.runtime.block_on(async {
            let mut client = SecretsServiceClient::new(channel.clone());
            let listed = client
                .list(with_key(
                    svc::proto::ListSecretsRequest {
                        prefix: "faults/".into(),
                        include_deleted: false,
                    },
                    &admin,
                ))
                .await
                .unwrap()
                .into_inner();
            let mut read = 0;
            for meta in listed.secrets {
                let mut values = HashSet::new();
                for version in 1..=meta.version {
                    let request = svc::proto::GetSecretRequest {
                        path: meta.path.clone(),
                        version,
                    };
                    let secret = client
                        .get(with_key(request, &admin))
                        .await
                        .unwrap_or_else(|e| panic!("{} v{version}: {e:?}", meta.path))
                        .into_inner();
                    let value = secret.data.get("v").cloned().unwrap_or_default();
                    assert!(
                        values.insert(value.clone()),
                        "{}: value {value} stored twice (v{version})",
                        meta.path
                    );
                    if let Some(expected) = acknowledged.get(&(meta.path.clone(), version)) {
                        assert_eq!(&value, expected, "{} v{version}", meta.path);
                    }
                    read += 1;
                }
            }
            read
        });
        assert!(
            read >= acknowledged.len(),
            "{read} versions for {} acknowledged",
            acknowledged.len()
        );
        self.count("secret versions scanned for duplicates", read);
    }
}

/// The index of the NATS node that leads the `SVC_EVENTS` stream (`$JS.API.STREAM.INFO`).
async fn events_stream_leader(nats: &NatsCluster) -> usize {
    let client = async_nats::connect(nats.urls()).await.unwrap();
    let reply = client
        .request("$JS.API.STREAM.INFO.SVC_EVENTS", bytes::Bytes::new())
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    let leader = info["cluster"]["leader"].as_str().unwrap_or_default();
    nats.index_of(leader)
        .unwrap_or_else(|| panic!("no leader in the stream info: {info}"))
}

/// The exec results a job has stored (FleetService.GetJob).
async fn job_results(channel: &Channel, key: &str, job: &str) -> Vec<svc::proto::ExecResult> {
    let mut stream = FleetServiceClient::new(channel.clone())
        .get_job(with_key(svc::proto::JobRequest { id: job.into() }, key))
        .await
        .unwrap_or_else(|e| panic!("job {job}: {e:?}"))
        .into_inner();
    let mut results = Vec::new();
    while let Some(part) = stream.message().await.unwrap() {
        if let Some(svc::proto::job_part::Part::Exec(result)) = part.part {
            results.push(result);
        }
    }
    results
}

fn rfc3339_before(back: Duration) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .saturating_sub(back)
        .as_millis() as i64;
    svc::clock::format_rfc3339(millis)
}

/// What one round measured.
struct Round {
    name: &'static str,
    /// From the fault to the repair (restart, heal).
    fault_for: Duration,
    /// From the repair until every kind was answered through every member.
    resumed_after_repair: Duration,
    /// Per kind, the longest time from the fault on in which no write of that kind was
    /// answered through any member.
    longest_gap: BTreeMap<Kind, Duration>,
    /// The new leader's election, for the leader round.
    failover: Option<Duration>,
}

#[test]
fn acknowledged_writes_survive_faults_on_every_member() {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(nats) = runtime.block_on(NatsCluster::start_unadvertised(3)) else {
        return;
    };
    let Some(postgres) = Postgres::start_restartable() else {
        return;
    };
    // m3 reaches every NATS node through a proxy of its own.
    let proxies: Vec<Proxy> = runtime.block_on(async {
        let mut proxies = Vec::new();
        for url in nats.urls() {
            let upstream: SocketAddr = url.trim_start_matches("nats://").parse().unwrap();
            proxies.push(Proxy::start(upstream).await);
        }
        proxies
    });
    let urls_from = |first: usize| {
        let mut urls = nats.urls();
        urls.rotate_left(first);
        urls
    };
    let mut nats_urls: Vec<Vec<String>> = (0..3).map(urls_from).collect();
    nats_urls[PARTITIONED] = proxies.iter().map(Proxy::url).collect();
    nats_urls[PARTITIONED].rotate_left(PARTITIONED);
    let members = cluster::start(Setup {
        nats_urls,
        cluster_yaml: TIMING,
        // Every exec job of the run is read back at the end: keep them all.
        extra_yaml: "jobs:\n  keep: 100000\n",
        bus_yaml: "",
        prepared: Some(Prepared {
            database_url: postgres.fresh_database(),
            master_key: common::random_master_key(),
        }),
    })
    .expect("PostgreSQL was started above");
    members.wait_for_leader(0, "", Duration::from_secs(15));
    let agents: Vec<common::agent::Agent> = (0..AGENTS)
        .map(|i| {
            common::agent::Agent::start_on(
                &members.servers[i % 3],
                &urls_from(i).join(","),
                &format!("host-{}", i + 1),
                "role=fault",
            )
        })
        .collect();

    let work = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared {
        endpoints: RwLock::new(Vec::new()),
        admin: members.admin_key.clone(),
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        acknowledged: Mutex::new(Acknowledged::default()),
        answered: Mutex::new(Vec::new()),
        failed: Mutex::new(BTreeMap::new()),
        first_errors: Mutex::new(Vec::new()),
        busy: AtomicUsize::new(0),
    });
    let mut world = World {
        runtime,
        nats,
        postgres,
        members,
        proxies,
        shared: shared.clone(),
        file: (String::new(), String::new()),
        work,
        checked: BTreeMap::new(),
    };
    world.refresh_endpoints();

    // The file: several chunks, put through the partitioned member's first node.
    let bytes: Vec<u8> = (0..(600 * 1024u32))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let local = world.work.path().join("file");
    std::fs::write(&local, &bytes).unwrap();
    let put = world.files(
        &world.nats.url(PARTITIONED),
        &["put", local.to_str().unwrap(), "faults/file", "-o", "json"],
    );
    assert_eq!(put.code, 0, "{put:?}");
    world.file = ("faults/file".into(), hex::encode(Sha256::digest(&bytes)));
    eprintln!("cluster up in {:?}", started.elapsed());

    // The audit rows of the writes each round reads back are looked up from a second before
    // those writes could start (audit times are UTC milliseconds, from the same clock).
    let mut audit_since = rfc3339_before(Duration::from_secs(1));
    // Exec needs every agent connected: wait for the first acknowledged exec on every member.
    let writers: Vec<_> = KINDS
        .iter()
        .flat_map(|kind| (0..3).map(move |member| (*kind, member)))
        .map(|(kind, member)| world.runtime.spawn(writer(shared.clone(), kind, member)))
        .collect();
    let warm = Instant::now();
    world.wait_for_every_member(warm, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));

    let mut marks = Marks::default();
    let mut rounds = Vec::new();
    let faults: [&'static str; 4] = [
        "kill -9 the leader",
        "kill -9 a NATS node",
        "restart PostgreSQL",
        "partition m3 from NATS",
    ];
    for name in faults {
        shared.first_errors.lock().unwrap().clear();
        let round_start = Instant::now();
        let fault = Instant::now();
        eprintln!("round '{name}': fault at {}", svc::clock::now_rfc3339());
        let mut failover = None;
        let (mut not_ready, mut ready_again) = (None, None);
        let mut healed_at = None;
        match name {
            "kill -9 the leader" => {
                let leader = world
                    .members
                    .wait_for_leader(0, "", Duration::from_secs(10));
                let dead = Members::index_of(&leader);
                let survivors: Vec<usize> = (0..3).filter(|i| *i != dead).collect();
                let fault = Instant::now();
                world.members.servers[dead].stop_with(libc::SIGKILL);
                // The first survivor to name another leader (the one that took the lease
                // knows at once; the other's view follows at its next heartbeat).
                'elected: loop {
                    for &i in &survivors {
                        let seen = world.members.leader_seen_by(i);
                        if !seen.is_empty() && seen != leader {
                            break 'elected;
                        }
                    }
                    assert!(
                        fault.elapsed() < FAILOVER + Duration::from_secs(4),
                        "no new leader after {:?}",
                        fault.elapsed()
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                failover = Some(fault.elapsed());
                let env = vec![(
                    "SVC_BOOTSTRAP_API_KEY".to_string(),
                    world.members.admin_key.clone(),
                )];
                world.members.servers[dead].spawn(&env);
                world.refresh_endpoints();
            }
            "kill -9 a NATS node" => {
                // The node that leads SVC_EVENTS: the harder case, writes wait for an election.
                let leader = world.runtime.block_on(events_stream_leader(&world.nats));
                eprintln!("round '{name}': n{leader} leads SVC_EVENTS");
                world.nats.kill(leader);
                // Down for longer than JetStream's election: service must resume on two nodes.
                std::thread::sleep(NATS_FAILOVER);
                world.runtime.block_on(world.nats.restart(leader));
            }
            "restart PostgreSQL" => {
                world.postgres.kill();
                std::thread::sleep(Duration::from_secs(1));
                world.postgres.start_again();
            }
            "partition m3 from NATS" => {
                for proxy in &world.proxies {
                    proxy.cut();
                }
                // m3's readiness while cut off: how soon it says so (a load balancer's cue).
                let m3 = world.members.servers[PARTITIONED].http;
                let ready = |address| {
                    common::http_request(address, "GET", "/health/ready", &[], None)
                        .map(|r| r.status)
                        .unwrap_or(0)
                };
                while fault.elapsed() < Duration::from_secs(5) {
                    let sent = fault.elapsed();
                    if not_ready.is_none() && ready(m3) != 200 {
                        not_ready = Some((sent, fault.elapsed() - sent));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                for proxy in &world.proxies {
                    proxy.heal();
                }
                let healed = Instant::now();
                healed_at = Some(healed);
                while ready(m3) != 200 && healed.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                ready_again = Some(healed.elapsed());
            }
            _ => unreachable!(),
        }
        let repaired = healed_at.unwrap_or_else(Instant::now);
        let resumed_after_repair = world.wait_for_every_member(repaired, Duration::from_secs(40));
        // A little load after recovery, then the checks on a quiet cluster.
        std::thread::sleep(Duration::from_secs(1));
        let end = Instant::now();
        let longest_gap: BTreeMap<Kind, Duration> = {
            let answered = shared.answered.lock().unwrap();
            KINDS
                .iter()
                .map(|kind| (*kind, longest_gap_via(&answered, *kind, None, fault, end)))
                .collect()
        };
        // Through the partitioned member alone (shows that the cut took effect).
        let gap_via_m3: BTreeMap<Kind, Duration> = {
            let answered = shared.answered.lock().unwrap();
            KINDS
                .iter()
                .map(|kind| {
                    let gap = longest_gap_via(&answered, *kind, Some(PARTITIONED), fault, end);
                    (*kind, gap)
                })
                .collect()
        };
        world.pause();
        eprintln!(
            "round '{name}': first errors: {:#?}",
            shared.first_errors.lock().unwrap()
        );
        let checking = Instant::now();
        let before = world.checked.clone();
        marks = world.check(marks, &audit_since);
        let read: usize = world.checked.values().sum::<usize>() - before.values().sum::<usize>();
        let failed = shared.failed.lock().unwrap().clone();
        eprintln!(
            "round '{name}': {:?} from fault to repair; every kind through every member {:?} \
             after the repair; longest gap per kind {:?}{}; acknowledged so far: {} keys, {} \
             secret versions, {} events, {} exec jobs; unacknowledged so far {:?}; {read} \
             read-backs in {:?}; longest gap through m3 alone {:?}",
            repaired - fault,
            resumed_after_repair,
            longest_gap,
            failover
                .map(|f| format!("; new leader after {f:?}"))
                .unwrap_or_default(),
            marks.keys,
            marks.secrets,
            marks.events,
            marks.execs,
            failed,
            checking.elapsed(),
            gap_via_m3,
        );
        if let Some(again) = ready_again {
            eprintln!(
                "round '{name}': m3's first 503 from /health/ready: (probe sent after the \
                 cut, probe took) {not_ready:?}; ready again {again:?} after the heal"
            );
        }
        if name == "partition m3 from NATS" {
            // Events need NATS: none can have been answered through m3 while it was cut off.
            assert!(
                gap_via_m3[&Kind::Event] >= repaired - fault,
                "m3 answered emits while cut from NATS: {gap_via_m3:?}"
            );
        }
        rounds.push(Round {
            name,
            fault_for: repaired - round_start,
            resumed_after_repair,
            longest_gap,
            failover,
        });
        audit_since = rfc3339_before(Duration::from_secs(1));
        world.resume();
    }
    world.pause();
    shared.stop.store(true, Ordering::SeqCst);
    world.runtime.block_on(async {
        for writer in writers {
            writer.await.unwrap();
        }
    });
    // The final pass: every key authenticates and every exec job and secret version reads
    // back on every member, not only the round's; no secret value stored twice.
    let final_start = Instant::now();
    world.check(
        Marks::default(),
        &rfc3339_before(started.elapsed() + Duration::from_secs(60)),
    );
    world.check_secret_versions(PARTITIONED);
    eprintln!("final pass in {:?}", final_start.elapsed());
    drop(agents);

    let failed = shared.failed.lock().unwrap().clone();
    eprintln!(
        "--- cluster under faults: {} rounds in {:?}",
        rounds.len(),
        started.elapsed()
    );
    for (what, n) in &world.checked {
        eprintln!("checked: {n} {what}");
    }
    eprintln!("unacknowledged (failed or timed out) writes: {failed:?}");
    for round in &rounds {
        let worst = round
            .longest_gap
            .values()
            .max()
            .copied()
            .unwrap_or_default();
        eprintln!(
            "{}: fault {:?}, resumed on every member {:?} after repair, longest gap {:?} {:?}{}",
            round.name,
            round.fault_for,
            round.resumed_after_repair,
            worst,
            round.longest_gap,
            round
                .failover
                .map(|f| format!(", new leader after {f:?}"))
                .unwrap_or_default()
        );
    }
    // Service resumes within the stated failover time: a dead leader is replaced within
    // `lease_ttl` + `heartbeat_interval`, and while a member or the link to NATS is down the
    // others keep taking every kind of write with no gap longer than that; a dead NATS node
    // costs at most JetStream's election; after PostgreSQL or a link comes back, every member
    // takes every kind of write again within the failover time.
    for round in &rounds {
        if let Some(failover) = round.failover {
            assert!(
                failover <= FAILOVER,
                "{}: new leader after {failover:?}",
                round.name
            );
        }
        let bound = match round.name {
            "kill -9 a NATS node" => NATS_FAILOVER,
            _ => FAILOVER,
        };
        // PostgreSQL holds every write's state: while it is down nothing is written.
        if round.name != "restart PostgreSQL" {
            for (kind, gap) in &round.longest_gap {
                assert!(
                    *gap <= bound,
                    "{}: no {kind:?} write answered for {gap:?}",
                    round.name
                );
            }
        }
        assert!(
            round.resumed_after_repair <= bound,
            "{}: writes resumed on every member only {:?} after the repair",
            round.name,
            round.resumed_after_repair
        );
    }
}

/// How many attempt rows without a stored outcome each resource has (the listing shows only
/// those attempts), keyed by `key`.
fn orphan_attempts(
    rows: &[svc::proto::AuditEntry],
    key: impl Fn(&svc::proto::AuditEntry) -> Option<String>,
) -> HashMap<String, usize> {
    let mut orphans = HashMap::new();
    for row in rows.iter().filter(|row| row.outcome == "attempt") {
        if let Some(key) = key(row) {
            *orphans.entry(key).or_insert(0) += 1;
        }
    }
    orphans
}

/// Uses up one of `key`'s attempts without an outcome; false when it has none left.
fn take_orphan(orphans: &mut HashMap<String, usize>, key: &str) -> bool {
    match orphans.get_mut(key) {
        Some(count) if *count > 0 => {
            *count -= 1;
            true
        }
        _ => false,
    }
}
