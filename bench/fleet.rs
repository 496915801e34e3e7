//! Fleet benchmarks against a real server process (the svc binary cargo built for this bench),
//! with simulated agents. Each simulated agent is a real bus connection, from its own loopback
//! source address (127.1.x.y: the whole of 127.0.0.0/8 reaches the server, so the ephemeral
//! port range does not cap the count), that behaves as svc-agent does on the wire:
//!
//! - it enrols over `svc.enroll` with its PSK and a CSR of its own key, and keeps the
//!   certificate and the server's command key it gets back;
//! - it logs in as svc-agent does (`crate::agent::connect_options`): CONNECT with its
//!   certificate in `jwt` and its signature of the INFO nonce in `pass`, headers on, then
//!   subscribes to `svc.agent.<id>.cmd` and sends its first heartbeat, which carries the
//!   host's facts (later ones do not), at the agent's default interval;
//! - it reads commands as `HMSG` (the server signs each command in its `Svc-Signature` header)
//!   or `MSG`, checks each with the library's own `fleet::signature::Verifier` and
//!   `SeenJobs` (signature, agent id, freshness, replay), as the agent's executor does, and
//!   answers on `svc.agent.<id>.result`: an exec with exit 0 and "ok" (nothing is run), a
//!   state with no change, a refused command with the reason, as the agent does.
//!
//! Usage: cargo bench --bench fleet [-- --agents 1000 --heartbeat-agents 10000 --seconds 30
//! --rounds 5]. CI runs it tiny on the debug build (.ci/run):
//! `cargo bench --profile dev --bench fleet -- --agents 20 --heartbeat-agents 40 --seconds 1
//! --rounds 1`. `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server with the same
//! clients (the real svc-agent of (3) is always this build's).
//!
//! 1. exec fan-out: `FleetService.Exec` to every one of --agents simulated agents; time to
//!    the first and to the last result (--rounds rounds after a warm-up). Side by side: the bus
//!    floor, the same simulated agents (same identities, same checks) connected to Debian's
//!    nats-server and commanded by a bare NATS client that signs each command with a key of
//!    the bench's own (as the server signs each copy) and publishes it with its signature
//!    header, then collects the answers. The floor runs on nats-server because the embedded
//!    broker lets only agents and the server itself publish on `svc.agent.>`, and the
//!    server's own credential is made in memory at its start. Without nats-server the floor
//!    is skipped (a failure under CI, which installs it).
//! 2. heartbeat load: --heartbeat-agents agents heartbeating at the default interval (phases
//!    spread over it); server CPU over --seconds, from /proc, after one interval to settle
//!    (or --seconds, when shorter); server RSS per connected agent.
//! 3. the real svc-agent's RSS after 5 s idle, enrolled and connected, and after one exec.
//!
//! The simulator runs in this process on the same 2 cores as the server, so its CPU is in the
//! wall-clock figures of (1) but not in the server CPU of (2).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use svc::fleet::protocol::{
    Command as AgentCommand, ExecOutcome, Reply, ReplyOutcome, StateOutcome, Work,
};
use svc::fleet::signature::{SeenJobs, Signer, Verifier};
use svc::proto::fleet_service_client::FleetServiceClient;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

mod common;
use common::{authorized, psk, run, spawn_real_agent, Server};

#[path = "../tests/common/login.rs"]
mod login;
use login::{enrol, heartbeat, login, source_address, until_pong, Identity};

#[path = "../tests/common/nats_cluster.rs"]
#[allow(dead_code)]
mod nats_cluster;

/// Commands the simulated agents refused (bad signature, wrong agent, stale, replayed).
static REFUSED: AtomicUsize = AtomicUsize::new(0);

struct Options {
    agents: usize,
    heartbeat_agents: usize,
    seconds: u64,
    rounds: usize,
}

fn options() -> Options {
    let agents = run::flag("--agents", 1000usize).max(1);
    Options {
        agents,
        heartbeat_agents: run::flag("--heartbeat-agents", 10_000usize).max(agents),
        seconds: run::flag("--seconds", 30u64).clamp(1, 120),
        rounds: run::flag("--rounds", 5usize).max(1),
    }
}

/// The agent's default heartbeat interval (agent.yaml `heartbeat_interval`).
fn heartbeat_interval() -> Duration {
    svc::config::AgentSection::default().heartbeat_interval.0
}

/// Where one simulated agent connects and what it trusts.
#[derive(Clone)]
struct Link {
    bus: SocketAddr,
    /// The loopback address the connection comes from.
    source: Ipv4Addr,
    /// The command key's certificate (PEM) the agent checks signatures against.
    command_key: Arc<str>,
    /// When its periodic heartbeats fall within the interval.
    phase: Duration,
    /// The facts its first heartbeat carries (this host's, as JSON values).
    facts: Arc<svc::facts::Facts>,
}

fn bus_address(url: &str) -> SocketAddr {
    url.trim_start_matches("nats://").parse().unwrap()
}

/// The `Svc-Signature` header's value in a NATS header block (empty when absent).
fn signature_header(headers: &[u8]) -> String {
    String::from_utf8_lossy(headers)
        .lines()
        .skip(1) // NATS/1.0
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| {
            name.trim()
                .eq_ignore_ascii_case(svc::fleet::signature::HEADER)
        })
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default()
}

/// The answer to one command, checked as the agent's executor checks it. None when the bytes
/// are not a command at all (the agent ignores those).
fn answer(
    verifier: &Verifier,
    seen: &mut SeenJobs,
    body: &[u8],
    signature: &str,
    received: Instant,
) -> Option<Reply> {
    let now = svc::clock::now_millis() as u64;
    let checked = verifier
        .check(body, signature, now)
        .and_then(|command| seen.admit(&command, now).map(|()| command));
    let (job_id, outcome) = match checked {
        Ok(command) => {
            let outcome = match command.work {
                Work::Exec { .. } => ReplyOutcome::Exec(ExecOutcome {
                    stdout: "ok\n".into(),
                    ..Default::default()
                }),
                Work::State { .. } => ReplyOutcome::State(StateOutcome::default()),
                Work::Module { .. } => ReplyOutcome::State(StateOutcome {
                    error: Some("the fleet simulator runs no modules".into()),
                    ..Default::default()
                }),
                // Simulated agents report no command keys, so the server sends them no notice.
                Work::CommandKeys { .. } => ReplyOutcome::Exec(ExecOutcome {
                    exit_code: -1,
                    error: Some("the fleet simulator keeps its command keys".into()),
                    ..Default::default()
                }),
            };
            (command.job_id, outcome)
        }
        Err(refused) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            let command: AgentCommand = serde_json::from_slice(body).ok()?;
            let why = Some(refused.to_string());
            let outcome = match command.work {
                Work::Exec { .. } => ReplyOutcome::Exec(ExecOutcome {
                    exit_code: -1,
                    error: why,
                    ..Default::default()
                }),
                _ => ReplyOutcome::State(StateOutcome {
                    error: why,
                    ..Default::default()
                }),
            };
            (command.job_id, outcome)
        }
    };
    Some(Reply {
        job_id,
        duration_ms: received.elapsed().as_millis() as u64,
        outcome,
    })
}

/// One simulated agent on a raw connection: log in, subscribe, heartbeat, answer commands.
/// `connected` is counted up once the server has confirmed the subscription (PONG).
async fn simulate(identity: Arc<Identity>, link: Link, connected: Arc<AtomicUsize>) {
    let id = identity.id.as_str();
    let verifier = Verifier::from_certificate_pem(&link.command_key, id).unwrap();
    let mut seen = SeenJobs::open(None, svc::clock::now_millis() as u64).unwrap();
    let (mut reader, mut write) = login(&identity, link.bus, link.source)
        .await
        .unwrap_or_else(|e| panic!("{id}: login from {}: {e}", link.source));
    let mut line = String::new();

    let mut facts = (*link.facts).clone();
    facts.insert("hostname".into(), id.into());
    let mut hello = format!("SUB svc.agent.{id}.cmd 1\r\n").into_bytes();
    hello.extend(heartbeat(id, Some(facts)));
    hello.extend_from_slice(b"PING\r\n");
    write.write_all(&hello).await.unwrap();
    until_pong(&mut reader, &mut write)
        .await
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    connected.fetch_add(1, Ordering::Relaxed);

    let beat = heartbeat(id, None);
    let interval = heartbeat_interval();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + link.phase, interval);
    let mut payload = Vec::new();
    loop {
        line.clear();
        tokio::select! {
            read = reader.read_line(&mut line) => {
                if read.unwrap_or(0) == 0 {
                    return;
                }
                let received = Instant::now();
                // MSG <subject> <sid> [reply] <size>, HMSG <subject> <sid> [reply] <header size> <size>
                let words: Vec<&str> = line.split_whitespace().collect();
                let (header_len, size) = match words.first().copied() {
                    Some("MSG") => (0, words.last().unwrap().parse::<usize>().unwrap()),
                    Some("HMSG") => (
                        words[words.len() - 2].parse::<usize>().unwrap(),
                        words.last().unwrap().parse::<usize>().unwrap(),
                    ),
                    Some("PING") => {
                        write.write_all(b"PONG\r\n").await.unwrap();
                        continue;
                    }
                    Some(other) if other.starts_with("-ERR") => panic!("{id}: {}", line.trim_end()),
                    _ => continue,
                };
                payload.resize(size + 2, 0);
                reader.read_exact(&mut payload).await.unwrap();
                let signature = signature_header(&payload[..header_len]);
                let Some(reply) = answer(&verifier, &mut seen, &payload[header_len..size], &signature, received) else {
                    continue;
                };
                let body = serde_json::to_vec(&reply).unwrap();
                let mut out = format!("PUB svc.agent.{id}.result {}\r\n", body.len()).into_bytes();
                out.extend_from_slice(&body);
                out.extend_from_slice(b"\r\n");
                write.write_all(&out).await.unwrap();
            }
            _ = tick.tick() => write.write_all(&beat).await.unwrap(),
        }
    }
}

/// Panics with the first simulated agent that ended (its panic: a refused login, a closed
/// connection) instead of waiting for it forever.
async fn check_tasks(tasks: &mut Vec<JoinHandle<()>>) {
    if let Some(index) = tasks.iter().position(JoinHandle::is_finished) {
        let task = tasks.swap_remove(index);
        if let Err(error) = task.await {
            std::panic::resume_unwind(error.into_panic());
        }
        panic!("a simulated agent ended");
    }
}

/// Connects `identities` (numbered from `first` for their source addresses) to `bus`, at most
/// ~200 logins in flight, and waits until every one is in.
async fn connect_all(
    identities: &[Arc<Identity>],
    first: usize,
    link: &Link,
    connected: &Arc<AtomicUsize>,
) -> Vec<JoinHandle<()>> {
    let base = connected.load(Ordering::Relaxed);
    let target = base + identities.len();
    let interval = heartbeat_interval();
    let mut tasks = Vec::new();
    for (n, identity) in identities.iter().enumerate() {
        let link = Link {
            source: source_address(first + n),
            phase: interval.mul_f64((n % 1000) as f64 / 1000.0),
            ..link.clone()
        };
        tasks.push(tokio::spawn(simulate(
            identity.clone(),
            link,
            connected.clone(),
        )));
        while n + 1 - (connected.load(Ordering::Relaxed) - base) > 200 {
            check_tasks(&mut tasks).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while connected.load(Ordering::Relaxed) < target {
        check_tasks(&mut tasks).await;
        assert!(
            Instant::now() < deadline,
            "only {} of {} agents logged in",
            connected.load(Ordering::Relaxed) - base,
            identities.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tasks
}

/// Polls /metrics until `count` agents are connected.
async fn wait_connected(server: &Server, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let metrics = http_get(&server.http, "/metrics");
        let connected = metrics
            .lines()
            .find(|l| l.starts_with("svc_agents{state=\"connected\"}"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as usize;
        if connected >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {connected} of {count} agents connected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// One exec to every agent through the server: (first result, last result).
async fn exec_round(server: &Server, agents: usize) -> (Duration, Duration) {
    let channel = tonic::transport::Channel::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FleetServiceClient::new(channel);
    let request = svc::proto::ExecRequest {
        target: "sim=exec".into(),
        argv: vec!["true".into()],
        timeout_ms: 10_000,
        concurrency: 0,
    };
    let started = Instant::now();
    let mut stream = client
        .exec(authorized(&server.key, request))
        .await
        .unwrap()
        .into_inner();
    let mut first = None;
    let mut count = 0;
    while let Some(result) = stream.message().await.unwrap() {
        assert_eq!(result.status, "ok", "{result:?}");
        first.get_or_insert_with(|| started.elapsed());
        count += 1;
    }
    assert_eq!(count, agents);
    (first.unwrap(), started.elapsed())
}

/// The bus floor: the simulated agents on Debian's nats-server, commanded by a bare client.
struct Floor {
    /// Holds the nats-server process (killed on drop).
    _nats: nats_cluster::NatsCluster,
    client: async_nats::Client,
    results: async_nats::Subscriber,
    signer: Arc<Signer>,
    ids: Arc<Vec<String>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Floor {
    /// None (after saying why) without nats-server; a failure under CI.
    async fn start(
        identities: &[Arc<Identity>],
        facts: &Arc<svc::facts::Facts>,
        connected: &Arc<AtomicUsize>,
    ) -> Option<Floor> {
        if nats_cluster::find_nats_server().is_none() {
            run::missing_peer(
                "nats-server",
                "apt-get install nats-server",
                "the bus floor",
            );
            return None;
        }
        let nats = nats_cluster::NatsCluster::start(1).await?;
        // The floor's own command key: the bare client signs every command as the server does.
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = rcgen::CertificateParams::default()
            .self_signed(&key)
            .unwrap();
        let signer = Signer::from_pkcs8_pem(&key.serialize_pem()).unwrap();
        let link = Link {
            bus: bus_address(&nats.url(0)),
            source: Ipv4Addr::LOCALHOST,
            command_key: certificate.pem().into(),
            phase: Duration::ZERO,
            facts: facts.clone(),
        };
        let tasks = connect_all(identities, 0, &link, connected).await;
        let client = async_nats::connect(nats.url(0)).await.unwrap();
        let results = client.subscribe("svc.agent.*.result").await.unwrap();
        client.flush().await.unwrap();
        Some(Floor {
            _nats: nats,
            client,
            results,
            signer: Arc::new(signer),
            ids: Arc::new(identities.iter().map(|i| i.id.clone()).collect()),
            tasks,
        })
    }

    /// One signed command to every agent, published one by one: (first answer, last answer).
    async fn round(&mut self) -> (Duration, Duration) {
        let job_id = svc::ids::ulid();
        let command = AgentCommand {
            job_id: job_id.clone(),
            timeout_ms: 10_000,
            agent_id: String::new(),
            issued_at_ms: 0,
            work: Work::Exec {
                argv: vec!["true".into()],
            },
        };
        // Published from a task of its own, so that answers are timed as they arrive.
        let (client, signer, ids) = (self.client.clone(), self.signer.clone(), self.ids.clone());
        let started = Instant::now();
        let publisher = tokio::spawn(async move {
            for id in ids.iter() {
                let (bytes, signature) = signer.sign(&command, id).unwrap();
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(svc::fleet::signature::HEADER, signature.as_str());
                client
                    .publish_with_headers(format!("svc.agent.{id}.cmd"), headers, bytes.into())
                    .await
                    .unwrap();
            }
            client.flush().await.unwrap();
        });
        let mut first = None;
        let mut count = 0;
        while count < self.ids.len() {
            let message = tokio::time::timeout(Duration::from_secs(10), self.results.next())
                .await
                .expect("the floor's agents answer within 10 s")
                .unwrap();
            let reply: Reply = serde_json::from_slice(&message.payload).unwrap();
            if reply.job_id == job_id {
                match &reply.outcome {
                    ReplyOutcome::Exec(outcome) => {
                        assert_eq!(outcome.error, None, "floor command refused")
                    }
                    other => panic!("floor: not an exec answer: {other:?}"),
                }
                first.get_or_insert_with(|| started.elapsed());
                count += 1;
            }
        }
        publisher.await.unwrap();
        (first.unwrap(), started.elapsed())
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The real svc-agent: enrol with its PSK, run it, read its RSS after 5 s idle.
fn real_agent_rss(server: &Server) -> (u64, u64) {
    let mut agent = spawn_real_agent(server, "real-agent");
    std::thread::sleep(Duration::from_secs(5));
    let idle = rss_kib(agent.id());
    // One command through it, then idle again: what a working agent settles at.
    let ran = Command::new(env!("CARGO_BIN_EXE_svc"))
        .env_clear()
        .args(["ctl", "--server", &server.grpc_addr])
        .args([
            "--api-key",
            &server.key,
            "exec",
            "-t",
            "real-agent",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_kib(agent.id());
    let _ = agent.kill();
    let _ = agent.wait();
    (idle, after)
}

fn main() {
    let options = options();
    let interval = heartbeat_interval();
    let server = Server::start(
        tempfile::tempdir().unwrap(),
        "agents: { heartbeat_timeout: 60s }\n",
    );
    let pid = server.child.id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "fleet bench: {} exec agents, {} heartbeat agents, {} s CPU window, {} rounds (load: {})",
        options.agents,
        options.heartbeat_agents,
        options.seconds,
        options.rounds,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    runtime.block_on(async {
        let facts = Arc::new(svc::facts::collect());
        let started = Instant::now();
        let identities = enrol(&server.bus, 0..options.agents, "exec", psk).await;
        let rest = enrol(&server.bus, options.agents..options.heartbeat_agents, "load", psk).await;
        let took = started.elapsed().as_secs_f64();
        println!(
            "enrolled {} agents over svc.enroll in {took:.1} s ({:.0}/s)",
            identities.len() + rest.len(),
            (identities.len() + rest.len()) as f64 / took
        );
        let rss_before = rss_kib(pid);
        let connected = Arc::new(AtomicUsize::new(0));
        let link = Link {
            bus: bus_address(&server.bus),
            source: Ipv4Addr::LOCALHOST,
            command_key: identities[0].command_key.as_str().into(),
            phase: Duration::ZERO,
            facts: facts.clone(),
        };
        let started = Instant::now();
        let mut tasks = connect_all(&identities, 0, &link, &connected).await;
        wait_connected(&server, options.agents).await;
        println!(
            "{} simulated agents logged in and connected in {:.1} s (sources 127.1.0.1 onwards)",
            options.agents,
            started.elapsed().as_secs_f64()
        );

        // 1. exec fan-out, server vs bus floor.
        let mut floor = Floor::start(&identities, &facts, &Arc::new(AtomicUsize::new(0))).await;
        let _ = exec_round(&server, options.agents).await; // warm-up
        if let Some(floor) = &mut floor {
            let _ = floor.round().await;
        }
        let (mut firsts, mut alls, mut floor_firsts, mut floor_alls) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..options.rounds {
            let (first, all) = exec_round(&server, options.agents).await;
            firsts.push(first);
            alls.push(all);
            if let Some(floor) = &mut floor {
                let (first, all) = floor.round().await;
                floor_firsts.push(first);
                floor_alls.push(all);
            }
        }
        drop(floor);
        let (first, all) = (median(firsts), median(alls.clone()));
        println!(
            "\nexec fan-out to {} agents (median of {}):",
            options.agents, options.rounds
        );
        println!(
            "  svc-server (gRPC Exec): first result {}, all results {} (best {})   goal: first <= 100 ms: {}",
            ms(first),
            ms(all),
            ms(*alls.iter().min().unwrap()),
            met(first <= Duration::from_millis(100))
        );
        if floor_alls.is_empty() {
            println!("  bus floor: not measured (no nats-server)");
        } else {
            let (floor_first, floor_all) = (median(floor_firsts), median(floor_alls));
            println!(
                "  bus floor (Debian's nats-server, a bare client publishing signed commands): first result {}, all results {}",
                ms(floor_first),
                ms(floor_all)
            );
            let ratio = all.as_secs_f64() / floor_all.as_secs_f64();
            println!(
                "  ratio svc/floor, all results: {ratio:.2}x   goal <= 1.5x: {}",
                met(ratio <= 1.5)
            );
        }

        // 2. heartbeat load.
        let started = Instant::now();
        tasks.extend(connect_all(&rest, options.agents, &link, &connected).await);
        wait_connected(&server, options.heartbeat_agents).await;
        let settle = interval.min(Duration::from_secs(options.seconds));
        println!(
            "\n{} agents connected in {:.1} s; settling for {:.0} s",
            options.heartbeat_agents,
            started.elapsed().as_secs_f64(),
            settle.as_secs_f64()
        );
        tokio::time::sleep(settle).await;
        let (cpu0, t0) = (common::cpu_time(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(options.seconds)).await;
        let used = (common::cpu_time(pid) - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64() * 100.0;
        let goal = options.heartbeat_agents as f64 / 1000.0;
        println!(
            "heartbeats: {} agents every {} s = {:.0}/s; server CPU {used:.1}% of one core over {} s   goal <= {goal:.2}% (1% per 1,000 agents): {}",
            options.heartbeat_agents,
            interval.as_secs(),
            options.heartbeat_agents as f64 / interval.as_secs_f64(),
            options.seconds,
            met(used <= goal)
        );
        let rss = rss_kib(pid);
        let per_agent = rss.saturating_sub(rss_before) as f64 * 1024.0 / options.heartbeat_agents as f64;
        println!(
            "server RSS {} MiB with {} agents connected ({} MiB before they connected): {:.1} KB per agent   goal <= 20 KB: {}",
            rss / 1024,
            options.heartbeat_agents,
            rss_before / 1024,
            per_agent / 1000.0,
            met(per_agent <= 20_000.0)
        );
        for task in tasks {
            task.abort();
        }
    });
    let refused = REFUSED.load(Ordering::Relaxed);
    assert_eq!(
        refused, 0,
        "the simulated agents refused {refused} commands"
    );

    // 3. the real agent.
    let (idle, after) = real_agent_rss(&server);
    println!(
        "\nreal svc-agent RSS: {:.1} MiB idle after 5 s, {:.1} MiB after one exec   goal <= 10 MB: {}",
        idle as f64 / 1024.0,
        after as f64 / 1024.0,
        met(idle * 1024 <= 10_000_000)
    );
    let _ = std::io::stdout().flush();
}
