//! Group commit of audit rows, and the mirror copy that follows them in chain order.
//!
//! A caller queues its row and, unless a commit task is already running, starts one. The task
//! takes every row queued so far and appends them, in queue order, with one
//! `Store::append_audit_batch`: one write transaction, and one WAL write of each touched page,
//! for all of them, then answers each caller, and goes on with whatever queued meanwhile until
//! it finds the queue empty. Every caller still returns only once its own row is stored; a batch
//! is simply what arrived while the previous transaction ran, so it is bounded by the number of
//! concurrent callers (each has one row queued at most).
//!
//! One task per burst, not one per row: sixteen requests woken by one events-log sync used to
//! spawn sixteen tasks that took turns on a lock only for fifteen of them to find nothing left,
//! each turn a wake-up and often a hop to the other core.
//!
//! Queue order is chain order. The commit runs in its own task, not in the caller's future, so
//! a caller that goes away while waiting (a client that hangs up) neither leaves its row
//! queued until someone else appends nor abandons rows of others that it was writing.
//!
//! The mirror (the `audit` stream log) is a copy for stream consumers, written in the
//! background so it adds no fsync to an operation. The commit hands each batch's entries to the
//! mirror in chain order; one drain task at a time appends whatever has queued with one
//! `append_batch`, at most once per `MIRROR_INTERVAL`, instead of one task and one fdatasync
//! per row. As before, the copy is best effort: the store row is the record, and copies still
//! queued when the runtime stops are not written.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::oneshot;

use super::{chain, Entry};
use crate::store::{AuditRow, Store};
use crate::stream::Stream;
use crate::{clock, Error, Result};

/// Rows waiting for a commit, and whether a commit task is running to take them.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    rows: Vec<Queued>,
    /// A commit task is running: it takes everything queued until it finds nothing.
    is_committing: bool,
}

struct Queued {
    row: AuditRow,
    /// The row's detail as a value, so the entry need not parse `row.detail` back.
    detail: Value,
    reply: oneshot::Sender<Result<Entry>>,
}

impl Queue {
    /// Appends `row` at the end of the chain, sharing the transaction with concurrent callers.
    pub(super) async fn append(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        mirror: Option<&Arc<Mirror>>,
        row: AuditRow,
        detail: Value,
    ) -> Result<Entry> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = self.state();
            state.rows.push(Queued { row, detail, reply });
            !std::mem::replace(&mut state.is_committing, true)
        };
        if start {
            let (queue, store, mirror) = (self.clone(), store.clone(), mirror.cloned());
            tokio::spawn(async move { queue.commit_queued(store.as_ref(), mirror.as_ref()).await });
        }
        answer.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Commits batches until the queue is empty, then says no commit task is running.
    async fn commit_queued(&self, store: &dyn Store, mirror: Option<&Arc<Mirror>>) {
        // Whatever ends this task (a panic in the store included), the next caller must find
        // `is_committing` false and start another, or its row would wait forever.
        struct Running<'a>(&'a Queue);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.state().is_committing = false;
            }
        }
        let running = Running(self);
        // Let the tasks already runnable on this worker go first: requests woken together
        // (say, by one events-log sync) then reach the queue before the batch is taken, instead
        // of the first paying for a transaction of its own while the others wait behind it.
        // With nothing else runnable this costs one trip through the scheduler.
        tokio::task::yield_now().await;
        loop {
            let batch = {
                let mut state = self.state();
                if state.rows.is_empty() {
                    // Cleared under the same lock that saw the queue empty, so a row pushed
                    // after this starts a new task. The guard is forgotten, not dropped: its
                    // drop would take this lock again, and clear the flag a new task has set.
                    state.is_committing = false;
                    std::mem::forget(running);
                    return;
                }
                std::mem::take(&mut state.rows)
            };
            commit(store, mirror, batch).await;
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while pushing or taking leaves a whole vector: keep going with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn abandoned() -> Error {
    Error::internal("audit commit ended without answering")
}

/// Writes one batch and answers each of its callers.
async fn commit(store: &dyn Store, mirror: Option<&Arc<Mirror>>, batch: Vec<Queued>) {
    let mut rows = Vec::with_capacity(batch.len());
    let mut waiting = Vec::with_capacity(batch.len());
    for queued in batch {
        rows.push(queued.row);
        waiting.push((queued.detail, queued.reply));
    }
    let results = match store
        .append_audit_batch(rows, chain::GENESIS, &chain::seal)
        .await
    {
        Ok(results) => results,
        Err(error) => {
            for (_, reply) in waiting {
                let _ = reply.send(Err(copy_error(&error)));
            }
            return;
        }
    };
    let mut copies = Vec::new();
    let mut answers = Vec::with_capacity(results.len());
    // A caller without a result (a store that returned too few) sees `abandoned`.
    for (result, (detail, reply)) in results.into_iter().zip(waiting) {
        let result = result.map(|row| Entry {
            detail,
            ..Entry::from_row_without_detail(row)
        });
        if let (Some(_), Ok(entry)) = (mirror, &result) {
            copies.extend(mirror_record(entry));
        }
        answers.push((reply, result));
    }
    if let Some(mirror) = mirror {
        mirror.push(copies);
    }
    for (reply, answer) in answers {
        let _ = reply.send(answer);
    }
}

/// The batch failed as a whole; each caller gets the same error.
fn copy_error(error: &Error) -> Error {
    match error {
        Error::Unavailable(message) => Error::Unavailable(message.clone()),
        Error::StorageFull(message) => Error::StorageFull(message.clone()),
        Error::Internal(cause) => Error::Internal(cause.clone()),
        other => Error::Internal(other.to_string()),
    }
}

/// The stream record of an entry: its time and its JSON.
fn mirror_record(entry: &Entry) -> Option<(i64, Vec<u8>)> {
    let bytes = serde_json::to_vec(entry).ok()?;
    if bytes.len() > crate::stream::MAX_PAYLOAD {
        // Alone, so that it cannot take the rest of its append down with it.
        tracing::error!(id = %entry.id, "audit row too large for the mirror");
        return None;
    }
    let millis = clock::parse_rfc3339(&entry.timestamp).unwrap_or_else(clock::now_millis);
    Some((millis, bytes))
}

/// The shortest time between two mirror appends. Each append is an fdatasync on the same disk
/// as the events log's, whose every sync an emitter waits for; pacing the copy keeps it from
/// syncing as often as the disk allows.
const MIRROR_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

/// The background copy of committed rows into the `audit` stream log.
pub(super) struct Mirror {
    log: Arc<dyn Stream>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    records: Vec<(i64, Vec<u8>)>,
    /// Whether a drain task is running; it takes everything pushed until it finds nothing.
    is_draining: bool,
}

impl Mirror {
    pub(super) fn new(log: Arc<dyn Stream>) -> Arc<Self> {
        Arc::new(Mirror {
            log,
            pending: Mutex::new(Pending::default()),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues records in chain order; starts a drain task unless one is running.
    fn push(self: &Arc<Self>, records: Vec<(i64, Vec<u8>)>) {
        if records.is_empty() {
            return;
        }
        let mut pending = self.pending();
        pending.records.extend(records);
        if pending.is_draining {
            return;
        }
        pending.is_draining = true;
        drop(pending);
        tokio::spawn(self.clone().drain());
    }

    async fn drain(self: Arc<Self>) {
        loop {
            let records = {
                let mut pending = self.pending();
                if pending.records.is_empty() {
                    pending.is_draining = false;
                    return;
                }
                std::mem::take(&mut pending.records)
            };
            let started = tokio::time::Instant::now();
            let count = records.len();
            if let Err(error) = self.log.append_batch(records).await {
                tracing::error!(%error, count, "audit mirror append failed");
            }
            // At most one append (one fdatasync) per interval: what arrives meanwhile goes
            // into the next one. The interval is what a stream consumer may wait for a copy.
            tokio::time::sleep_until(started + MIRROR_INTERVAL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Principal;

    fn store_in(dir: &std::path::Path) -> Arc<dyn Store> {
        Arc::new(crate::store::SqliteStore::open(&dir.join("svc.db")).unwrap())
    }

    async fn verified_rows(store: &dyn Store) -> u64 {
        let verification = super::super::verify(store, &Principal::server())
            .await
            .unwrap();
        assert!(verification.ok, "{verification:?}");
        verification.rows
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_keep_one_chain_and_mirror_it_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let log =
            crate::stream::StreamLog::open(&dir.path().join("audit"), Default::default()).unwrap();
        let auditor = Arc::new(
            super::super::Auditor::new(store.clone(), dir.path().join("policies"))
                .with_mirror(Some(log.clone())),
        );
        let (tasks, per_task) = (32, 20);
        let mut handles = Vec::new();
        for task in 0..tasks {
            let auditor = auditor.clone();
            handles.push(tokio::spawn(async move {
                let mut entries = Vec::new();
                for i in 0..per_task {
                    let action =
                        super::super::Action::new("event.emit", "event", format!("{task}-{i}"));
                    let entry = auditor
                        .append(&Principal::server(), action, "success")
                        .await
                        .unwrap();
                    assert_eq!(entry.resource_id, format!("{task}-{i}"));
                    entries.push(entry);
                }
                entries
            }));
        }
        let mut entries = Vec::new();
        for handle in handles {
            entries.extend(handle.await.unwrap());
        }
        let total = (tasks * per_task) as u64;
        assert_eq!(verified_rows(store.as_ref()).await, total);
        // Each caller got its own row back, as stored.
        entries.sort_by_key(|e| e.seq);
        let stored = store.audit_chain(0, total as usize).await.unwrap();
        let stored: Vec<Entry> = stored.into_iter().map(Entry::from).collect();
        assert_eq!(entries, stored);
        // The mirror catches up in the background, in chain order.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while log.last_seq() < total {
            assert!(
                std::time::Instant::now() < deadline,
                "mirror stuck at {}",
                log.last_seq()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let mirrored: Vec<Entry> = log
            .read(1, total as usize)
            .unwrap()
            .iter()
            .map(|record| serde_json::from_slice(&record.payload).unwrap())
            .collect();
        assert_eq!(mirrored, stored);
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_still_has_its_row_stored() {
        use futures_util::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let queue = Arc::new(Queue::default());
        let row = AuditRow {
            id: "gone".into(),
            detail: "{}".into(),
            ..AuditRow::default()
        };
        // The caller queues its row and is dropped before the commit task (not yet run on
        // this single-threaded runtime) took it, as tonic drops a handler whose client hung up.
        let caller = queue.append(&store, None, row, Value::Object(Default::default()));
        assert!(caller.now_or_never().is_none());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.audit_chain(0, 10).await.unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the row was never stored"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(verified_rows(store.as_ref()).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_row_does_not_take_its_batch_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let queue = Arc::new(Queue::default());
        let row = |id: &str| AuditRow {
            id: id.to_string(),
            timestamp: clock::now_rfc3339(),
            user: "server".into(),
            action: "event.emit".into(),
            resource_type: "event".into(),
            outcome: "success".into(),
            severity: "medium".into(),
            detail: "{}".into(),
            ..AuditRow::default()
        };
        // 40 callers at once, two of them with the same id (UNIQUE): whichever commits second
        // is refused, whether or not they share a batch, and everyone else is stored.
        let mut handles = Vec::new();
        for i in 0..40 {
            let (queue, store) = (queue.clone(), store.clone());
            let id = if i == 25 {
                "id-7".to_string()
            } else {
                format!("id-{i}")
            };
            handles.push(tokio::spawn(async move {
                queue
                    .append(&store, None, row(&id), Value::Object(Default::default()))
                    .await
            }));
        }
        let mut refused = 0;
        for handle in handles {
            if handle.await.unwrap().is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 1);
        assert_eq!(verified_rows(store.as_ref()).await, 39);
    }
}
