//! Events and audit benchmarks (issue 5), against the real release binary:
//! durable emit throughput over gRPC with 16 concurrent clients; `svc-events replay -o json`
//! of 1,000,000 stored events; `svc-audit log` with two filters over 1,000,000 rows; and the
//! cost the audit append adds to an operation.
//!
//! The million events and rows are written straight into a fresh data dir first (the stream
//! log API and SQLite, with a valid hash chain), because emitting them one by one would make
//! the set-up the benchmark. Loopback only; bounded to a few minutes.
//!
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server with the same clients (the
//! set-up and the in-process audit-append figure always use this build's library).
//! `SVC_BENCH_EMIT_ONLY=1` runs only the emit phase and its ceiling, on an empty data dir (for
//! A/B runs in a short quiet window). Both phases also report the server's CPU per call (user +
//! system time from /proc over the phase, divided by the calls answered).
//!
//! Smaller runs: `-- --events N --audit-rows N --seconds S --appends N` (defaults 1,000,000,
//! 1,000,000, 8, 2,000; at least 2,000 audit rows, which hold the 50 rows the audit query
//! reads); CI runs `--events 2000 --audit-rows 2000 --seconds 0.5 --appends 50` on the debug
//! build.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::proto::event_service_client::EventServiceClient;

mod common;
use common::{authorized, run, server_binary, Server};

const EMITTERS: usize = 16;

/// The sizes of one run (see the usage above).
struct Sizes {
    events: u64,
    audit_rows: i64,
    emit_phase: Duration,
    appends: usize,
}

fn main() {
    let Sizes {
        events,
        audit_rows,
        emit_phase,
        appends,
    } = Sizes {
        events: run::flag("--events", 1_000_000),
        audit_rows: run::flag("--audit-rows", 1_000_000i64).max(2000),
        emit_phase: run::seconds_flag("--seconds", 8.0),
        appends: run::flag("--appends", 2000usize).max(1),
    };
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let data = common::data_dir(root.path());
    std::fs::create_dir_all(&data).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let emit_only = std::env::var_os("SVC_BENCH_EMIT_ONLY").is_some();
    if !emit_only {
        let started = Instant::now();
        runtime.block_on(common::fill_events(&data, events));
        println!(
            "set-up: {events} events written to the stream log in {:.1?}",
            started.elapsed()
        );
        let started = Instant::now();
        common::fill_audit(&data, audit_rows);
        println!(
            "set-up: {audit_rows} audit rows written to SQLite in {:.1?}",
            started.elapsed()
        );
        audit_overhead(&runtime, &data, appends);
    }

    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["svc-events", "svc-audit"] {
        std::os::unix::fs::symlink(server_binary(), bin.join(name)).unwrap();
    }
    let mut server = Server::start(root, "");
    let (grpc, key) = (server.grpc_addr.clone(), server.key.clone());
    let pid = server.child.id();

    let cpu = common::cpu_time(pid);
    let (rate, per_client, emitted) = runtime.block_on(emit_throughput(&grpc, &key, emit_phase));
    let emit_cpu = (common::cpu_time(pid) - cpu).as_secs_f64() * 1e6 / emitted.max(1) as f64;
    println!("emit (durable, audited) over gRPC, {EMITTERS} clients, {emit_phase:?}: {rate:.0} events/s (goal 30,000; slowest client {per_client} events); server CPU {emit_cpu:.0} µs per emit");
    let cpu = common::cpu_time(pid);
    let (ceiling, checks) = runtime.block_on(health_ceiling(&grpc, emit_phase));
    let check_cpu = (common::cpu_time(pid) - cpu).as_secs_f64() * 1e6 / checks.max(1) as f64;
    println!(
        "gRPC health check (ceiling: no key, no store, no log), same clients, {emit_phase:?}: {ceiling:.0} calls/s; server CPU {check_cpu:.0} µs per call; emit/ceiling = {:.2}",
        rate / ceiling
    );
    if emit_only {
        server.stop();
        return;
    }

    let started = Instant::now();
    let mut replay = Command::new(bin.join("svc-events"))
        .args([
            "--server",
            &grpc,
            "--api-key",
            &key,
            "-o",
            "json",
            "replay",
            "--since",
            "2000-01-01T00:00:00Z",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(replay.stdout.take().unwrap())
        .lines()
        .count() as u64;
    replay.wait().unwrap();
    let elapsed = started.elapsed();
    println!(
        "svc-events replay -o json: {lines} events in {elapsed:.2?} = {:.0} events/s (goal 200,000)",
        lines as f64 / elapsed.as_secs_f64()
    );

    let (p50, p99) = runtime.block_on(common::audit_log_latency(
        &format!("http://{grpc}"),
        &key,
        50,
    ));
    println!("audit log, --action 'secret.*' --user user-3, limit 50, over {audit_rows} rows (gRPC): p50 {p50:.2?}, p99 {p99:.2?} (goal p50 20 ms)");
    let mut cli_times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let output = Command::new(bin.join("svc-audit"))
            .args([
                "--server",
                &grpc,
                "--api-key",
                &key,
                "-o",
                "json",
                "log",
                "--action",
                "secret.*",
                "--user",
                "user-3",
            ])
            .output()
            .unwrap();
        assert!(output.status.success());
        cli_times.push(started.elapsed());
    }
    cli_times.sort();
    println!(
        "the same through the svc-audit CLI (process start included): p50 {:.2?}",
        cli_times[cli_times.len() / 2]
    );

    server.stop();
}

/// What one audit append costs (`appends` of them), measured in-process on the database
/// filled above.
fn audit_overhead(runtime: &tokio::runtime::Runtime, data: &Path, appends: usize) {
    let copy = data.with_file_name("overhead.db");
    std::fs::copy(data.join("svc.db"), &copy).unwrap();
    let store: Arc<dyn svc::store::Store> = Arc::new(svc::store::SqliteStore::open(&copy).unwrap());
    let auditor = svc::audit::Auditor::new(store, data.join("no-policies"));
    let principal = svc::auth::Principal::server();
    // From a task on the runtime, as a request handler calls it: the group commit's write runs
    // as a task, which from `block_on`'s thread would cross threads twice per append.
    let mut times = runtime
        .block_on(runtime.spawn(async move {
            let mut times = Vec::new();
            for i in 0..appends {
                let action = svc::audit::Action::new("apikey.create", "apikey", format!("k{i}"))
                    .detail(serde_json::json!({"name": "bench", "role": "readonly"}));
                let started = Instant::now();
                auditor.append(&principal, action, "success").await.unwrap();
                times.push(started.elapsed());
            }
            times
        }))
        .unwrap();
    times.sort();
    println!(
        "audit append (added to each audited operation, e.g. an API-key create): p50 {:.3?}, p99 {:.3?} (goal 1 ms)",
        times[times.len() / 2],
        times[times.len() * 99 / 100]
    );
}

/// (events/s, the slowest client's count, events emitted).
async fn emit_throughput(grpc: &str, key: &str, phase: Duration) -> (f64, u64, u64) {
    let total = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + phase;
    let mut tasks = Vec::new();
    for client_index in 0..EMITTERS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = EventServiceClient::new(channel);
        let key = key.to_string();
        let total = total.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while Instant::now() < deadline {
                let request = svc::proto::EmitEventRequest {
                    r#type: "command_completed".into(),
                    severity: String::new(),
                    source: format!("bench-{client_index}"),
                    payload_json: "{\"exit_code\":0}".into(),
                };
                client.emit(authorized(&key, request)).await.unwrap();
                mine += 1;
            }
            total.fetch_add(mine, Ordering::Relaxed);
            mine
        }));
    }
    let started = Instant::now();
    let mut slowest = u64::MAX;
    for task in tasks {
        slowest = slowest.min(task.await.unwrap());
    }
    (
        total.load(Ordering::Relaxed) as f64
            / started.elapsed().as_secs_f64().max(phase.as_secs_f64()),
        slowest,
        total.load(Ordering::Relaxed),
    )
}

/// The same clients calling the standard gRPC health check: what the machine allows a unary
/// call at the moment, so that an emit figure taken under load can be read against it.
/// Returns (calls/s, calls).
async fn health_ceiling(grpc: &str, phase: Duration) -> (f64, u64) {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let total = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + phase;
    let mut tasks = Vec::new();
    for _ in 0..EMITTERS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let total = total.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while Instant::now() < deadline {
                let request = HealthCheckRequest {
                    service: "svc.v1.EventService".into(),
                };
                client.check(request).await.unwrap();
                mine += 1;
            }
            total.fetch_add(mine, Ordering::Relaxed);
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let calls = total.load(Ordering::Relaxed);
    (
        calls as f64 / started.elapsed().as_secs_f64().max(phase.as_secs_f64()),
        calls,
    )
}
