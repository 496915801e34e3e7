//! Delivery workers: one task per subscription turns matching events into deliveries and
//! sends them, in event order, with retries.
//!
//! The durable cursor: a worker reads the events stream from its subscription's
//! `cursor_seq + 1`; each matching event becomes a delivery row in the same transaction that
//! moves the cursor to it (`WebhookStore::enqueue_delivery`), so a crash at any point neither
//! skips an event nor makes a second row for it. Delivery is at-least-once: a crash after the
//! receiver answered but before the row says so sends it again, with the same `webhook-id`.
//!
//! Order: a subscription's deliveries go one at a time, oldest event first; a failing one is
//! retried (exponential back-off from `webhooks.retry_base`, doubling up to an hour, with
//! jitter) before the next is sent, until `webhooks.max_retry_age` after it was made, when it
//! is dead-lettered (status `dead`) and the next one goes. The events after it wait in the
//! stream, not in memory.
//!
//! Workers are reconciled with the table (`sync`): at start, every 2 s (another cluster
//! member's changes), and right after a create, update or delete here. Only the cluster's
//! leader sends (one server outside cluster mode always is).
//!
//! The two calls into the events stream (`current_seq`, `open_stream`) are kept here, in one
//! place.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

use crate::domain::Domain;
use crate::events::{types, Event, Filter};
use crate::store::{DeliveryRow, DeliveryStatus, WebhookRow};
use crate::{clock, ids, Result};

/// A running worker: which version of the row it runs, and how to stop or wake it.
pub(crate) struct Worker {
    updated_at: String,
    task: tokio::task::AbortHandle,
    wake: Arc<Notify>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The last durable event sequence (where a new subscription starts).
pub(crate) async fn current_seq(domain: &Domain) -> crate::Result<u64> {
    domain.events.log().last_seq().await
}

/// Matching events after `after`, then live ones, into a channel; the task ends when the
/// receiver is dropped.
fn open_stream(
    domain: &Arc<Domain>,
    filter: Filter,
    after: u64,
) -> (mpsc::Receiver<Result<Event>>, tokio::task::JoinHandle<()>) {
    let (sender, receiver) = mpsc::channel(16);
    let domain = domain.clone();
    let task = tokio::spawn(async move {
        domain
            .events
            .stream_from(after.saturating_add(1), filter, true, sender)
            .await
    });
    (receiver, task)
}

/// Starts the reconciler: workers for every subscription now and every 2 s.
pub fn spawn(domain: Arc<Domain>) {
    tokio::spawn(async move {
        loop {
            sync(&domain).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
}

/// Starts, restarts (changed settings) and stops workers to match the table.
pub async fn sync(domain: &Arc<Domain>) {
    let rows = match domain.store.webhooks().list_webhooks().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "webhooks: cannot list subscriptions");
            return;
        }
    };
    let mut workers = domain
        .webhooks
        .workers
        .lock()
        .expect("workers lock poisoned");
    workers.retain(|id, worker| {
        rows.iter()
            .any(|row| row.id == *id && row.updated_at == worker.updated_at)
    });
    for row in rows {
        if workers.contains_key(&row.id) {
            continue;
        }
        let key = match super::open_secret(domain, &row) {
            Ok(key) => key,
            Err(e) => {
                tracing::error!(webhook = %row.id, error = %e, "webhook not started");
                continue;
            }
        };
        let filter = match filter_of(&row) {
            Ok(filter) => filter,
            Err(e) => {
                tracing::error!(webhook = %row.id, error = %e, "webhook not started");
                continue;
            }
        };
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(run(domain.clone(), row.clone(), filter, key, wake.clone()));
        workers.insert(
            row.id.clone(),
            Worker {
                updated_at: row.updated_at.clone(),
                task: task.abort_handle(),
                wake,
            },
        );
    }
}

/// Wakes a subscription's worker (a redelivery is due now).
pub(crate) fn wake(domain: &Domain, webhook_id: &str) {
    let workers = domain
        .webhooks
        .workers
        .lock()
        .expect("workers lock poisoned");
    if let Some(worker) = workers.get(webhook_id) {
        worker.wake.notify_one();
    }
}

fn filter_of(row: &WebhookRow) -> Result<Filter> {
    let names: Vec<String> = serde_json::from_str(&row.event_types).unwrap_or_default();
    Ok(Filter {
        types: names
            .iter()
            .filter_map(|name| types::find(name).map(|t| t.kind))
            .collect(),
        category: (!row.category.is_empty()).then(|| row.category.clone()),
        min_severity: super::stored_min_severity(row)?,
        ..Filter::default()
    })
}

/// One subscription's worker; runs until aborted.
async fn run(
    domain: Arc<Domain>,
    row: WebhookRow,
    filter: Filter,
    key: Vec<u8>,
    wake: Arc<Notify>,
) {
    let store = domain.store.clone();
    let pause = Duration::from_secs(1);
    let mut stream: Option<(mpsc::Receiver<Result<Event>>, tokio::task::JoinHandle<()>)> = None;
    loop {
        if !domain.cluster.is_leader() {
            stream = None;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = wake.notified() => {}
            }
            continue;
        }
        // Deliveries already made (or put back by redeliver) go first, oldest event first.
        match store.webhooks().next_pending_delivery(&row.id).await {
            Ok(Some(delivery)) => {
                let due = clock::parse_rfc3339(&delivery.next_attempt_at).unwrap_or(0)
                    - clock::now_millis();
                if due > 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(due as u64)) => {}
                        _ = wake.notified() => {}
                    }
                    continue;
                }
                attempt(&domain, &row, &key, delivery).await;
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(webhook = %row.id, error = %e, "webhook: store read failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        }
        if stream.is_none() {
            // (Re)start from the stored cursor: the one truth about what was handled.
            let cursor = match store.webhooks().get_webhook(&row.id).await {
                Ok(Some(current)) => current.cursor_seq.max(0) as u64,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(webhook = %row.id, error = %e, "webhook: store read failed");
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            stream = Some(open_stream(&domain, filter.clone(), cursor));
        }
        let (receiver, _) = stream.as_mut().expect("stream opened above");
        let next = tokio::select! {
            next = receiver.recv() => next,
            _ = wake.notified() => continue,
        };
        match next {
            Some(Ok(event)) => {
                if let Err(e) = enqueue(&domain, &row, &event).await {
                    tracing::warn!(webhook = %row.id, error = %e, "webhook: delivery not recorded; re-reading from the cursor");
                    stream = None;
                    tokio::time::sleep(pause).await;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(webhook = %row.id, error = %e, "webhook: events read failed");
                stream = None;
                tokio::time::sleep(pause).await;
            }
            None => {
                // The stream ended (the server is stopping, or the log failed).
                stream = None;
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Records `event` as a pending delivery and moves the cursor to it (one transaction).
async fn enqueue(domain: &Domain, row: &WebhookRow, event: &Event) -> Result<()> {
    let now = clock::now_millis();
    let body = serde_json::to_string(event).map_err(crate::Error::internal)?;
    let delivery = DeliveryRow {
        id: format!("msg_{}", ids::ulid()),
        webhook_id: row.id.clone(),
        event_id: event.id.clone(),
        event_seq: event.seq as i64,
        event_type: event.event_type.to_string(),
        body,
        status: DeliveryStatus::Pending,
        attempts: 0,
        created_at: clock::format_rfc3339(now),
        next_attempt_at: clock::format_rfc3339(now),
        deadline_at: clock::format_rfc3339(
            now + domain.webhooks.config.max_retry_age.0.as_millis() as i64,
        ),
        last_attempt_at: None,
        response_status: None,
        last_error: None,
    };
    domain.store.webhooks().enqueue_delivery(&delivery).await
}

/// The delay before retry number `attempts` (1 = the first retry): `base` doubled per
/// attempt, at most an hour, then a uniform jitter over its upper half.
pub fn backoff(base: Duration, attempts: i64) -> Duration {
    let exponent = (attempts.max(1) - 1).min(20) as u32;
    let full = base
        .saturating_mul(2u32.saturating_pow(exponent))
        .min(Duration::from_secs(3600));
    let jitter: f64 = rand::random();
    full.mul_f64(0.5 + jitter / 2.0)
}

/// Sends one delivery once (signed for this attempt) and records what happened.
async fn attempt(domain: &Domain, row: &WebhookRow, key: &[u8], mut delivery: DeliveryRow) {
    let outcome = post(domain, &row.url, key, &delivery.id, &delivery.body).await;
    let now = clock::now_millis();
    delivery.attempts += 1;
    delivery.last_attempt_at = Some(clock::format_rfc3339(now));
    delivery.response_status = outcome.status.map(i64::from);
    delivery.last_error = outcome.error.clone();
    if outcome.is_success() {
        delivery.status = DeliveryStatus::Delivered;
    } else {
        let next = now
            + backoff(domain.webhooks.config.retry_base.0, delivery.attempts).as_millis() as i64;
        if next > clock::parse_rfc3339(&delivery.deadline_at).unwrap_or(0) {
            delivery.status = DeliveryStatus::Dead;
            tracing::warn!(webhook = %row.id, delivery = %delivery.id, attempts = delivery.attempts,
                error = ?outcome.error, "webhook delivery dead-lettered");
        } else {
            delivery.next_attempt_at = clock::format_rfc3339(next);
            tracing::debug!(webhook = %row.id, delivery = %delivery.id, error = ?outcome.error,
                "webhook delivery failed; will retry");
        }
    }
    if let Err(e) = domain.store.webhooks().update_delivery(&delivery).await {
        // The row stays pending: it is sent again (same webhook-id), at-least-once.
        tracing::warn!(webhook = %row.id, error = %e, "webhook delivery outcome not recorded");
    }
}

async fn post(
    domain: &Domain,
    url: &str,
    key: &[u8],
    id: &str,
    body: &str,
) -> super::send::Outcome {
    let timestamp = clock::now_millis() / 1000;
    let headers = [
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        (
            "webhook-signature",
            super::sign::signature(key, id, timestamp, body.as_bytes()),
        ),
    ];
    domain
        .webhooks
        .client
        .post(url, &headers, Bytes::from(body.to_string()))
        .await
}

/// `svc-webhook outbound test`: one `webhook.ping` now, recorded as delivered or dead.
pub(crate) async fn ping(domain: &Domain, row: &WebhookRow, key: &[u8]) -> Result<DeliveryRow> {
    let now = clock::now_millis();
    let id = format!("msg_{}", ids::ulid());
    let body = serde_json::json!({
        "type": "webhook.ping",
        "webhook_id": row.id,
        "timestamp": clock::format_rfc3339(now),
    })
    .to_string();
    let outcome = post(domain, &row.url, key, &id, &body).await;
    let finished = clock::format_rfc3339(clock::now_millis());
    let delivery = DeliveryRow {
        id,
        webhook_id: row.id.clone(),
        event_id: String::new(),
        event_seq: 0,
        event_type: "webhook.ping".into(),
        body,
        status: if outcome.is_success() {
            DeliveryStatus::Delivered
        } else {
            DeliveryStatus::Dead
        },
        attempts: 1,
        created_at: clock::format_rfc3339(now),
        next_attempt_at: finished.clone(),
        deadline_at: finished.clone(),
        last_attempt_at: Some(finished),
        response_status: outcome.status.map(i64::from),
        last_error: outcome.error,
    };
    domain.store.webhooks().enqueue_delivery(&delivery).await?;
    Ok(delivery)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_an_hour() {
        let base = Duration::from_secs(5);
        let cases = [(1, 5), (2, 10), (3, 20), (10, 2560), (13, 3600), (40, 3600)];
        for (attempts, full) in cases {
            for _ in 0..50 {
                let delay = backoff(base, attempts);
                let full = Duration::from_secs(full);
                assert!(delay >= full / 2 && delay <= full, "{attempts}: {delay:?}");
            }
        }
    }
}
