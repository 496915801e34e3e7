//! The store on PostgreSQL against the store on SQLite (issue 12), side by side in one run,
//! against the real release binary: audited API-key create over REST with 16 concurrent
//! clients (throughput and p50), and `svc-audit log` with two filters over 200,000 audit rows
//! (p50 over gRPC). The figures are reported as PostgreSQL / SQLite ratios.
//!
//! Usage: cargo bench --bench store [-- --audit-rows 200000 --seconds 6 --queries 100]
//! (rows rounded up to thousands, at least 2,000, which hold the 50 rows the audit query
//! reads); CI runs `--audit-rows 2000 --seconds 0.5 --queries 5` on the debug build.
//! PostgreSQL: a throwaway cluster (initdb/pg_ctl, as `nobody` when root), or the server at
//! `SVC_TEST_PG_URL` (an admin URL; a database is created per run). Both run on this machine,
//! so PostgreSQL's own CPU competes with the server's: the ratio is a floor for a database on
//! its own host.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

mod common;
use common::{run, Server};

#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;

const CLIENTS: usize = 16;

/// The sizes of one run (see the usage above).
#[derive(Clone, Copy)]
struct Sizes {
    audit_rows: i64,
    create_phase: Duration,
    queries: usize,
}

struct Figures {
    creates_per_second: f64,
    create_p50: Duration,
    log_p50: Duration,
}

fn main() {
    let sizes = Sizes {
        audit_rows: run::flag("--audit-rows", 200_000i64).max(2000),
        create_phase: run::seconds_flag("--seconds", 6.0),
        queries: run::flag("--queries", 100usize).max(1),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // PostgreSQL with its durability defaults, as SQLite here syncs its commits (the tests'
    // shared cluster turns fsync and synchronous commit off for speed). SVC_TEST_PG_URL still
    // names an existing server instead.
    let Some(cluster) = postgres::for_bench() else {
        eprintln!("skipped: no PostgreSQL (initdb) on this machine");
        return;
    };
    let url = cluster.fresh_database();

    let sqlite = measure(&runtime, sizes, "sqlite", "");
    let postgres = measure(
        &runtime,
        sizes,
        "postgres",
        &format!("store: {{ driver: postgres, url: \"{url}\" }}\n"),
    );
    println!();
    println!(
        "postgres / sqlite: API-key create throughput {:.2}x (goal >= 0.5x), create p50 {:.2}x, \
         audit log p50 {:.2}x (goal <= 2x)",
        postgres.creates_per_second / sqlite.creates_per_second,
        postgres.create_p50.as_secs_f64() / sqlite.create_p50.as_secs_f64(),
        postgres.log_p50.as_secs_f64() / sqlite.log_p50.as_secs_f64(),
    );
}

fn measure(
    runtime: &tokio::runtime::Runtime,
    sizes: Sizes,
    driver: &str,
    store_config: &str,
) -> Figures {
    let Sizes {
        audit_rows,
        create_phase,
        queries,
    } = sizes;
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let data = common::data_dir(root.path());
    std::fs::create_dir_all(&data).unwrap();
    let started = Instant::now();
    runtime.block_on(fill_audit(&data, store_config, audit_rows));
    println!(
        "[{driver}] set-up: {audit_rows} audit rows appended through the Store trait in {:.1?}",
        started.elapsed()
    );
    let mut server = Server::start(root, store_config);
    let http: SocketAddr = server.http.parse().unwrap();
    let (creates_per_second, create_p50, create_p99) =
        runtime.block_on(create_keys(http, &server.key, create_phase));
    println!(
        "[{driver}] API-key create (audited) over REST, {CLIENTS} clients, {create_phase:?}: \
         {creates_per_second:.0}/s, p50 {create_p50:.2?}, p99 {create_p99:.2?}"
    );
    let (log_p50, log_p99) = runtime.block_on(common::audit_log_latency(
        &server.grpc,
        &server.key,
        queries,
    ));
    println!(
        "[{driver}] audit log --action 'secret.*' --user user-3, limit 50, over {audit_rows} rows \
         (gRPC): p50 {log_p50:.2?}, p99 {log_p99:.2?}"
    );
    server.stop();
    Figures {
        creates_per_second,
        create_p50,
        log_p50,
    }
}

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

/// Appends the rows through the driver's own `append_audit_batch` (a chain the server's
/// `svc-audit verify` accepts), in batches as the auditor's group commit makes them.
async fn fill_audit(data: &std::path::Path, store_config: &str, audit_rows: i64) {
    let config: svc::config::StoreConfig = if store_config.is_empty() {
        Default::default()
    } else {
        let yaml: serde_json::Value = serde_yaml_ng::from_str(store_config).unwrap();
        serde_json::from_value(yaml["store"].clone()).unwrap()
    };
    let store = svc::store::open(&config, data).await.unwrap();
    let start = svc::clock::now_millis() - 86_400_000;
    let mut seq = 0;
    while seq < audit_rows {
        let rows = (0..1000)
            .map(|_| {
                seq += 1;
                let action = ACTIONS[(seq as usize) % ACTIONS.len()];
                svc::store::AuditRow {
                    id: svc::ids::ulid(),
                    timestamp: svc::clock::format_rfc3339(start + seq * 80),
                    user: format!("user-{}", seq % 10),
                    action: action.into(),
                    resource_type: action.split('.').next().unwrap().into(),
                    resource_id: format!("r{}", seq % 1000),
                    outcome: "success".into(),
                    severity: "medium".into(),
                    detail: "{}".into(),
                    ..Default::default()
                }
            })
            .collect();
        store
            .append_audit_batch(rows, svc::audit::chain::GENESIS, &svc::audit::chain::seal)
            .await
            .unwrap();
    }
    // A long-running database has planner statistics for a table this size (autovacuum keeps
    // them); a minute-old one may not yet, and then PostgreSQL plans the audit query blind.
    if config.driver == svc::config::StoreDriver::Postgres {
        let target = svc::store::postgres::Target::from_config(&config).unwrap();
        let client = target.connect().await.unwrap();
        client.batch_execute("ANALYZE").await.unwrap();
    }
}

/// 16 keep-alive clients creating keys for a fixed time; every create is authenticated,
/// checked, stored and audited before the 201.
async fn create_keys(http: SocketAddr, key: &str, phase: Duration) -> (f64, Duration, Duration) {
    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (client, stop, key) = (client.clone(), stop.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let body = format!(r#"{{"name":"bench-{c}-{n}","role":"readonly"}}"#);
                let request = http::Request::post(format!("http://{http}/api/v1/apikeys"))
                    .header("authorization", format!("Bearer {key}"))
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from(body)))
                    .unwrap();
                let started = Instant::now();
                let response = client.request(request).await.unwrap();
                let status = response.status();
                let _ = response.into_body().collect().await.unwrap();
                assert_eq!(status, 201, "create failed");
                times.push(started.elapsed());
            }
            times
        }));
    }
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await.unwrap());
    }
    times.sort();
    let rate = times.len() as f64 / phase.as_secs_f64();
    (rate, times[times.len() / 2], times[times.len() * 99 / 100])
}
