//! svc-files throughput (issue 15): a put and a get of one file through the real `svc-files`
//! CLI against a real single server (embedded broker, local disk), beside `cat FILE >
//! /dev/null` and a JetStream object-store put and get of the same file with async-nats
//! against Debian's `nats-server -js` (file storage in a temporary directory), in one run;
//! then the same in cluster mode: one member on PostgreSQL and a three-node nats-server
//! cluster (the file service's JetStream stream, R3) beside an R3 object store there.
//!
//! Usage: `cargo bench --bench files -- --mb 1024 --cluster-mb 256` (release; the defaults;
//! `--cluster-mb 0` leaves cluster mode out; `--mb` may also come from `SVC_FILES_BENCH_MB`).
//! A debug smoke run: `cargo bench --profile dev --bench files -- --mb 32 --cluster-mb 8`;
//! CI runs `--mb 2 --cluster-mb 2`.
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build, for both the server and the CLI.
//!
//! Prints MB/s (10^6 bytes per second) for each, and the ratios svc/JetStream and svc against
//! the 200 MB/s goal. The file lives in the target dir's temporary directory, so it and the
//! server's data dir are on the same disk; it is in the page cache for every reader (`cat`
//! says what reading it costs). Needs nats-server for the JetStream part (skipped without).

#[path = "../tests/common/nats_cluster.rs"]
#[allow(dead_code)]
mod nats_cluster;

#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{run, server_binary, Server};

fn main() {
    let mb: u64 = run::flag(
        "--mb",
        std::env::var("SVC_FILES_BENCH_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024),
    );
    let bytes = mb * 1024 * 1024;
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let file = root.path().join("input");
    write_input(&file, bytes);
    println!("svc-files bench: {mb} MiB ({bytes} bytes)");

    let cat = timed(|| {
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("cat '{}' > /dev/null", file.display()))
            .status()
            .expect("cat runs");
        assert!(status.success());
    });
    report("cat FILE > /dev/null", bytes, cat);

    let (put, get, get_file) = svc_files(root.path(), &file);
    let svc_put = report("svc-files put", bytes, put);
    // To stdout (/dev/null): what the JetStream get below does (into a sink, nothing synced).
    let svc_get = report("svc-files get (to stdout)", bytes, get);
    report("svc-files get (to a file, fsync'd)", bytes, get_file);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Room for the objects beside the test harness's 1 GB default cap.
    let gigabytes = bytes.div_ceil(1 << 30) * 2 + 1;
    std::env::set_var("SVC_TEST_NATS_MAX_FILE_STORE", format!("{gigabytes}GB"));
    let Some(nats) = runtime.block_on(nats_cluster::NatsCluster::start(1)) else {
        return;
    };
    let (put, get) = runtime.block_on(object_store(&nats, &file, bytes, 1));
    drop(nats);
    let js_put = report("JetStream object store put (R1, file)", bytes, put);
    let js_get = report("JetStream object store get", bytes, get);
    println!(
        "ratio svc/JetStream: put {:.2}x, get {:.2}x",
        svc_put / js_put,
        svc_get / js_get
    );
    println!(
        "svc vs 200 MB/s: put {:.2}x, get {:.2}x",
        svc_put / 200.0,
        svc_get / 200.0
    );
    let cluster_mb: u64 = run::flag("--cluster-mb", 256);
    if cluster_mb > 0 {
        cluster_mode(&runtime, root.path(), cluster_mb);
    }
}

/// Cluster mode: one svc member (PostgreSQL, a three-node nats-server cluster; the file
/// service keeps objects in its JetStream stream, R3) beside a JetStream object store with
/// three replicas on the same nodes, with a file of `mb` MiB (its own size: each byte is
/// stored six times on this one disk).
fn cluster_mode(runtime: &tokio::runtime::Runtime, root: &Path, mb: u64) {
    let bytes = mb * 1024 * 1024;
    let file = root.join("cluster-input");
    write_input(&file, bytes);
    println!("cluster mode: {mb} MiB, one member, three nats-server nodes (R3)");
    let Some(pg) = postgres::for_bench() else {
        run::missing_peer(
            "PostgreSQL (initdb)",
            "apt-get install postgresql",
            "cluster mode",
        );
        return;
    };
    let gigabytes = (bytes * 2).div_ceil(1 << 30) + 1;
    std::env::set_var("SVC_TEST_NATS_MAX_FILE_STORE", format!("{gigabytes}GB"));
    let Some(nats) = runtime.block_on(nats_cluster::NatsCluster::start(3)) else {
        return;
    };
    let urls: Vec<String> = nats.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let key = format!("svc_{}", svc::ids::random_base62(40));
    let config = format!(
        "store: {{ driver: postgres, url: \"{}\" }}\nbus: {{ external_urls: [{}] }}\n\
         streams: {{ max_bytes: 268435456 }}\ncluster:\n  enabled: true\n  member_id: m1\n",
        pg.fresh_database(),
        urls.join(", ")
    );
    let member = Server::start_member(
        tempfile::tempdir_in(root).expect("member dir"),
        &config,
        rand::random(),
        &key,
    );
    let (put, get, _) = svc_files_on(root, &file, &nats.urls()[0], &member.key, false);
    drop(member);
    let (js_put, js_get) = runtime.block_on(object_store(&nats, &file, bytes, 3));
    let svc_put = report("svc-files put (cluster mode)", bytes, put);
    let svc_get = report("svc-files get (cluster mode, to stdout)", bytes, get);
    let js_put = report("JetStream object store put (R3)", bytes, js_put);
    let js_get = report("JetStream object store get (R3)", bytes, js_get);
    println!(
        "ratio svc/JetStream in cluster mode: put {:.2}x, get {:.2}x",
        svc_put / js_put,
        svc_get / js_get
    );
}

/// A file of `bytes` that no chunk of which repeats (so nothing is deduplicated).
fn write_input(path: &Path, bytes: u64) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for word in block.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        out.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    out.flush().unwrap();
}

fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// Prints and returns MB/s.
fn report(what: &str, bytes: u64, took: Duration) -> f64 {
    let rate = bytes as f64 / 1e6 / took.as_secs_f64();
    println!("{what:<40} {:>8.2} s {rate:>9.1} MB/s", took.as_secs_f64());
    rate
}

/// A put, a get to stdout and a get to a file through the CLI (the same binary as the server,
/// by its `svc-files` name), against a single server.
fn svc_files(root: &Path, file: &Path) -> (Duration, Duration, Duration) {
    let server = Server::start(tempfile::tempdir_in(root).expect("server dir"), "");
    svc_files_on(root, file, &server.bus, &server.key, true)
}

/// The CLI against the file service on `bus` with `key`; the get to a file only `to_file`.
fn svc_files_on(
    root: &Path,
    file: &Path,
    bus: &str,
    key: &str,
    to_file: bool,
) -> (Duration, Duration, Duration) {
    let names = tempfile::tempdir_in(root).expect("names dir");
    let cli = names.path().join("svc-files");
    std::os::unix::fs::symlink(server_binary(), &cli).expect("symlink");
    let run = |args: &[&str]| {
        let output = Command::new(&cli)
            .env_clear()
            .env("SVC_NATS_URL", bus)
            .env("SVC_API_KEY", key)
            .args(args)
            .stdout(std::fs::File::create("/dev/null").expect("/dev/null"))
            .output()
            .expect("svc-files runs");
        assert!(
            output.status.success(),
            "svc-files {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let file = file.to_str().unwrap();
    let out = root.join("output");
    let put = timed(|| run(&["put", file, "bench/input"]));
    let get = timed(|| run(&["get", "bench/input", "-"]));
    if !to_file {
        return (put, get, Duration::ZERO);
    }
    let get_file = timed(|| run(&["get", "bench/input", out.to_str().unwrap()]));
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        std::fs::metadata(file).unwrap().len()
    );
    let _ = std::fs::remove_file(&out);
    (put, get, get_file)
}

/// A put and a get of the same file through a JetStream object store bucket (file storage,
/// `replicas` replicas) on `nats`.
async fn object_store(
    nats: &nats_cluster::NatsCluster,
    file: &Path,
    bytes: u64,
    replicas: usize,
) -> (Duration, Duration) {
    use async_nats::jetstream::object_store;
    let client = async_nats::connect(nats.urls()).await.expect("connect");
    let context = async_nats::jetstream::new(client);
    let bucket = context
        .create_object_store(object_store::Config {
            bucket: "bench".into(),
            storage: async_nats::jetstream::stream::StorageType::File,
            max_bytes: (bytes as i64) * 2,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("create bucket");
    let start = Instant::now();
    let mut input = tokio::fs::File::open(file).await.expect("open input");
    bucket.put("input", &mut input).await.expect("put");
    let put = start.elapsed();
    let start = Instant::now();
    let mut object = bucket.get("input").await.expect("get");
    let mut sink = tokio::io::sink();
    let copied = tokio::io::copy(&mut object, &mut sink).await.expect("read");
    let get = start.elapsed();
    assert_eq!(copied, bytes);
    (put, get)
}
