//! The bounded outbound buffer of one connection, shared by everyone who writes to it.
//!
//! Publishers on other connections append MSGs here without awaiting, and the connection's
//! writer task drains everything queued in one `write_all` per wake-up: batching is most of
//! the throughput. The buffer is bounded by `max_pending`: past it the connection is marked a
//! slow consumer and closed without `-ERR` (nats-server's behaviour), so a slow reader costs
//! publishers one failed append, never a wait. The lock is a std mutex because nothing awaits
//! while holding it and every critical section is a memcpy.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::BrokerStats;

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
    max_pending: usize,
    stats: Arc<BrokerStats>,
}

struct State {
    buffer: Vec<u8>,
    /// Set once the writer has been (or will be) woken for the bytes now queued; cleared when
    /// the writer takes the buffer. Lets publishers wake each writer once per batch.
    is_signalled: bool,
    close: Option<Close>,
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
    pub(crate) fn new(max_pending: usize, stats: Arc<BrokerStats>) -> Self {
        Outbound {
            state: Mutex::new(State {
                buffer: Vec::with_capacity(4096),
                is_signalled: false,
                close: None,
                messages: 0,
                payload_bytes: 0,
            }),
            wake: Notify::new(),
            max_pending,
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
            pending_bytes: state.buffer.len(),
            messages: state.messages,
            payload_bytes: state.payload_bytes,
        }
    }

    fn push_counted(&self, pieces: &[&[u8]], payload_len: Option<usize>) -> Queued {
        let mut state = self.lock();
        if state.close.is_some() {
            return Queued::Closed;
        }
        let length: usize = pieces.iter().map(|piece| piece.len()).sum();
        if state.buffer.len() + length > self.max_pending {
            state.close = Some(Close::Now);
            state.buffer = Vec::new();
            drop(state);
            self.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_one();
            return Queued::Closed;
        }
        for piece in pieces {
            state.buffer.extend_from_slice(piece);
        }
        if let Some(payload_len) = payload_len {
            state.messages += 1;
            state.payload_bytes += payload_len as u64;
        }
        if state.is_signalled {
            Queued::Pending
        } else {
            state.is_signalled = true;
            Queued::Wake
        }
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
        let mut state = self.lock();
        if state.close != Some(Close::Now) {
            state.close = Some(close);
        }
        if close == Close::Now {
            state.buffer = Vec::new();
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Swaps the queued bytes into `spare` (which must be empty), so publishers keep
    /// appending to a fresh buffer while the writer writes.
    pub(crate) fn take(&self, spare: &mut Vec<u8>) -> Batch {
        let mut state = self.lock();
        state.is_signalled = false;
        if state.close == Some(Close::Now) {
            return Batch::Close(Close::Now);
        }
        if state.buffer.is_empty() {
            return match state.close {
                Some(close) => Batch::Close(close),
                None => Batch::Wait,
            };
        }
        std::mem::swap(&mut state.buffer, spare);
        Batch::Write
    }

    pub(crate) async fn wait(&self) {
        self.wake.notified().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    Wake,
    Pending,
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_closes_and_is_counted() {
        let stats = Arc::new(BrokerStats::default());
        let outbound = Outbound::new(10, stats.clone());
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
        let outbound = Outbound::new(100, Arc::new(BrokerStats::default()));
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
}
