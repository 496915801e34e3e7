//! The bounded outbound buffer of one connection, shared by everyone who writes to it.
//!
//! Publishers on other connections append MSGs here without awaiting, and the connection's
//! writer task drains everything queued in one `write_all` per wake-up: batching is most of
//! the throughput. The buffer is bounded by `max_pending`: past it the connection is marked a
//! slow consumer and closed without `-ERR` (nats-server's behaviour), so a slow reader costs
//! publishers one failed append, never a wait. The lock is a std mutex because nothing awaits
//! while holding it and every critical section is a memcpy.
//!
//! Every buffer also draws on one [`PendingBudget`] shared by all connections
//! (`max_pending_total`): one relaxed atomic add per append and one subtract per written
//! batch. An append that would exceed it asks the budget's shedder (the broker's
//! `Shared::shed`) to cut slow consumers, then retries once; still no room, the connection
//! appended to is cut, so the limit holds. A connection with a credential also draws on its
//! user's budget (`quota::UserQuota`), shared by that credential's connections only, the same
//! way: one client cannot fill the broker-wide budget alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::BrokerStats;

/// The bytes queued to every connection together (appended and not yet written), against
/// one limit.
pub(crate) struct PendingBudget {
    total: AtomicUsize,
    limit: usize,
    /// Called with the bytes an append needs when the budget is exhausted; frees room by
    /// cutting slow consumers (the broker sets it to [`super::Shared::shed`]).
    shedder: OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
}

impl PendingBudget {
    pub(crate) fn new(limit: usize) -> Self {
        PendingBudget {
            total: AtomicUsize::new(0),
            limit,
            shedder: OnceLock::new(),
        }
    }

    pub(crate) fn set_shedder(&self, shedder: Box<dyn Fn(usize) + Send + Sync>) {
        let _ = self.shedder.set(shedder);
    }

    pub(crate) fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Three quarters of the limit: above it publishers pause and clients that stopped
    /// reading are cut, so that the limit itself is rarely reached.
    pub(crate) fn pressure(&self) -> usize {
        self.limit - self.limit / 4
    }

    pub(crate) fn is_under_pressure(&self) -> bool {
        self.total() > self.pressure()
    }

    /// Counts `bytes` whatever the limit: what a connection joining a user's budget has
    /// queued, and appends past a user's budget (a mark its shedder acts on, not a wall).
    fn add(&self, bytes: usize) {
        self.total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes `bytes` from the budget; false (and nothing taken) when that would exceed it.
    fn reserve(&self, bytes: usize) -> bool {
        let before = self.total.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > self.limit {
            self.total.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.total.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    fn shed(&self, bytes: usize) {
        if let Some(shedder) = self.shedder.get() {
            shedder(bytes);
        }
    }
}

/// Most buffer capacity an idle connection keeps, in each of its two buffers.
pub(crate) const IDLE_CAPACITY: usize = 4096;

/// Why a connection's writer stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Close {
    /// Write what is queued (e.g. a final `-ERR`), then close.
    AfterFlush,
    /// Drop what is queued and close now (slow consumer, write error).
    Now,
}

pub(crate) struct Outbound {
    state: Mutex<State>,
    wake: Notify,
    /// Cancelled on `Close::Now`, so a writer stuck in a write to a peer that does not read
    /// drops its batch at once instead of at the write deadline.
    killed: CancellationToken,
    max_pending: usize,
    budget: Arc<PendingBudget>,
    stats: Arc<BrokerStats>,
}

struct State {
    buffer: Vec<u8>,
    /// Bytes the writer took and has not finished writing; still counted against both
    /// limits (nats-server's pending bytes include them too).
    in_flight: usize,
    /// Since when the writer has been waiting for the socket to take the batch in flight
    /// (the peer's and our kernel buffers are full: the client is not reading); cleared
    /// when the writer takes the next batch. The shedder cuts these first, longest first.
    blocked_since: Option<Instant>,
    /// Set once the writer has been (or will be) woken for the bytes now queued; cleared when
    /// the writer takes the buffer. Lets publishers wake each writer once per batch.
    is_signalled: bool,
    close: Option<Close>,
    /// The budget of this connection's user (`quota`), beside the broker-wide one: set at
    /// CONNECT. Kept under the lock so that what is reserved and released always agree.
    user_budget: Option<Arc<PendingBudget>>,
    /// MSG/HMSG queued to this connection and their payload bytes (monitoring's `out_msgs`
    /// and `out_bytes`); counted under the lock the append takes anyway.
    messages: u64,
    payload_bytes: u64,
}

/// What the monitor reads of one connection's buffer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OutboundCounters {
    pub pending_bytes: usize,
    pub messages: u64,
    pub payload_bytes: u64,
}

/// What the writer should do next.
pub(crate) enum Batch {
    /// Bytes were swapped into the writer's buffer.
    Write,
    Wait,
    Close(Close),
}

impl Outbound {
    pub(crate) fn new(
        max_pending: usize,
        budget: Arc<PendingBudget>,
        stats: Arc<BrokerStats>,
    ) -> Self {
        Outbound {
            state: Mutex::new(State {
                buffer: Vec::with_capacity(4096),
                in_flight: 0,
                blocked_since: None,
                is_signalled: false,
                close: None,
                user_budget: None,
                messages: 0,
                payload_bytes: 0,
            }),
            wake: Notify::new(),
            killed: CancellationToken::new(),
            max_pending,
            budget,
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the buffer half-written in a way that
        // matters more than losing the connection, so a poisoned lock is simply reused.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends the pieces as one unit. Returns `Queued::Wake` when the caller must call
    /// [`Outbound::wake`] (now or after its current batch), `Queued::Pending` when a wake is
    /// already due, and `Queued::Closed` when the connection is gone or just became a slow
    /// consumer.
    pub(crate) fn push(&self, pieces: &[&[u8]]) -> Queued {
        self.push_counted(pieces, None)
    }

    /// [`Outbound::push`] for a MSG/HMSG with `payload_len` payload bytes, which the
    /// connection's `out_msgs`/`out_bytes` count once queued.
    pub(crate) fn push_message(&self, pieces: &[&[u8]], payload_len: usize) -> Queued {
        self.push_counted(pieces, Some(payload_len))
    }

    pub(crate) fn counters(&self) -> OutboundCounters {
        let state = self.lock();
        OutboundCounters {
            pending_bytes: state.buffer.len() + state.in_flight,
            messages: state.messages,
            payload_bytes: state.payload_bytes,
        }
    }

    /// Bytes queued and being written, and for how long the socket has refused the batch
    /// in flight (None: it has not).
    pub(crate) fn pending(&self) -> (usize, Option<Duration>) {
        let state = self.lock();
        let pending = state.buffer.len() + state.in_flight;
        (pending, state.blocked_since.map(|since| since.elapsed()))
    }

    /// The writer found the socket full: the batch in flight waits for the peer to read.
    pub(crate) fn mark_blocked(&self) {
        self.lock().blocked_since.get_or_insert_with(Instant::now);
    }

    /// Makes this connection draw on `budget` too (its user's), bringing what it has queued;
    /// a previous user budget gets those bytes back.
    pub(crate) fn join_user_budget(&self, budget: Arc<PendingBudget>) {
        let mut state = self.lock();
        let pending = state.buffer.len() + state.in_flight;
        if let Some(previous) = state.user_budget.take() {
            previous.release(pending);
        }
        budget.add(pending);
        state.user_budget = Some(budget);
    }

    fn push_counted(&self, pieces: &[&[u8]], payload_len: Option<usize>) -> Queued {
        let mut over_user = None;
        let queued = self.push_within(pieces, payload_len, &mut over_user);
        if let Some((user, needed)) = over_user {
            // Past the user's budget: its stuck readers go (`quota`), now that this
            // buffer's lock is released.
            user.shed(needed);
        }
        queued
    }

    fn push_within(
        &self,
        pieces: &[&[u8]],
        payload_len: Option<usize>,
        over_user: &mut Option<(Arc<PendingBudget>, usize)>,
    ) -> Queued {
        match self.try_push(pieces, payload_len, over_user) {
            Err((budget, needed)) => {
                // Over a shared budget (the broker's or the user's): let its shedder cut
                // slow consumers (possibly this one), then try once more; still no room,
                // this one goes.
                budget.shed(needed);
                match self.try_push(pieces, payload_len, over_user) {
                    Err(_) => {
                        self.cut_slow();
                        Queued::Closed
                    }
                    Ok(queued) => queued,
                }
            }
            Ok(queued) => queued,
        }
    }

    /// `Err((budget, bytes))` when the broker's budget has no room for them. The user's budget
    /// does not refuse: past it, `over_user` names it and the bytes, for its shedder.
    fn try_push(
        &self,
        pieces: &[&[u8]],
        payload_len: Option<usize>,
        over_user: &mut Option<(Arc<PendingBudget>, usize)>,
    ) -> Result<Queued, (Arc<PendingBudget>, usize)> {
        let mut state = self.lock();
        if state.close.is_some() {
            return Ok(Queued::Closed);
        }
        let length: usize = pieces.iter().map(|piece| piece.len()).sum();
        if state.buffer.len() + state.in_flight + length > self.max_pending {
            drop(state);
            self.cut_slow();
            return Ok(Queued::Closed);
        }
        if !self.budget.reserve(length) {
            return Err((self.budget.clone(), length));
        }
        if let Some(user) = &state.user_budget {
            if !user.reserve(length) {
                user.add(length);
                *over_user = Some((user.clone(), length));
            }
        }
        for piece in pieces {
            state.buffer.extend_from_slice(piece);
        }
        if let Some(payload_len) = payload_len {
            state.messages += 1;
            state.payload_bytes += payload_len as u64;
        }
        if state.is_signalled {
            Ok(Queued::Pending)
        } else {
            state.is_signalled = true;
            Ok(Queued::Wake)
        }
    }

    /// Closes the connection as a slow consumer (nats-server closes without `-ERR`: nothing
    /// more can be written to it) and counts it; false when it was already closed.
    pub(crate) fn cut_slow(&self) -> bool {
        if !self.close_now() {
            return false;
        }
        self.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Drops what is queued, gives its bytes back to the budget and stops the writer; false
    /// when that had already happened.
    fn close_now(&self) -> bool {
        let mut state = self.lock();
        if state.close == Some(Close::Now) {
            return false;
        }
        state.close = Some(Close::Now);
        let buffer = std::mem::take(&mut state.buffer);
        let in_flight = std::mem::take(&mut state.in_flight);
        self.release(&state, buffer.len() + in_flight);
        drop(state);
        drop(buffer);
        self.killed.cancel();
        self.wake.notify_one();
        true
    }

    /// Appends and wakes the writer at once; for replies to the connection's own ops.
    pub(crate) fn push_now(&self, pieces: &[&[u8]]) {
        if self.push(pieces) == Queued::Wake {
            self.wake();
        }
    }

    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Asks the writer to stop. `AfterFlush` never overrides an earlier `Now`.
    pub(crate) fn close(&self, close: Close) {
        if close == Close::Now {
            self.close_now();
            return;
        }
        let mut state = self.lock();
        if state.close != Some(Close::Now) {
            state.close = Some(close);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Swaps the queued bytes into `spare` (which must be empty), so publishers keep
    /// appending to a fresh buffer while the writer writes. Calling it again means the
    /// previous batch was written: its bytes go back to the budget.
    pub(crate) fn take(&self, spare: &mut Vec<u8>) -> Batch {
        let mut state = self.lock();
        state.is_signalled = false;
        let written = std::mem::take(&mut state.in_flight);
        self.release(&state, written);
        state.blocked_since = None;
        if state.close == Some(Close::Now) {
            return Batch::Close(Close::Now);
        }
        if state.buffer.is_empty() {
            if state.buffer.capacity() > IDLE_CAPACITY {
                // Idle: do not keep a burst's buffer (the next append starts small).
                state.buffer = Vec::new();
            }
            return match state.close {
                Some(close) => Batch::Close(close),
                None => Batch::Wait,
            };
        }
        std::mem::swap(&mut state.buffer, spare);
        state.in_flight = spare.len();
        Batch::Write
    }

    /// Gives `bytes` back to the broker's budget and the user's.
    fn release(&self, state: &State, bytes: usize) {
        self.budget.release(bytes);
        if let Some(user) = &state.user_budget {
            user.release(bytes);
        }
    }

    pub(crate) async fn wait(&self) {
        self.wake.notified().await;
    }

    /// Completes once the connection is closed with `Close::Now`.
    pub(crate) async fn killed(&self) {
        self.killed.cancelled().await;
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        let state = self.lock();
        self.release(&state, state.buffer.len() + state.in_flight);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    Wake,
    Pending,
    Closed,
}

#[cfg(test)]
pub(crate) fn unlimited() -> Arc<PendingBudget> {
    Arc::new(PendingBudget::new(usize::MAX / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_closes_and_is_counted() {
        let stats = Arc::new(BrokerStats::default());
        let outbound = Outbound::new(10, unlimited(), stats.clone());
        let steps: [(&[u8], Queued); 4] = [
            (b"12345", Queued::Wake),
            (b"678", Queued::Pending),
            (b"901", Queued::Closed),
            (b"x", Queued::Closed),
        ];
        for (bytes, expected) in steps {
            assert_eq!(outbound.push(&[bytes]), expected, "{bytes:?}");
        }
        assert_eq!(stats.slow_consumers.load(Ordering::Relaxed), 1);
        assert!(matches!(
            outbound.take(&mut Vec::new()),
            Batch::Close(Close::Now)
        ));
    }

    #[test]
    fn take_swaps_and_resets_the_signal() {
        let outbound = Outbound::new(100, unlimited(), Arc::new(BrokerStats::default()));
        assert_eq!(outbound.push(&[b"ab", b"c"]), Queued::Wake);
        let mut spare = Vec::new();
        assert!(matches!(outbound.take(&mut spare), Batch::Write));
        assert_eq!(spare, b"abc");
        assert!(matches!(outbound.take(&mut Vec::new()), Batch::Wait));
        assert_eq!(outbound.push(&[b"d"]), Queued::Wake);
        outbound.close(Close::AfterFlush);
        let mut spare = Vec::new();
        assert!(matches!(outbound.take(&mut spare), Batch::Write));
        assert!(matches!(
            outbound.take(&mut Vec::new()),
            Batch::Close(Close::AfterFlush)
        ));
    }

    #[test]
    fn the_budget_counts_queued_and_in_flight_bytes_until_written_or_closed() {
        let budget = Arc::new(PendingBudget::new(1000));
        let stats = Arc::new(BrokerStats::default());
        let outbound = Outbound::new(100, budget.clone(), stats.clone());
        outbound.push(&[b"abc", b"de"]);
        assert_eq!(budget.total(), 5);
        let mut batch = Vec::new();
        assert!(matches!(outbound.take(&mut batch), Batch::Write));
        // Being written: still counted.
        assert_eq!(budget.total(), 5);
        assert_eq!(outbound.pending().0, 5);
        outbound.push(&[b"fg"]);
        assert_eq!(budget.total(), 7);
        batch.clear();
        // The next take means the first batch was written.
        assert!(matches!(outbound.take(&mut batch), Batch::Write));
        assert_eq!(budget.total(), 2);
        outbound.close(Close::Now);
        assert_eq!(budget.total(), 0);
        let other = Outbound::new(100, budget.clone(), stats.clone());
        other.push(&[b"xyz"]);
        drop(other);
        assert_eq!(budget.total(), 0);
        assert_eq!(stats.slow_consumers.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn over_the_budget_the_shedder_runs_and_else_the_target_is_cut() {
        let budget = Arc::new(PendingBudget::new(10));
        let stats = Arc::new(BrokerStats::default());
        let hog = Arc::new(Outbound::new(100, budget.clone(), stats.clone()));
        let reader = Outbound::new(100, budget.clone(), stats.clone());
        assert_eq!(hog.push(&[b"12345678"]), Queued::Wake);
        // No shedder: no room, so the connection appended to is cut.
        assert_eq!(reader.push(&[b"abcd"]), Queued::Closed);
        assert_eq!(stats.slow_consumers.load(Ordering::Relaxed), 1);
        let reader = Outbound::new(100, budget.clone(), stats.clone());
        let victim = hog.clone();
        budget.set_shedder(Box::new(move |_| {
            victim.cut_slow();
        }));
        assert_eq!(reader.push(&[b"abcd"]), Queued::Wake);
        assert!(matches!(
            hog.take(&mut Vec::new()),
            Batch::Close(Close::Now)
        ));
        assert_eq!(budget.total(), 4);
        assert_eq!(stats.slow_consumers.load(Ordering::Relaxed), 2);
    }
}
