//! Publishing into the embedded broker from the process that embeds it (issue 21): the
//! server's live event fan-out delivers straight to the matching subscriptions' outbound
//! buffers, instead of encoding a PUB on its own client connection, crossing loopback TCP and
//! being parsed back by the broker. Delivery is what a PUB from a client with every right
//! gets: each matching plain subscription and one member of each queue group, the same MSG
//! frames, the same per-subscription limits (auto-unsubscribe, deny lists), the same broker
//! counters for deliveries to clients and slow-consumer rules (the outbound buffer's); it is no
//! client, so nothing counts as a message in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::outbound::Queued;
use super::router::Subscription;
use super::Shared;

/// A handle that publishes into one broker in process; cheap to clone.
#[derive(Clone)]
pub struct LocalPublisher {
    shared: Arc<Shared>,
    /// Spreads queue-group choices (the value only needs to vary).
    turn: Arc<AtomicU64>,
}

/// The user an in-process publish is stamped with on `sender_subjects`.
const LOCAL_USER: &str = "server";

impl LocalPublisher {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LocalPublisher {
            shared,
            turn: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Publishes `payload` on `subject` (a valid literal subject, no reply, no headers).
    /// Returns whether any subscriber got it.
    pub fn publish(&self, subject: &str, payload: &[u8]) -> bool {
        let shared = &self.shared;
        let stamped = shared
            .config
            .sender_subjects
            .as_deref()
            .filter(|pattern| crate::bus::subjects::subject_matches(pattern, subject))
            .map(|_| super::connection::stamp_sender(None, payload, LOCAL_USER));
        let (header_len, payload) = match &stamped {
            Some((header_len, stamped)) => (Some(*header_len), &stamped[..]),
            None => (None, payload),
        };
        // Not a message in: no client published it (nats-server does not count its internal
        // clients' publishes either). Deliveries to clients count out, below.
        let matches = shared.router.lookup(subject);
        let mut head = Vec::with_capacity(subject.len() + 32);
        let mut delivered = false;
        // Deliveries to clients, for the counters (not those to the process's own connection).
        let mut to_clients = 0u64;
        let mut count = |subscription: &Arc<Subscription>| {
            delivered = true;
            to_clients += u64::from(!subscription.internal);
        };
        for subscription in &matches.plain {
            if self.deliver(subscription, &mut head, subject, header_len, payload) {
                count(subscription);
            }
        }
        for group in &matches.groups {
            let start = self.turn.fetch_add(1, Ordering::Relaxed) as usize % group.len();
            for offset in 0..group.len() {
                let subscription = &group[(start + offset) % group.len()];
                if self.deliver(subscription, &mut head, subject, header_len, payload) {
                    count(subscription);
                    break;
                }
            }
        }
        if to_clients > 0 {
            shared
                .stats
                .messages_out
                .fetch_add(to_clients, Ordering::Relaxed);
            shared
                .stats
                .bytes_out
                .fetch_add(to_clients * payload.len() as u64, Ordering::Relaxed);
        }
        delivered
    }

    /// One MSG/HMSG frame to one subscription (`Subscription::offer`, which a connection's
    /// delivery uses too), its writer woken at once.
    fn deliver(
        &self,
        subscription: &Arc<Subscription>,
        head: &mut Vec<u8>,
        subject: &str,
        header_len: Option<usize>,
        payload: &[u8],
    ) -> bool {
        let queued = subscription.offer(
            &self.shared.router,
            head,
            subject,
            None,
            header_len,
            payload,
        );
        match queued {
            None | Some(Queued::Closed) => false,
            Some(Queued::Wake) => {
                subscription.outbound.wake();
                true
            }
            Some(Queued::Pending) => true,
        }
    }
}
