//! Cluster mode (issue 14), against the real release binary, on one machine:
//!
//! 1. failover: three members on PostgreSQL and a three-node nats-server cluster with
//!    JetStream, default timing (1 s heartbeats, 5 s lease); the leader is killed with
//!    SIGKILL and a survivor is polled over gRPC until another member holds the lease (from
//!    then on it does the leader-only work). Three rounds, each on a fresh set of members.
//! 2. durable emit throughput over gRPC with 16 clients: spread over three members, against
//!    the same clients on one member of a one-member cluster (same NATS cluster and
//!    PostgreSQL), and, for context, a single server on its defaults (local stream log).
//!
//! Usage: cargo bench --bench cluster [-- --rounds 3 --seconds 8] (failover rounds, seconds of
//! each emit phase); CI runs `--rounds 1 --seconds 0.5` on the debug build.
//! Everything shares the machine's cores: three members, three nats-servers, PostgreSQL and
//! the clients. The 3-vs-1 ratio is CPU-bound here and says nothing of separate hosts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::proto::event_service_client::EventServiceClient;

mod common;
use common::{authorized, run, Server};

#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;

#[path = "../tests/common/nats_cluster.rs"]
#[allow(dead_code)]
mod nats_cluster;

#[path = "common/members.rs"]
mod members;
use members::leader;

const EMITTERS: usize = 16;

fn main() {
    let rounds = run::flag("--rounds", 3usize).max(1);
    let emit_phase = run::seconds_flag("--seconds", 8.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(pg) = postgres::for_bench() else {
        eprintln!("skipped: no PostgreSQL (initdb) on this machine");
        return;
    };
    let Some(nats) = runtime.block_on(nats_cluster::NatsCluster::start(3)) else {
        return;
    };

    let mut failovers = Vec::new();
    for round in 0..rounds {
        let members = start_members(&runtime, &pg, &nats, 3, "");
        let took = runtime.block_on(failover(&members));
        eprintln!("round {}: new leader after {took:?}", round + 1);
        failovers.push(took);
    }
    failovers.sort();

    let three = start_members(&runtime, &pg, &nats, 3, "");
    let grpc: Vec<String> = three.iter().map(|m| m.grpc.clone()).collect();
    let through_three = runtime.block_on(emit_throughput(&grpc, &three[0].key, emit_phase));
    drop(three);
    let one = start_members(&runtime, &pg, &nats, 1, "");
    let through_one = runtime.block_on(emit_throughput(
        std::slice::from_ref(&one[0].grpc),
        &one[0].key,
        emit_phase,
    ));
    drop(one);
    let single_root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let single = Server::start(single_root, "");
    let through_single = runtime.block_on(emit_throughput(
        std::slice::from_ref(&single.grpc),
        &single.key,
        emit_phase,
    ));
    drop(single);

    println!("cluster failover (kill -9 of the leader → another member holds the lease), {rounds} rounds:");
    println!(
        "  min {:.2} s, median {:.2} s, max {:.2} s (goal ≤ 10 s, target 5 s; lease_ttl 5 s)",
        failovers[0].as_secs_f64(),
        failovers[rounds / 2].as_secs_f64(),
        failovers[rounds - 1].as_secs_f64()
    );
    println!(
        "durable emit over gRPC, {EMITTERS} clients, {:.1} s each:",
        emit_phase.as_secs_f64()
    );
    println!("  3 members (JetStream R3):       {through_three:>8.0} emits/s");
    println!("  1 member  (JetStream R3):       {through_one:>8.0} emits/s");
    println!("  single server (local log):      {through_single:>8.0} emits/s");
    println!(
        "  ratio 3 members / 1 member: {:.2}x (all on this machine's 2 cores)",
        through_three / through_one
    );
}

/// `count` members named m1.. on a fresh database of `pg` and every node of `nats`.
fn start_members(
    runtime: &tokio::runtime::Runtime,
    pg: &postgres::Postgres,
    nats: &nats_cluster::NatsCluster,
    count: usize,
    cluster_extra: &str,
) -> Vec<Server> {
    let mut cluster = members::Cluster::new(pg.fresh_database(), nats.urls());
    cluster.extra = cluster_extra;
    cluster.start(runtime, count)
}

/// Kills the leader and returns how long until a survivor reports another one.
async fn failover(members: &[Server]) -> Duration {
    let old = leader(&members[0]).await;
    let index: usize = old.trim_start_matches('m').parse::<usize>().unwrap() - 1;
    let witness = &members[(index + 1) % members.len()];
    unsafe { libc::kill(members[index].child.id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    loop {
        let now = leader(witness).await;
        if !now.is_empty() && now != old {
            return killed.elapsed();
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no new leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Emits per second from `EMITTERS` clients spread round-robin over `grpc`.
async fn emit_throughput(grpc: &[String], key: &str, phase: Duration) -> f64 {
    let total = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + phase;
    let mut tasks = Vec::new();
    for index in 0..EMITTERS {
        let channel = tonic::transport::Endpoint::from_shared(grpc[index % grpc.len()].clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = EventServiceClient::new(channel);
        let (key, total) = (key.to_string(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while Instant::now() < deadline {
                let request = svc::proto::EmitEventRequest {
                    r#type: "command_completed".into(),
                    severity: String::new(),
                    source: format!("bench-{index}"),
                    payload_json: "{\"exit_code\":0}".into(),
                };
                client.emit(authorized(&key, request)).await.unwrap();
                mine += 1;
            }
            total.fetch_add(mine, Ordering::Relaxed);
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
