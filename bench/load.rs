//! The closed-loop loads of the stream benches: concurrent tasks, each starting its next call
//! as soon as the last one returns, for one phase. Appends to a `Stream` (the local log or
//! the JetStream one) and raw async-nats publishes awaiting their acks share one loop. Used by
//! bench/stream.rs and bench/stream_jetstream.rs through `#[path]`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::stream::Stream;

/// Runs `tasks` copies of `call` back to back for `phase`; returns what the calls completed
/// per second (each call returns how many records it completed).
pub async fn rate<F, Fut>(tasks: usize, phase: Duration, call: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = u64> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let (call, stop, completed) = (call.clone(), stop.clone(), completed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    completed.fetch_add(call().await, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("load task");
    }
    completed.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Appends of `per_call` records of `record_bytes` (`append` for one, `append_batch` for
/// more) from `tasks` appenders for `phase`; records per second.
pub async fn append_rate(
    log: Arc<dyn Stream>,
    tasks: usize,
    per_call: usize,
    record_bytes: usize,
    phase: Duration,
) -> f64 {
    rate(tasks, phase, move || {
        let log = log.clone();
        async move {
            let now = svc::clock::now_millis();
            if per_call == 1 {
                log.append(now, vec![1; record_bytes])
                    .await
                    .expect("append");
            } else {
                let items = (0..per_call)
                    .map(|_| (now, vec![1; record_bytes]))
                    .collect();
                log.append_batch(items).await.expect("append_batch");
            }
            per_call as u64
        }
    })
    .await
}

/// Publishes of `record_bytes` on the events stream's subject from `tasks` publishers for
/// `phase`, each awaiting its ack; acknowledged per second.
pub async fn publish_rate(
    client: async_nats::Client,
    tasks: usize,
    record_bytes: usize,
    phase: Duration,
) -> f64 {
    let context = async_nats::jetstream::new(client);
    rate(tasks, phase, move || {
        let context = context.clone();
        async move {
            let ack = context
                .publish("svc.js.events", vec![1; record_bytes].into())
                .await
                .expect("publish");
            ack.await.expect("ack");
            1
        }
    })
    .await
}
