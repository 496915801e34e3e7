//! Stream log benchmark: durable appends per second with 16 concurrent appenders, read
//! throughput, and recovery time, measured against what one fdatasync costs on this disk.
//!
//! The fsync figure comes first because it bounds everything else: 16 appenders that each wait
//! for their acknowledgement can put at most 16 records into one group commit, so single-record
//! appends cannot exceed 16 / (fsync latency) per second however fast the code is. Batched
//! appends show what the log does when callers hand it more per sync. Runs in about 20 seconds
//! (`cargo bench --bench stream [-- --seconds 4]`, the length of each append phase);
//! files go under cargo's target tmp dir, on the same disk as the build, never on a tmpfs.
//!
//! For context (issue 21), the same 16-way load as raw JetStream publishes awaiting their ack,
//! against Debian's nats-server (one node, file storage), in the same run when nats-server is
//! installed. That nats-server syncs its files to disk every two minutes, not before each ack.

#[path = "load.rs"]
mod load;
#[path = "../tests/common/nats_cluster.rs"]
#[allow(dead_code)]
mod nats_cluster;
#[path = "common/run.rs"]
mod run;

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::stream::{StreamConfig, StreamLog};

const APPENDERS: usize = 16;
const RECORD_BYTES: usize = 256;

/// How long each append phase lasts: `--seconds` (default 4; CI runs 0.3 on the debug build).
fn phase() -> Duration {
    run::seconds_flag("--seconds", 4.0)
}

fn main() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let fsync = measure_fdatasync(&root.path().join("fsync-probe"));
    let ceiling = APPENDERS as f64 / fsync.as_secs_f64();
    println!(
        "fdatasync of a 256 B append: median {fsync:?} -> {:.0} syncs/s",
        1.0 / fsync.as_secs_f64()
    );
    println!("ceiling for {APPENDERS} single-record appenders: {ceiling:.0} appends/s");

    let dir = root.path().join("events");
    let log = StreamLog::open(&dir, StreamConfig::default()).expect("open");
    let single = runtime.block_on(append_for(&log, APPENDERS, 1));
    println!(
        "append, {APPENDERS} tasks, 1 record/call:       {single:>9.0} records/s ({:.2} of the ceiling)",
        single / ceiling
    );
    if let Some(rate) = runtime.block_on(jetstream_publish()) {
        println!(
            "JetStream publish+ack, nats-server R1 file storage, {APPENDERS} publishers: {rate:>9.0} records/s (svc log / JetStream = {:.2})",
            single / rate
        );
    }
    let wide = runtime.block_on(append_for(&log, 4 * APPENDERS, 1));
    println!(
        "append, {} tasks, 1 record/call:       {wide:>9.0} records/s",
        4 * APPENDERS
    );
    let batched = runtime.block_on(append_for(&log, APPENDERS, 32));
    println!("append_batch, {APPENDERS} tasks, 32 records/call: {batched:>9.0} records/s");

    let total = log.last_seq();
    let bytes = log.bytes();
    let started = Instant::now();
    let mut next = 1;
    while next <= total {
        let records = log.read(next, 4096).expect("read");
        next = records.last().map_or(total + 1, |r| r.seq + 1);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "sequential read of {total} records:     {:>9.0} records/s, {:.0} MB/s",
        total as f64 / elapsed,
        bytes as f64 / elapsed / 1e6
    );

    let lookups = 20_000;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let started = Instant::now();
    for _ in 0..lookups {
        // xorshift: spread point reads over the whole log without a dependency.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let records = log.read(state % total + 1, 1).expect("point read");
        assert_eq!(records.len(), 1);
    }
    let per_lookup = started.elapsed() / lookups;
    println!("point read (random seq, 1 record):      {per_lookup:?} each");

    drop(log);
    let started = Instant::now();
    let log = StreamLog::open(&dir, StreamConfig::default()).expect("reopen");
    let reopen = started.elapsed();
    assert_eq!(log.last_seq(), total);
    println!(
        "reopen (scan + verify {:.0} MB):           {reopen:?}",
        bytes as f64 / 1e6
    );
}

/// The median time of a 256-byte append plus fdatasync, over 500 tries.
fn measure_fdatasync(path: &std::path::Path) -> Duration {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("probe file");
    let record = [7u8; RECORD_BYTES];
    let mut samples: Vec<Duration> = (0..500)
        .map(|_| {
            let started = Instant::now();
            file.write_all(&record).expect("write");
            file.sync_data().expect("fdatasync");
            started.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// Raw async-nats JetStream publishes of `RECORD_BYTES`, each awaiting its ack, from
/// `APPENDERS` tasks for one phase against a fresh one-node nats-server; None without
/// nats-server.
async fn jetstream_publish() -> Option<f64> {
    let nats = nats_cluster::NatsCluster::start(1).await?;
    let client = async_nats::connect(nats.urls()).await.expect("connect");
    // The stream the events log would use (file storage, R1): created by the wrapper.
    let _log =
        svc::stream::JetStreamLog::open(client.clone(), "events", &StreamConfig::default(), 1)
            .await
            .expect("JetStream stream");
    Some(load::publish_rate(client, APPENDERS, RECORD_BYTES, phase()).await)
}

/// `tasks` appenders, `per_call` records per call, for one phase; records/s.
async fn append_for(log: &Arc<StreamLog>, tasks: usize, per_call: usize) -> f64 {
    load::append_rate(log.clone(), tasks, per_call, RECORD_BYTES, phase()).await
}
