//! Outbound webhook benchmark (issue 18), against the real server binary: 16 subscriptions
//! to one event type, a local receiver (HTTP/1.1 on loopback, answering 200 at once), events
//! emitted over gRPC; reports deliveries per second (goal ≥ 2,000/s with 16 subscriptions)
//! and event-to-delivery latency p50/p99 (the event's stored timestamp to the receiver
//! reading the request, millisecond resolution).
//!
//! Beside it, in the same run, the transport's own ceiling: 16 sequential senders (as the 16
//! subscriptions are) POSTing a body of the same size to a second receiver over a new
//! connection each, as the server does, with nothing else (no store, no signing, no events).
//!
//! `-- --events N` (or `SVC_BENCH_EVENTS=N`) sets the number of events (default 2,000, so
//! 32,000 deliveries; CI runs `--events 20` on the debug build);
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of the server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svc::proto::event_service_client::EventServiceClient;
use svc::proto::webhook_service_client::WebhookServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{authorized, run, Server};

const SUBSCRIPTIONS: usize = 16;
const EMITTERS: usize = 4;

fn main() {
    let events: usize = run::flag(
        "--events",
        std::env::var("SVC_BENCH_EVENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000),
    );
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = Server::start(root, "webhooks: { allow_private: true }\n");
    runtime.block_on(run(&server, events));
}

/// What the receiver saw: (receipt time, the event's timestamp) per delivery.
type Seen = Arc<Mutex<Vec<(i64, i64)>>>;

async fn receiver() -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::with_capacity(4096);
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(read) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buffer.len() < end + 4 + length {
                        continue;
                    }
                    let received = svc::clock::now_millis();
                    let body: serde_json::Value =
                        serde_json::from_slice(&buffer[end + 4..end + 4 + length])
                            .unwrap_or_default();
                    let stored = body["timestamp"]
                        .as_str()
                        .and_then(svc::clock::parse_rfc3339)
                        .unwrap_or(received);
                    log.lock().unwrap().push((received, stored));
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
            });
        }
    });
    (port, seen)
}

async fn run(server: &Server, events: usize) {
    let (port, seen) = receiver().await;
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut hooks = WebhookServiceClient::new(channel.clone());
    for _ in 0..SUBSCRIPTIONS {
        let request = svc::proto::CreateWebhookRequest {
            url: format!("http://127.0.0.1:{port}/hook"),
            event_types: vec!["command_completed".into()],
            ..Default::default()
        };
        hooks
            .create(authorized(&server.key, request))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for emitter in 0..EMITTERS {
        let mut client = EventServiceClient::new(channel.clone());
        let key = server.key.clone();
        tasks.push(tokio::spawn(async move {
            for _ in (emitter..events).step_by(EMITTERS) {
                let request = svc::proto::EmitEventRequest {
                    r#type: "command_completed".into(),
                    severity: String::new(),
                    source: "bench".into(),
                    payload_json: "{}".into(),
                };
                client.emit(authorized(&key, request)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let emitted = started.elapsed();
    let expected = events * SUBSCRIPTIONS;
    // Every delivery arrives, or the bench fails: a minute without a new one ends the wait.
    let (mut count, mut moved) = (0, Instant::now());
    while count < expected && moved.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = seen.lock().unwrap().len();
        if now > count {
            (count, moved) = (now, Instant::now());
        }
    }
    let elapsed = started.elapsed();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        expected,
        "deliveries received of {events} events x {SUBSCRIPTIONS} subscriptions (none for a minute)"
    );
    let mut latencies: Vec<i64> = seen.iter().map(|(got, stored)| got - stored).collect();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "webhooks: {events} events emitted in {emitted:.2?}; {} of {expected} deliveries to {SUBSCRIPTIONS} subscriptions in {elapsed:.2?} = {:.0} deliveries/s (goal 2,000)",
        seen.len(),
        seen.len() as f64 / elapsed.as_secs_f64()
    );
    println!(
        "event-to-delivery latency: p50 {} ms, p99 {} ms, max {} ms",
        at(0.50),
        at(0.99),
        latencies.last().copied().unwrap_or(0)
    );
    let rate = seen.len() as f64 / elapsed.as_secs_f64();
    let ceiling = ceiling(expected).await;
    println!(
        "ceiling: 16 sequential senders, a new connection per POST, same receiver: {ceiling:.0} POSTs/s; svc/ceiling = {:.2}x",
        rate / ceiling
    );
}

/// POSTs per second that 16 sequential senders reach against the same kind of receiver, a new
/// connection per request: what the delivery pipelines would do with zero cost of their own.
async fn ceiling(total: usize) -> f64 {
    let (port, seen) = receiver().await;
    let body = format!(
        "{{\"id\":\"{}\",\"seq\":1,\"type\":\"command_completed\",\"category\":\"job\",\"severity\":\"info\",\"source\":\"bench\",\"timestamp\":\"{}\",\"payload\":{{}}}}",
        svc::ids::random_base62(26),
        svc::clock::format_rfc3339(svc::clock::now_millis())
    );
    let request = format!(
        "POST /hook HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\nwebhook-id: msg_x\r\nwebhook-timestamp: 0\r\nwebhook-signature: v1,x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let request = Arc::new(request.into_bytes());
    let started = Instant::now();
    let mut senders = Vec::new();
    for sender in 0..SUBSCRIPTIONS {
        let request = request.clone();
        senders.push(tokio::spawn(async move {
            for _ in (sender..total).step_by(SUBSCRIPTIONS) {
                let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .unwrap();
                socket.write_all(&request).await.unwrap();
                let mut reply = Vec::new();
                let _ = socket.read_to_end(&mut reply).await;
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }
    let elapsed = started.elapsed();
    let count = seen.lock().unwrap().len();
    count as f64 / elapsed.as_secs_f64()
}
