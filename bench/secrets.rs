//! Secrets benchmarks against a real server process (the release binary cargo built for this
//! bench): transit encrypt of 1 KiB over gRPC with 16 concurrent clients, and KV get latency.
//!
//! Usage: cargo bench --bench secrets [-- --seconds 10]   (--seconds at most 20)
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server with the same clients.
//!
//! The server runs on loopback with a temporary data dir and the rate limit raised (the
//! default 50 req/s per key would measure the limiter). Every operation is authenticated and
//! writes its audit row, as in production. Client and server share the machine, so the
//! figures include the clients' own CPU. Bounded: well under a minute.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::proto::secrets_service_client::SecretsServiceClient;
use svc::proto::{self};
use tonic::transport::Channel;

mod common;
use common::{authorized, Server};

const CLIENTS: usize = 16;
const PAYLOAD: usize = 1024;
const KV_GETS: usize = 2000;

async fn client(server: &Server) -> SecretsServiceClient<Channel> {
    let channel = Channel::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    SecretsServiceClient::new(channel)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

async fn transit_encrypt(server: &Server, seconds: u64) -> f64 {
    let mut setup = client(server).await;
    setup
        .transit_create_key(authorized(
            &server.key,
            proto::TransitKeyRequest {
                name: "bench".into(),
                r#type: "aes256-gcm".into(),
                min_decryption_version: 0,
            },
        ))
        .await
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let payload = vec![0x5au8; PAYLOAD];
    // Warm-up, so connection set-up and the key cache are not measured.
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = client(server).await;
        let (key, done, stop, payload) = (
            server.key.clone(),
            done.clone(),
            stop.clone(),
            payload.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = proto::TransitRequest {
                    name: "bench".into(),
                    plaintext: payload.clone(),
                    ..Default::default()
                };
                client
                    .transit_encrypt(authorized(&key, request))
                    .await
                    .unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start_count = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let count = done.load(Ordering::Relaxed) - start_count;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    count as f64 / elapsed.as_secs_f64()
}

/// The ceiling: the standard gRPC health check (no key, no store, no audit) with the same
/// clients, so the ratio shows what the secrets path costs on top of gRPC itself.
async fn health_ceiling(server: &Server, seconds: u64) -> f64 {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let channel = Channel::from_shared(server.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let (done, stop) = (done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = HealthCheckRequest {
                    service: "svc.v1.SecretsService".into(),
                };
                client.check(request).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start_count = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let count = done.load(Ordering::Relaxed) - start_count;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    count as f64 / elapsed.as_secs_f64()
}

async fn kv_get(server: &Server) -> (Duration, Duration, Duration) {
    let mut client = client(server).await;
    let data = [("username", "app"), ("password", "x".repeat(32).as_str())]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    client
        .put(authorized(
            &server.key,
            proto::PutSecretRequest {
                path: "bench/db".into(),
                data,
            },
        ))
        .await
        .unwrap();
    let request = || {
        authorized(
            &server.key,
            proto::GetSecretRequest {
                path: "bench/db".into(),
                version: 0,
            },
        )
    };
    for _ in 0..100 {
        client.get(request()).await.unwrap();
    }
    let mut latencies = Vec::with_capacity(KV_GETS);
    for _ in 0..KV_GETS {
        let started = Instant::now();
        client.get(request()).await.unwrap();
        latencies.push(started.elapsed());
    }
    latencies.sort();
    (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        *latencies.last().unwrap(),
    )
}

/// Microseconds of server CPU per call, for a phase of `elapsed` at `rate` calls/s.
fn per_call(cpu: Duration, rate: f64, elapsed: Duration) -> f64 {
    cpu.as_secs_f64() * 1e6 / (rate * elapsed.as_secs_f64()).max(1.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10u64)
        .min(20);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = Server::start(tempfile::tempdir().unwrap(), "");
    runtime.block_on(async {
        // The server's CPU per call over each phase (/proc: user + system time).
        let pid = server.child.id();
        let (cpu, started) = (common::cpu_time(pid), Instant::now());
        let ops = transit_encrypt(&server, seconds).await;
        let transit_cpu = per_call(common::cpu_time(pid) - cpu, ops, started.elapsed());
        println!(
            "transit encrypt 1 KiB, {CLIENTS} gRPC clients, {seconds} s: {ops:.0} ops/s (goal >= 20000); server CPU {transit_cpu:.0} µs per op"
        );
        let (cpu, started) = (common::cpu_time(pid), Instant::now());
        let ceiling = health_ceiling(&server, seconds).await;
        let check_cpu = per_call(common::cpu_time(pid) - cpu, ceiling, started.elapsed());
        println!(
            "gRPC health check (ceiling), {CLIENTS} clients, {seconds} s: {ceiling:.0} ops/s; server CPU {check_cpu:.0} µs per call; transit/ceiling = {:.2}",
            ops / ceiling
        );
        let (p50, p99, max) = kv_get(&server).await;
        println!(
            "kv get, 1 client, {KV_GETS} requests: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (goal p99 <= 2 ms)",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
    });
}
