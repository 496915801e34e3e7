//! Snapshot benchmarks (issue 13), against the real release binary and CLI:
//! `svc-cluster-backup backup` of a data dir holding 1,000,000 audit rows (SQLite) and
//! 1,000,000 events (stream log) against `tar czf` of the same data dir in the same run;
//! `svc-cluster-backup restore --force` of that snapshot into a fresh data dir; and the p99 of
//! a cheap authenticated request (gRPC AuditLog, limit 1) idle and while a snapshot is taken.
//!
//! The rows and events are written straight into the data dir first (the shared fills of
//! bench/common), as bench/events.rs does. Loopback only; bounded to a couple of minutes.
//!
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server and CLI.
//!
//! Smaller runs: `-- --events N --audit-rows N --idle-seconds S` (defaults 1,000,000,
//! 1,000,000, 4); CI runs `--events 2000 --audit-rows 2000 --idle-seconds 0.5` on the debug
//! build.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{authorized, run, server_binary, Server};

fn main() {
    let events: u64 = run::flag("--events", 1_000_000);
    let audit_rows: i64 = run::flag("--audit-rows", 1_000_000);
    // How long the idle latency is sampled.
    let idle_phase = run::seconds_flag("--idle-seconds", 4.0);
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir");
    let root_path = root.path().to_path_buf();
    let data = common::data_dir(&root_path);
    std::fs::create_dir_all(&data).unwrap();
    let policies = root_path.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

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

    let bin = scratch.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let cli = bin.join("svc-cluster-backup");
    std::os::unix::fs::symlink(server_binary(), &cli).unwrap();

    let mut server = Server::start(root, &format!("policy_dir: {}\n", policies.display()));
    let (grpc, key) = (server.grpc_addr.clone(), server.key.clone());
    let data_bytes = dir_size(&data);
    println!(
        "data dir: {data_bytes} bytes ({:.1} MiB): svc.db {:.1} MiB, jetstream/ {:.1} MiB",
        mib(data_bytes),
        mib(file_size(&data.join("svc.db"))),
        mib(dir_size(&data.join("jetstream")))
    );

    // Idle request latency first, before any snapshot has warmed or loaded anything.
    let idle = runtime.block_on(probe(&server.grpc, &key, || false, Some(idle_phase)));

    // Our snapshot, alone.
    let snapshot = scratch.path().join("snapshot.tar.gz");
    let started = Instant::now();
    let taken = backup(&cli, &grpc, &key, &snapshot)
        .wait_with_output()
        .unwrap();
    let snapshot_secs = started.elapsed().as_secs_f64();
    check("svc-cluster-backup backup", &taken);
    let snapshot_bytes = file_size(&snapshot);
    let ours = mb(data_bytes) / snapshot_secs;
    println!(
        "svc-cluster-backup backup: {snapshot_secs:.2} s, snapshot {snapshot_bytes} bytes ({:.1} MiB), {ours:.1} MB/s of data dir",
        mib(snapshot_bytes)
    );

    // The reference: tar czf of the same data dir (the server up and idle), same disk.
    let tarball = scratch.path().join("reference.tar.gz");
    let started = Instant::now();
    let tarred = Command::new("tar")
        .arg("czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&root_path)
        .arg("data")
        .output()
        .unwrap();
    let tar_secs = started.elapsed().as_secs_f64();
    // 1 is "file changed as we read it" (the live server's files), which still writes the tar.
    assert!(
        matches!(tarred.status.code(), Some(0 | 1)),
        "tar czf: {}",
        String::from_utf8_lossy(&tarred.stderr)
    );
    let tar_bytes = file_size(&tarball);
    let theirs = mb(data_bytes) / tar_secs;
    println!(
        "tar czf: {tar_secs:.2} s, {tar_bytes} bytes ({:.1} MiB), {theirs:.1} MB/s; ours/tar = {:.2}x (goal >= 0.5x)",
        mib(tar_bytes),
        ours / theirs
    );
    std::fs::remove_file(&tarball).unwrap();

    // Request latency while a second snapshot is taken.
    let during_file = scratch.path().join("during.tar.gz");
    let mut during = backup(&cli, &grpc, &key, &during_file);
    let started = Instant::now();
    let busy = runtime.block_on(probe(
        &server.grpc,
        &key,
        || during.try_wait().unwrap().is_some(),
        None,
    ));
    let during_secs = started.elapsed().as_secs_f64();
    check(
        "svc-cluster-backup backup (during probe)",
        &during.wait_with_output().unwrap(),
    );
    std::fs::remove_file(&during_file).unwrap();
    let (idle_p50, idle_p99) = percentiles(idle.clone());
    let (busy_p50, busy_p99) = percentiles(busy.clone());
    println!(
        "AuditLog limit 1 (gRPC, one client) idle {:.1?}: {} calls, p50 {idle_p50:.2?}, p99 {idle_p99:.2?}",
        idle_phase,
        idle.len()
    );
    println!(
        "AuditLog limit 1 while a snapshot runs ({during_secs:.2} s): {} calls, p50 {busy_p50:.2?}, p99 {busy_p99:.2?}; p99 during/idle = {:.2}x (goal <= 2x)",
        busy.len(),
        busy_p99.as_secs_f64() / idle_p99.as_secs_f64()
    );

    // Restore, offline, into a fresh data dir with the server's master_key and hmacsecret.
    server.stop();
    let target = scratch.path().join("restored");
    std::fs::create_dir_all(target.join("policies")).unwrap();
    let config = restore_config(&root_path.join("server.yaml"), &target);
    let started = Instant::now();
    let restored = Command::new(&cli)
        .env_clear()
        .args(["restore", "--force", "--input"])
        .arg(&snapshot)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let restore_secs = started.elapsed().as_secs_f64();
    check("svc-cluster-backup restore", &restored);
    println!(
        "svc-cluster-backup restore --force: {restore_secs:.2} s ({:.1} MB/s of data dir); restore/snapshot = {:.2}x (goal <= 2x)",
        mb(data_bytes) / restore_secs,
        restore_secs / snapshot_secs
    );
    println!(
        "restored data dir: {} bytes ({:.1} MiB)",
        dir_size(&target.join("data")),
        mib(dir_size(&target.join("data")))
    );
    drop(server);
}

/// `svc-cluster-backup backup --output FILE` against the server, started (not waited for).
fn backup(cli: &Path, grpc: &str, key: &str, output: &Path) -> Child {
    // A clean environment: cargo sets SVC_* build variables that the CLI would read.
    Command::new(cli)
        .env_clear()
        .args(["--server", grpc, "--api-key", key, "backup", "--output"])
        .arg(output)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn check(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what}: {}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The server's configuration with its data dir and policy dir moved under `target`: the same
/// master_key and hmacsecret.
fn restore_config(server_config: &Path, target: &Path) -> PathBuf {
    let text = std::fs::read_to_string(server_config).unwrap();
    let moved: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("data_dir:") {
                format!("data_dir: {}", target.join("data").display())
            } else if line.starts_with("policy_dir:") {
                format!("policy_dir: {}", target.join("policies").display())
            } else {
                line.to_string()
            }
        })
        .collect();
    let path = target.join("server.yaml");
    std::fs::write(&path, moved.join("\n") + "\n").unwrap();
    path
}

/// Calls AuditLog (no filter, limit 1) back to back on one channel until `done()` says so or
/// `phase` has passed, at least once (a small snapshot may be done before the first call);
/// each call's latency.
async fn probe(
    grpc_url: &str,
    key: &str,
    mut done: impl FnMut() -> bool,
    phase: Option<Duration>,
) -> Vec<Duration> {
    let channel = tonic::transport::Endpoint::from_shared(grpc_url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = svc::proto::policy_service_client::PolicyServiceClient::new(channel);
    let deadline = phase.map(|phase| Instant::now() + phase);
    let mut times = Vec::new();
    loop {
        let over = done() || deadline.is_some_and(|deadline| Instant::now() >= deadline);
        if over && !times.is_empty() {
            break;
        }
        let request = svc::proto::AuditLogRequest {
            page: Some(svc::proto::PageRequest {
                limit: 1,
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
        assert_eq!(page.items.len(), 1);
    }
    times
}

/// (p50, p99).
fn percentiles(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The bytes of every regular file under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            total += dir_size(&entry.path());
        } else if kind.is_file() {
            total += entry.metadata().unwrap().len();
        }
    }
    total
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
