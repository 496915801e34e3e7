//! The JetStream side of the stream benches: raw async-nats publishes on the events
//! stream's subject, each awaiting its ack, from concurrent tasks for one phase. Shared by
//! bench/stream.rs and bench/stream_jetstream.rs through `#[path]`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Publishes of `record_bytes` from `tasks` publishers for `phase`; acknowledged per second.
pub async fn publish_rate(
    client: async_nats::Client,
    tasks: usize,
    record_bytes: usize,
    phase: Duration,
) -> f64 {
    let context = async_nats::jetstream::new(client);
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let publishers: Vec<_> = (0..tasks)
        .map(|_| {
            let (context, stop, published) = (context.clone(), stop.clone(), published.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let ack = context
                        .publish("svc.js.events", vec![1; record_bytes].into())
                        .await
                        .expect("publish");
                    ack.await.expect("ack");
                    published.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.await.expect("publisher");
    }
    published.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
