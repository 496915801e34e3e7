//! Bus benchmark: the embedded broker against nats-server, same async-nats client, one run.
//!
//! `cargo bench --bench bus [-- --scale 1 --rounds 2]`: `--scale` multiplies every scenario's
//! message count (CI runs `--scale 0.01 --rounds 1` on the debug build). Our broker runs in a separate OS process (this binary re-run
//! with `SVC_BUS_BENCH_BROKER=1`, a 2-worker tokio runtime), like nats-server, so neither
//! shares a runtime or allocator with the client. Everything is on loopback; every scenario
//! is bounded by a message count and a timeout, so the whole run stays well under three
//! minutes. Prints one table with ratios ours / nats-server (higher is better for
//! throughput, lower for latency). `--tls` runs every scenario over TLS on both brokers (a
//! test CA's certificate for 127.0.0.1; the clients trust that CA): TLS costs, rustls's
//! included, side by side with nats-server's Go TLS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

/// Progress stalls longer than this end a scenario (messages dropped as slow consumers).
const STALL: Duration = Duration::from_secs(3);

mod brokers;
use brokers::{start_nats_server_with, start_ours_with};
#[path = "../tests/common/pki.rs"]
#[allow(dead_code)]
mod pki;
#[path = "common/run.rs"]
mod run;

fn main() {
    brokers::main(run_benchmarks());
}

/// The CA the clients trust under `--tls`.
static TLS_CA: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

async fn connect(url: &str) -> async_nats::Client {
    let mut options = async_nats::ConnectOptions::new().subscription_capacity(1 << 20);
    if let Some(ca) = TLS_CA.get() {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    options.connect(url).await.expect("connect")
}

/// Counts messages on every subscription given, into one counter.
fn count_into(counter: Arc<AtomicU64>, mut subscription: async_nats::Subscriber) {
    tokio::spawn(async move {
        while subscription.next().await.is_some() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Waits until `counter` reaches `target` or stops moving; returns (count, elapsed).
async fn wait_for_count(counter: &AtomicU64, target: u64, started: Instant) -> (u64, Duration) {
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        let now = counter.load(Ordering::Relaxed);
        if now >= target {
            return (now, started.elapsed());
        }
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if last_change.elapsed() > STALL {
            return (now, last_change.duration_since(started));
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Messages delivered per second for `publishers` → `subscribers` (all plain subs, or one
/// queue group).
async fn throughput(
    url: &str,
    size: usize,
    messages: u64,
    subscribers: usize,
    queue: bool,
) -> (f64, u64, u64) {
    let counter = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..subscribers {
        let client = connect(url).await;
        let subscription = if queue {
            client
                .queue_subscribe("bench", "workers".into())
                .await
                .expect("queue sub")
        } else {
            client.subscribe("bench").await.expect("sub")
        };
        client.flush().await.expect("flush");
        count_into(counter.clone(), subscription);
        clients.push(client);
    }
    let publisher = connect(url).await;
    let payload = bytes::Bytes::from(vec![b'x'; size]);
    let expected = if queue {
        messages
    } else {
        messages * subscribers as u64
    };
    let started = Instant::now();
    for _ in 0..messages {
        publisher
            .publish("bench", payload.clone())
            .await
            .expect("publish");
    }
    publisher.flush().await.expect("flush");
    let (received, elapsed) = wait_for_count(&counter, expected, started).await;
    (received as f64 / elapsed.as_secs_f64(), received, expected)
}

/// Sequential request/reply round trips; returns (p50, p99) in microseconds.
async fn round_trips(url: &str, count: usize) -> (f64, f64) {
    let responder = connect(url).await;
    let mut service = responder.subscribe("bench.rpc").await.expect("sub");
    responder.flush().await.expect("flush");
    let replier = responder.clone();
    tokio::spawn(async move {
        while let Some(request) = service.next().await {
            if let Some(reply) = request.reply {
                let _ = replier.publish(reply, request.payload).await;
            }
        }
    });
    let requester = connect(url).await;
    let payload = bytes::Bytes::from_static(b"ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-bytes-ping-128-");
    for _ in 0..count.min(200) {
        requester
            .request("bench.rpc", payload.clone())
            .await
            .expect("warm-up");
    }
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        requester
            .request("bench.rpc", payload.clone())
            .await
            .expect("request");
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
    }
    latencies.sort_by(f64::total_cmp);
    let at = |quantile: f64| {
        latencies[((latencies.len() as f64 * quantile) as usize).min(latencies.len() - 1)]
    };
    (at(0.50), at(0.99))
}

struct Row {
    name: String,
    unit: &'static str,
    higher_is_better: bool,
    values: Vec<(f64, String)>,
    /// CPU ns per message (broker, client) per column, for the throughput scenarios.
    cpu: Vec<Option<(f64, f64)>>,
}

/// A scenario's message count times `--scale` (at least 1).
fn scaled(messages: u64) -> u64 {
    ((messages as f64 * run::flag("--scale", 1.0f64)) as u64).max(1)
}

/// CPU time (user + system, every thread) `pid` has used so far, from each thread's
/// schedstat: nanosecond resolution, where /proc/PID/stat counts 10 ms ticks.
fn cpu_nanos(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A scenario's CPU per delivered message, broker and client apart, in nanoseconds: on two
/// shared cores the throughput ratio moves with the client's share, this does not.
struct Cpu {
    broker: u64,
    client: u64,
}

impl Cpu {
    fn start(broker: u32) -> Self {
        Cpu {
            broker: cpu_nanos(broker),
            client: cpu_nanos(std::process::id()),
        }
    }

    /// (broker, client) ns per message since `start`.
    fn per_message(&self, broker: u32, messages: u64) -> (f64, f64) {
        let messages = messages.max(1) as f64;
        (
            cpu_nanos(broker).saturating_sub(self.broker) as f64 / messages,
            cpu_nanos(std::process::id()).saturating_sub(self.client) as f64 / messages,
        )
    }
}

/// One measured scenario: name, unit, higher is better, value, note, and CPU per message
/// (broker, client) for the throughput scenarios.
type Measured = (String, &'static str, bool, f64, String, Option<(f64, f64)>);

/// Whether a scenario runs: `--only TEXT` keeps those whose name contains TEXT (profiling one
/// case at a time).
fn wanted(name: &str) -> bool {
    let only: String = run::flag("--only", String::new());
    name.contains(&only)
}

async fn scenario_rows(url: &str, pid: u32) -> Vec<Measured> {
    // name, unit, payload size, messages, subscribers, one queue group
    let scenarios = [
        ("pub->sub 16 B", "msg/s", 16usize, 400_000u64, 1usize, false),
        ("pub->sub 128 B", "msg/s", 128, 400_000, 1, false),
        ("pub->sub 1024 B", "msg/s", 1024, 200_000, 1, false),
        ("pub->sub 65536 B", "msg/s", 64 * 1024, 8_000, 1, false),
        (
            "fan-out 128 B x10 subs",
            "deliveries/s",
            128,
            50_000,
            10,
            false,
        ),
        (
            "queue group 128 B, 4 members",
            "msg/s",
            128,
            200_000,
            4,
            true,
        ),
    ];
    let mut rows = Vec::new();
    for (name, unit, size, messages, subscribers, queue) in scenarios {
        if !wanted(name) {
            continue;
        }
        let cpu = Cpu::start(pid);
        let (rate, received, expected) =
            throughput(url, size, scaled(messages), subscribers, queue).await;
        rows.push((
            name.to_string(),
            unit,
            true,
            rate,
            format!("{received}/{expected}"),
            Some(cpu.per_message(pid, received)),
        ));
    }
    if !wanted("request/reply") {
        return rows;
    }
    let (p50, p99) = round_trips(url, scaled(5_000) as usize).await;
    rows.push((
        "request/reply p50".into(),
        "us",
        false,
        p50,
        String::new(),
        None,
    ));
    rows.push((
        "request/reply p99".into(),
        "us",
        false,
        p99,
        String::new(),
        None,
    ));
    rows
}

async fn run_benchmarks() {
    let started = Instant::now();
    let pki = std::env::args()
        .any(|arg| arg == "--tls")
        .then(pki::Pki::new);
    let tls_dir = pki.as_ref().map(|pki| pki.path(""));
    if let Some(pki) = &pki {
        TLS_CA.set(pki.path("ca.pem")).expect("set once");
    }
    let Some(reference) = start_nats_server_with(tls_dir.as_deref()) else {
        run::missing_peer(
            "nats-server",
            "apt-get install nats-server",
            "the bus benchmark (it compares against it)",
        );
        return;
    };
    let rounds = run::flag("--rounds", 2usize).max(1);
    let ours = start_ours_with(tls_dir.as_deref());
    let mut table: Vec<Row> = Vec::new();
    // Alternate servers so background load on a shared machine hits both alike.
    for round in 0..rounds {
        for server in [&reference, &ours] {
            let rows = scenario_rows(&server.url(), server.child.id()).await;
            for (index, (name, unit, higher_is_better, value, note, cpu)) in
                rows.into_iter().enumerate()
            {
                if table.len() <= index {
                    table.push(Row {
                        name,
                        unit,
                        higher_is_better,
                        values: vec![(0.0, String::new()); 2 * rounds],
                        cpu: vec![None; 2 * rounds],
                    });
                }
                let column = if server.name == "ours" { rounds } else { 0 } + round;
                table[index].values[column] = (value, note);
                table[index].cpu[column] = cpu;
            }
        }
    }
    println!();
    println!(
        "{:<32} {:>14} {:>14} {:>8}  {:<12} (best of {rounds} rounds; delivered/expected)",
        "scenario", "nats-server", "ours", "ratio", "unit"
    );
    for row in &table {
        let best = |a: &(f64, String), b: &(f64, String)| -> (f64, String) {
            let pick_a = if row.higher_is_better {
                a.0 >= b.0
            } else {
                a.0 <= b.0
            };
            if pick_a {
                a.clone()
            } else {
                b.clone()
            }
        };
        let (theirs, ours) = row.values.split_at(rounds);
        let reference = theirs.iter().fold(theirs[0].clone(), |a, b| best(&a, b));
        let ours = ours.iter().fold(ours[0].clone(), |a, b| best(&a, b));
        let ratio = ours.0 / reference.0;
        println!(
            "{:<32} {:>14.0} {:>14.0} {:>7.2}x  {:<12} {} | {}",
            row.name, reference.0, ours.0, ratio, row.unit, reference.1, ours.1
        );
    }
    println!();
    println!(
        "{:<32} {:>14} {:>14} {:>8}  {:>14} {:>14}  (least of {rounds} rounds)",
        "CPU ns per message", "nats-server", "ours", "ratio", "client (nats)", "client (ours)"
    );
    for row in &table {
        let least = |columns: &[Option<(f64, f64)>], pick: fn(&(f64, f64)) -> f64| {
            columns
                .iter()
                .flatten()
                .map(pick)
                .fold(f64::INFINITY, f64::min)
        };
        let (theirs, ours) = row.cpu.split_at(rounds);
        if theirs.iter().all(Option::is_none) {
            continue;
        }
        let broker = |cpu: &(f64, f64)| cpu.0;
        let client = |cpu: &(f64, f64)| cpu.1;
        let (reference, ours_broker) = (least(theirs, broker), least(ours, broker));
        println!(
            "{:<32} {:>14.0} {:>14.0} {:>7.2}x  {:>14.0} {:>14.0}",
            row.name,
            reference,
            ours_broker,
            ours_broker / reference,
            least(theirs, client),
            least(ours, client),
        );
    }
    println!(
        "\ntotal bench time: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}
