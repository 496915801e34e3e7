//! Appends through `JetStreamLog` against the local `StreamLog` and raw async-nats JetStream
//! publishes, in one run, plus what each read path of `JetStreamLog` costs.
//!
//! Phases of 3 s each, 16 concurrent appenders of 256-byte records: the local log; one
//! nats-server with JetStream (R1, file storage) through `JetStreamLog::append`, through raw
//! `jetstream::Context::publish` + ack (what the wrapper adds), and `append_batch` of 32;
//! then a 3-node cluster, R3, through `JetStreamLog::append`. Reads: a short read at the end
//! (gets by sequence) against the same read far behind (an ephemeral consumer), and a long
//! sequential read. Needs nats-server (skips without it).
//!
//! `cargo bench --bench stream_jetstream [-- --seconds 3]` (release; the length of each
//! phase), or on the shared builders `cargo bench --profile dev --bench stream_jetstream`
//! (debug client; the servers are nats-server's own release build either way).

#[path = "load.rs"]
mod load;
#[path = "../tests/common/nats_cluster.rs"]
#[allow(dead_code)]
mod nats_cluster;
#[path = "common/run.rs"]
mod run;

use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::stream::{JetStreamLog, Stream, StreamConfig, StreamLog};

const APPENDERS: usize = 16;
const RECORD_BYTES: usize = 256;

/// How long each append phase lasts: `--seconds` (default 3; CI runs 0.3 on the debug build).
fn phase() -> Duration {
    run::seconds_flag("--seconds", 3.0)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let local: Arc<dyn Stream> =
        StreamLog::open(&root.path().join("events"), StreamConfig::default()).expect("open");
    let rate = append_for(local.clone(), 1).await;
    println!("local StreamLog, append, {APPENDERS} tasks:            {rate:>8.0} records/s");

    let Some(nats) = nats_cluster::NatsCluster::start(1).await else {
        return;
    };
    let client = async_nats::connect(nats.urls()).await.expect("connect");
    let log = JetStreamLog::open(client.clone(), "events", &StreamConfig::default(), 1)
        .await
        .expect("open");
    let rate = append_for(log.clone(), 1).await;
    println!("JetStreamLog R1, append, {APPENDERS} tasks:            {rate:>8.0} records/s");
    let rate = load::publish_rate(client.clone(), APPENDERS, RECORD_BYTES, phase()).await;
    println!("raw JetStream publish+ack R1, {APPENDERS} tasks:       {rate:>8.0} records/s");
    let rate = append_for(log.clone(), 32).await;
    println!("JetStreamLog R1, append_batch 32, {APPENDERS} tasks:   {rate:>8.0} records/s");

    let last = log.last_seq().await.expect("last");
    for n in [1usize, 4, 16, 32, 64] {
        let near = time_reads(log.as_ref(), last + 1 - n as u64, n).await;
        let far = time_reads(log.as_ref(), 1, n).await;
        println!(
            "read of {n:>2} records: at the end (gets) {near:?}, far behind (consumer) {far:?}"
        );
    }
    let started = Instant::now();
    let mut next = 1;
    let mut count = 0;
    while next <= last {
        let records = log.read(next, 4096).await.expect("read");
        count += records.len();
        next = records.last().map_or(last + 1, |r| r.seq + 1);
    }
    let elapsed = started.elapsed();
    println!(
        "sequential read, 4096 per call: {count} records in {elapsed:?} ({:.0} records/s)",
        count as f64 / elapsed.as_secs_f64()
    );
    drop(log);
    drop(nats);

    let Some(cluster) = nats_cluster::NatsCluster::start(3).await else {
        return;
    };
    let client = async_nats::connect(cluster.urls()).await.expect("connect");
    let log = JetStreamLog::open(client, "events", &StreamConfig::default(), 3)
        .await
        .expect("open");
    let rate = append_for(log.clone(), 1).await;
    println!("JetStreamLog R3 (3 nodes), append, {APPENDERS} tasks:  {rate:>8.0} records/s");
}

/// Median time of 50 reads of `n` records from `from`.
async fn time_reads(log: &dyn Stream, from: u64, n: usize) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let records = log.read(from, n).await.expect("read");
        samples.push(started.elapsed());
        assert_eq!(records.len(), n);
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// `APPENDERS` appenders, `per_call` records per call, for one phase; records/s.
async fn append_for(log: Arc<dyn Stream>, per_call: usize) -> f64 {
    load::append_rate(log, APPENDERS, per_call, RECORD_BYTES, phase()).await
}
