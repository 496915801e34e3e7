//! Fleet benchmarks against a real server process (the release binary cargo built for this
//! bench), with simulated agents: each one a real bus connection that logs in with its own
//! certificate (enrolled over `svc.enroll` with its PSK, signing the INFO nonce), subscribes
//! to its command subject, heartbeats, and answers commands at once.
//!
//! Usage: cargo bench --bench fleet [-- --agents 1000 --heartbeat-agents 10000 --seconds 30]
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server with the same clients (the
//! real svc-agent of (3) is always this build's).
//!
//! 1. exec fan-out: `FleetService.Exec` to every one of --agents simulated agents; time to
//!    the first and to the last result (5 rounds). Side by side: the bus floor, the same
//!    agents commanded by a bare NATS client through the same broker (publish one command per
//!    agent, collect the answers), so the ratio is what the control plane adds.
//! 2. heartbeat load: --heartbeat-agents agents heartbeating every 10 s (phases spread over
//!    the interval); server CPU over --seconds, from /proc.
//! 3. the real svc-agent's RSS after 5 s idle, enrolled and connected.
//!
//! The simulator runs in this process on the same 2 cores as the server, so its CPU is in the
//! wall-clock figures of (1) but not in the server CPU of (2).

use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use ring::signature::EcdsaKeyPair;
use svc::fleet::protocol::{Command as AgentCommand, ExecOutcome, Reply, ReplyOutcome};
use svc::proto::fleet_service_client::FleetServiceClient;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

mod common;
use common::{authorized, psk, spawn_real_agent, Server};

const HEARTBEAT: Duration = Duration::from_secs(10);
const ROUNDS: usize = 5;

struct Options {
    agents: usize,
    heartbeat_agents: usize,
    seconds: u64,
}

fn options() -> Options {
    let mut options = Options {
        agents: 1000,
        heartbeat_agents: 10_000,
        seconds: 30,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut iter = args.iter().skip(1);
    while let Some(arg) = iter.next() {
        let mut value = || iter.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match arg.as_str() {
            "--agents" => options.agents = value() as usize,
            "--heartbeat-agents" => options.heartbeat_agents = value() as usize,
            "--seconds" => options.seconds = value().clamp(5, 120),
            _ => {}
        }
    }
    options.heartbeat_agents = options.heartbeat_agents.max(options.agents);
    options
}

/// An enrolled simulated agent: its id, certificate and key.
struct Identity {
    id: String,
    cert_pem: String,
    key: EcdsaKeyPair,
}

/// Enrols agents `range` over `svc.enroll` with the label `sim=GROUP`, 32 at a time.
async fn enrol(bus: &str, range: std::ops::Range<usize>, group: &str) -> Vec<Identity> {
    let client = async_nats::ConnectOptions::new()
        .custom_inbox_prefix(format!("_INBOX.{}", svc::ids::random_base62(22)))
        .connect(bus)
        .await
        .unwrap();
    futures_util::stream::iter(range)
        .map(|n| {
            let client = client.clone();
            async move {
                let id = format!("sim-{n:05}");
                let key = rcgen::KeyPair::generate().unwrap();
                let mut params = rcgen::CertificateParams::default();
                params
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, id.as_str());
                let csr = params.serialize_request(&key).unwrap().pem().unwrap();
                let request = serde_json::json!({"agent_id": id, "csr": csr, "psk": psk(&id), "labels": {"sim": group}});
                let reply = client
                    .request("svc.enroll", serde_json::to_vec(&request).unwrap().into())
                    .await
                    .unwrap();
                let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
                let cert_pem = answer["certificate"]
                    .as_str()
                    .unwrap_or_else(|| panic!("enrolment refused: {answer}"))
                    .to_string();
                let key = EcdsaKeyPair::from_pkcs8(
                    &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                    &key.serialize_der(),
                    &ring::rand::SystemRandom::new(),
                )
                .unwrap();
                Identity { id, cert_pem, key }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// One simulated agent on a raw connection: log in, subscribe, heartbeat, answer commands.
/// `connected` is counted up once the login is confirmed (PONG).
async fn simulate(bus: String, identity: Identity, phase: Duration, connected: Arc<AtomicUsize>) {
    let address = bus.trim_start_matches("nats://").to_string();
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let info: serde_json::Value =
        serde_json::from_str(line.trim().trim_start_matches("INFO ")).unwrap();
    let nonce = info["nonce"].as_str().unwrap();
    let signature = identity
        .key
        .sign(&ring::rand::SystemRandom::new(), nonce.as_bytes())
        .unwrap();
    let connect = serde_json::json!({
        "verbose": false, "pedantic": false, "jwt": identity.cert_pem,
        "sig": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature.as_ref()),
    });
    let id = &identity.id;
    let beat = r#"{"version":"sim","hostname":"s","running_jobs":0}"#;
    let heartbeat = format!("PUB svc.agent.{id}.heartbeat {}\r\n{beat}\r\n", beat.len());
    let hello = format!("CONNECT {connect}\r\nSUB svc.agent.{id}.cmd 1\r\n{heartbeat}PING\r\n");
    write.write_all(hello.as_bytes()).await.unwrap();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        match line.trim_end() {
            "PONG" => break,
            "PING" => write.write_all(b"PONG\r\n").await.unwrap(),
            other if other.starts_with("-ERR") => panic!("{id}: {other}"),
            _ => {}
        }
    }
    connected.fetch_add(1, Ordering::Relaxed);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + phase, HEARTBEAT);
    let mut payload = Vec::new();
    loop {
        line.clear();
        tokio::select! {
            read = reader.read_line(&mut line) => {
                if read.unwrap_or(0) == 0 {
                    return;
                }
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.first().copied() {
                    Some("MSG") => {
                        let size: usize = words.last().unwrap().parse().unwrap();
                        payload.resize(size + 2, 0);
                        reader.read_exact(&mut payload).await.unwrap();
                        let command: AgentCommand = serde_json::from_slice(&payload[..size]).unwrap();
                        let reply = Reply {
                            job_id: command.job_id,
                            duration_ms: 0,
                            outcome: ReplyOutcome::Exec(ExecOutcome { stdout: "ok\n".into(), ..Default::default() }),
                        };
                        let body = serde_json::to_vec(&reply).unwrap();
                        let mut out = format!("PUB svc.agent.{id}.result {}\r\n", body.len()).into_bytes();
                        out.extend_from_slice(&body);
                        out.extend_from_slice(b"\r\n");
                        write.write_all(&out).await.unwrap();
                    }
                    Some("PING") => write.write_all(b"PONG\r\n").await.unwrap(),
                    _ => {}
                }
            }
            _ = tick.tick() => write.write_all(heartbeat.as_bytes()).await.unwrap(),
        }
    }
}

async fn connect_all(
    bus: &str,
    identities: Vec<Identity>,
    connected: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let base = connected.load(Ordering::Relaxed);
    let target = base + identities.len();
    let mut tasks = Vec::new();
    for (n, identity) in identities.into_iter().enumerate() {
        let phase = HEARTBEAT.mul_f64((n % 1000) as f64 / 1000.0);
        tasks.push(tokio::spawn(simulate(
            bus.to_string(),
            identity,
            phase,
            connected.clone(),
        )));
        // Keep at most ~200 logins in flight.
        while n + 1 - (connected.load(Ordering::Relaxed) - base) > 200 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    while connected.load(Ordering::Relaxed) < target {
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

/// One exec to every agent through the server: (first result, last result, results).
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

/// The bus floor: the same agents commanded by a bare client through the same broker.
async fn floor_round(server: &Server, identities: &[String]) -> (Duration, Duration) {
    let client = async_nats::ConnectOptions::with_token(server.key.clone())
        .connect(&server.bus)
        .await
        .unwrap();
    let mut results = client.subscribe("svc.agent.*.result").await.unwrap();
    client.flush().await.unwrap();
    let job_id = svc::ids::ulid();
    let command = serde_json::to_vec(&serde_json::json!({
        "job_id": job_id, "timeout_ms": 10000, "kind": "exec", "argv": ["true"],
    }))
    .unwrap();
    let command: bytes::Bytes = command.into();
    let started = Instant::now();
    for id in identities {
        client
            .publish(format!("svc.agent.{id}.cmd"), command.clone())
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let mut first = None;
    let mut count = 0;
    while count < identities.len() {
        let message = tokio::time::timeout(Duration::from_secs(10), results.next())
            .await
            .expect("floor answers")
            .unwrap();
        let reply: Reply = serde_json::from_slice(&message.payload).unwrap();
        if reply.job_id == job_id {
            first.get_or_insert_with(|| started.elapsed());
            count += 1;
        }
    }
    (first.unwrap(), started.elapsed())
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
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
    let server = Server::start(
        tempfile::tempdir().unwrap(),
        "agents: { heartbeat_timeout: 60s }\n",
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "fleet bench: {} exec agents, {} heartbeat agents, {} s CPU window (load: {})",
        options.agents,
        options.heartbeat_agents,
        options.seconds,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    runtime.block_on(async {
        let started = Instant::now();
        let identities = enrol(&server.bus, 0..options.agents, "exec").await;
        let rest = enrol(&server.bus, options.agents..options.heartbeat_agents, "load").await;
        println!(
            "enrolled {} agents over svc.enroll in {:.1} s",
            identities.len() + rest.len(),
            started.elapsed().as_secs_f64()
        );
        let ids: Vec<String> = identities.iter().map(|i| i.id.clone()).collect();
        let connected = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = connect_all(&server.bus, identities, &connected).await;
        wait_connected(&server, options.agents).await;
        println!(
            "{} simulated agents logged in and connected in {:.1} s",
            options.agents,
            started.elapsed().as_secs_f64()
        );

        // 1. exec fan-out, server vs bus floor.
        let _ = exec_round(&server, options.agents).await; // warm-up
        let _ = floor_round(&server, &ids).await;
        let (mut firsts, mut alls, mut floor_firsts, mut floor_alls) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (first, all) = exec_round(&server, options.agents).await;
            firsts.push(first);
            alls.push(all);
            let (first, all) = floor_round(&server, &ids).await;
            floor_firsts.push(first);
            floor_alls.push(all);
        }
        let (first, all) = (median(firsts), median(alls.clone()));
        let (floor_first, floor_all) = (median(floor_firsts), median(floor_alls));
        println!("\nexec fan-out to {} agents (median of {ROUNDS}):", options.agents);
        println!("  svc-server (gRPC Exec): first result {}, all results {} (best {})", ms(first), ms(all), ms(*alls.iter().min().unwrap()));
        println!("  bus floor (bare client): first result {}, all results {}", ms(floor_first), ms(floor_all));
        println!(
            "  ratio svc/floor, all results: {:.2}x   goal: all in <= 1 s: {}",
            all.as_secs_f64() / floor_all.as_secs_f64(),
            if all <= Duration::from_secs(1) { "met" } else { "NOT met" }
        );

        // 2. heartbeat load.
        let started = Instant::now();
        tasks.extend(connect_all(&server.bus, rest, &connected).await);
        wait_connected(&server, options.heartbeat_agents).await;
        println!(
            "\n{} agents connected in {:.1} s; settling for one heartbeat interval",
            options.heartbeat_agents,
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(HEARTBEAT).await;
        let pid = server.child.id();
        let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(options.seconds)).await;
        let used = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
        println!(
            "heartbeats: {} agents every {} s = {:.0}/s; server CPU {:.1}% of one core over {} s, RSS {} MiB   goal <= 25%: {}",
            options.heartbeat_agents,
            HEARTBEAT.as_secs(),
            options.heartbeat_agents as f64 / HEARTBEAT.as_secs_f64(),
            used,
            options.seconds,
            rss_kib(pid) / 1024,
            if used <= 25.0 { "met" } else { "NOT met" }
        );
        for task in tasks {
            task.abort();
        }
    });

    // 3. the real agent.
    let (idle, after) = real_agent_rss(&server);
    println!(
        "\nreal svc-agent RSS: {:.1} MiB idle after 5 s, {:.1} MiB after one exec   goal <= 10 MB: {}",
        idle as f64 / 1024.0,
        after as f64 / 1024.0,
        if idle * 1024 <= 10_000_000 { "met" } else { "NOT met" }
    );
    let _ = std::io::stdout().flush();
}
