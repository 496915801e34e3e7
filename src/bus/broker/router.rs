//! Subject index: which subscriptions match a published subject.
//!
//! Owns the token trie and the literal-subject cache. Never touches sockets or awaits;
//! callers hold the index lock only for an insert, a removal or a cache miss, which is why
//! it is a std mutex. The cache exists because most traffic repeats a few subjects; SUB and
//! UNSUB clear it and bump `generation`, which also invalidates the per-connection caches
//! that let a busy publisher skip the lock entirely.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use super::outbound::{Outbound, Queued};
use super::protocol::write_msg_head;

/// Cached subjects kept before the cache is dropped wholesale; bounds memory under subject
/// churn (unique inbox replies) without an LRU's bookkeeping on every publish.
const CACHE_LIMIT: usize = 4096;

/// One SUB of one connection.
pub(crate) struct Subscription {
    pub client_id: u64,
    /// The subscriber is the embedding process's own connection (`Permissions::internal`):
    /// deliveries to it are not in the broker's `messages_out`.
    pub internal: bool,
    pub outbound: Arc<Outbound>,
    pub sid: Bytes,
    pub subject: String,
    pub queue: Option<String>,
    /// Deny patterns of the subscriber that overlap this subscription without containing
    /// it; messages on subjects they match are not delivered (as nats-server does).
    pub deny: Vec<String>,
    /// `UNSUB <sid> <max>`: deliveries allowed in total; `u64::MAX` means no limit.
    max: AtomicU64,
    delivered: AtomicU64,
}

/// Whether one more message may go to a subscription.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    Deliver,
    /// Deliver, and this was the last one `UNSUB max` allowed: remove the subscription.
    DeliverLast,
    Exhausted,
}

impl Subscription {
    pub(crate) fn new(
        client_id: u64,
        internal: bool,
        outbound: Arc<Outbound>,
        sid: Bytes,
        subject: String,
        queue: Option<String>,
        deny: Vec<String>,
    ) -> Self {
        Subscription {
            client_id,
            internal,
            outbound,
            sid,
            subject,
            queue,
            deny,
            max: AtomicU64::new(u64::MAX),
            delivered: AtomicU64::new(0),
        }
    }

    /// Reserves one delivery. Publishers on different connections may race here; the
    /// counter makes sure at most `max` of them win.
    pub(crate) fn claim(&self) -> Claim {
        // Counted even without a limit: a later `UNSUB <sid> <max>` counts earlier deliveries.
        let number = self.delivered.fetch_add(1, Ordering::AcqRel) + 1;
        let max = self.max.load(Ordering::Acquire);
        match number.cmp(&max) {
            std::cmp::Ordering::Less => Claim::Deliver,
            std::cmp::Ordering::Equal => Claim::DeliverLast,
            std::cmp::Ordering::Greater => Claim::Exhausted,
        }
    }

    /// Sets the limit; returns true when it is already reached and the caller must remove
    /// the subscription now.
    pub(crate) fn set_max(&self, max: u64) -> bool {
        self.max.store(max, Ordering::Release);
        self.delivered.load(Ordering::Acquire) >= max
    }

    /// Messages delivered so far (claims past an `UNSUB max` are not deliveries).
    pub(crate) fn delivered(&self) -> u64 {
        let delivered = self.delivered.load(Ordering::Acquire);
        delivered.min(self.max.load(Ordering::Acquire))
    }

    pub(crate) fn is_exhausted(&self) -> bool {
        let max = self.max.load(Ordering::Acquire);
        max != u64::MAX && self.delivered.load(Ordering::Acquire) >= max
    }

    /// True when a message on `subject` must be withheld by the subscriber's deny rules.
    pub(crate) fn is_denied(&self, subject: &str) -> bool {
        self.deny
            .iter()
            .any(|pattern| crate::bus::subjects::subject_matches(pattern, subject))
    }
    /// Frames one MSG/HMSG (in `head`) for this subscription and queues it with `payload`:
    /// None when its deny rules withhold `subject` or its auto-unsubscribe count is spent; the
    /// last message it may take also removes it from `router`. The caller wakes the writer
    /// on `Queued::Wake`, now or after the publish (a connection batches its wakes).
    pub(crate) fn offer(
        self: &Arc<Self>,
        router: &Router,
        head: &mut Vec<u8>,
        subject: &str,
        reply: Option<&[u8]>,
        header_len: Option<usize>,
        payload: &[u8],
    ) -> Option<Queued> {
        if !self.deny.is_empty() && self.is_denied(subject) {
            return None;
        }
        let claim = self.claim();
        if claim == Claim::Exhausted {
            return None;
        }
        write_msg_head(head, subject, &self.sid, reply, header_len, payload.len());
        let queued = self
            .outbound
            .push_message(&[head, payload, b"\r\n"], payload.len());
        if claim == Claim::DeliverLast {
            router.remove(self);
        }
        Some(queued)
    }
}

/// The subscriptions one subject reaches, in nats-server's order.
#[derive(Default)]
pub(crate) struct Matches {
    pub plain: Vec<Arc<Subscription>>,
    /// One entry per queue name; each message goes to one member of each.
    pub groups: Vec<Vec<Arc<Subscription>>>,
}

impl Matches {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.groups.is_empty()
    }
}

#[derive(Default)]
struct Level {
    literal: HashMap<Box<str>, Node>,
    single: Option<Box<Node>>,
    full: Option<Box<Node>>,
}

#[derive(Default)]
struct Node {
    next: Option<Box<Level>>,
    subscriptions: Vec<Arc<Subscription>>,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.single.is_none() && self.full.is_none()
    }

    fn child(&mut self, token: &str) -> &mut Node {
        match token {
            "*" => self.single.get_or_insert_with(Box::default),
            ">" => self.full.get_or_insert_with(Box::default),
            _ => self.literal.entry(token.into()).or_default(),
        }
    }

    /// Removes `target` under `tokens`; returns true if it was found. Empty nodes are
    /// pruned on the way back up so unique inbox subjects do not leak trie nodes.
    fn remove(&mut self, tokens: &[&str], target: &Arc<Subscription>) -> bool {
        let Some((first, rest)) = tokens.split_first() else {
            return false;
        };
        let slot_is_empty;
        let found;
        {
            let node = match *first {
                "*" => self.single.as_deref_mut(),
                ">" => self.full.as_deref_mut(),
                literal => self.literal.get_mut(literal),
            };
            let Some(node) = node else {
                return false;
            };
            found = if rest.is_empty() {
                let before = node.subscriptions.len();
                node.subscriptions.retain(|sub| !Arc::ptr_eq(sub, target));
                node.subscriptions.len() != before
            } else {
                let found = node
                    .next
                    .as_deref_mut()
                    .is_some_and(|next| next.remove(rest, target));
                if node.next.as_deref().is_some_and(Level::is_empty) {
                    node.next = None;
                }
                found
            };
            slot_is_empty = node.subscriptions.is_empty() && node.next.is_none();
        }
        if slot_is_empty {
            match *first {
                "*" => self.single = None,
                ">" => self.full = None,
                literal => {
                    self.literal.remove(literal);
                }
            }
        }
        found
    }

    /// nats-server's match order: at each level `>` first, then everything under `*`, then
    /// the literal token; at the last token the literal node before the `*` node. Keeping it
    /// means a connection with overlapping subscriptions sees MSGs in the same order.
    fn collect<'a>(&'a self, tokens: &[&str], found: &mut Vec<&'a Node>) {
        let Some((first, rest)) = tokens.split_first() else {
            return;
        };
        if let Some(full) = &self.full {
            found.push(full);
        }
        if !rest.is_empty() {
            if let Some(next) = self.single.as_ref().and_then(|node| node.next.as_deref()) {
                next.collect(rest, found);
            }
        }
        if let Some(node) = self.literal.get(*first) {
            if rest.is_empty() {
                found.push(node);
            } else if let Some(next) = &node.next {
                next.collect(rest, found);
            }
        }
        if rest.is_empty() {
            if let Some(single) = &self.single {
                found.push(single);
            }
        }
    }
}

#[derive(Default)]
struct Index {
    root: Level,
    cache: HashMap<Box<str>, Arc<Matches>>,
    /// Monitoring counters (`/subsz`), kept under the lock every change takes anyway.
    inserts: u64,
    removes: u64,
    /// Lookups the index answered (per-connection caches absorb most publishes first).
    matches: u64,
    cache_hits: u64,
}

/// The subject index's statistics, nats-server's `/subsz` numbers.
#[derive(Clone, Copy, Debug, Default)]
pub struct IndexStats {
    pub cache_len: usize,
    pub inserts: u64,
    pub removes: u64,
    pub matches: u64,
    pub cache_hits: u64,
    /// Over the cached subjects: the most and the mean subscriptions one subject reaches.
    pub max_fanout: usize,
    pub avg_fanout: f64,
}

impl IndexStats {
    pub fn cache_hit_rate(&self) -> f64 {
        if self.matches == 0 {
            0.0
        } else {
            self.cache_hits as f64 / self.matches as f64
        }
    }
}

#[derive(Default)]
pub(crate) struct Router {
    index: Mutex<Index>,
    generation: AtomicU64,
}

impl Router {
    fn lock(&self) -> MutexGuard<'_, Index> {
        // Index updates are single assignments per node; a panic elsewhere cannot leave it
        // in a state worse than one missing subscription.
        self.index
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bumped on every change; per-connection caches compare it before trusting an entry.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn insert(&self, subscription: Arc<Subscription>) {
        let mut index = self.lock();
        let mut level = &mut index.root;
        let tokens: Vec<&str> = subscription.subject.split('.').collect();
        let (last, init) = tokens
            .split_last()
            .expect("split yields at least one token");
        for token in init {
            level = level.child(token).next.get_or_insert_with(Box::default);
        }
        level.child(last).subscriptions.push(subscription.clone());
        index.inserts += 1;
        index.cache.clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes the subscription if it is still indexed; removing twice is harmless.
    pub(crate) fn remove(&self, subscription: &Arc<Subscription>) {
        let tokens: Vec<&str> = subscription.subject.split('.').collect();
        let mut index = self.lock();
        if index.root.remove(&tokens, subscription) {
            index.removes += 1;
            index.cache.clear();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Every indexed subscription (for monitoring; walks the whole trie under the lock).
    pub(crate) fn snapshot(&self) -> Vec<Arc<Subscription>> {
        fn walk(level: &Level, out: &mut Vec<Arc<Subscription>>) {
            let nodes = level
                .literal
                .values()
                .chain(level.single.as_deref())
                .chain(level.full.as_deref());
            for node in nodes {
                out.extend(node.subscriptions.iter().cloned());
                if let Some(next) = &node.next {
                    walk(next, out);
                }
            }
        }
        let index = self.lock();
        let mut out = Vec::new();
        walk(&index.root, &mut out);
        out
    }

    pub(crate) fn stats(&self) -> IndexStats {
        let index = self.lock();
        let fanouts: Vec<usize> = index
            .cache
            .values()
            .map(|matches| matches.plain.len() + matches.groups.len())
            .collect();
        IndexStats {
            cache_len: index.cache.len(),
            inserts: index.inserts,
            removes: index.removes,
            matches: index.matches,
            cache_hits: index.cache_hits,
            max_fanout: fanouts.iter().copied().max().unwrap_or(0),
            avg_fanout: if fanouts.is_empty() {
                0.0
            } else {
                fanouts.iter().sum::<usize>() as f64 / fanouts.len() as f64
            },
        }
    }

    pub(crate) fn lookup(&self, subject: &str) -> Arc<Matches> {
        let mut index = self.lock();
        index.matches += 1;
        if let Some(matches) = index.cache.get(subject) {
            let matches = matches.clone();
            index.cache_hits += 1;
            return matches;
        }
        let tokens: Vec<&str> = subject.split('.').collect();
        let mut nodes = Vec::new();
        index.root.collect(&tokens, &mut nodes);
        let mut matches = Matches::default();
        let mut group_names: Vec<&str> = Vec::new();
        for node in nodes {
            for subscription in &node.subscriptions {
                match &subscription.queue {
                    None => matches.plain.push(subscription.clone()),
                    Some(queue) => match group_names.iter().position(|name| name == queue) {
                        Some(at) => matches.groups[at].push(subscription.clone()),
                        None => {
                            group_names.push(queue);
                            matches.groups.push(vec![subscription.clone()]);
                        }
                    },
                }
            }
        }
        let matches = Arc::new(matches);
        if index.cache.len() >= CACHE_LIMIT {
            index.cache.clear();
        }
        index.cache.insert(subject.into(), matches.clone());
        matches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::broker::BrokerStats;

    fn subscription(sid: &str, subject: &str, queue: Option<&str>) -> Arc<Subscription> {
        let outbound = Arc::new(Outbound::new(
            1024,
            crate::bus::broker::outbound::unlimited(),
            Arc::new(BrokerStats::default()),
        ));
        Arc::new(Subscription::new(
            1,
            false,
            outbound,
            Bytes::copy_from_slice(sid.as_bytes()),
            subject.into(),
            queue.map(Into::into),
            Vec::new(),
        ))
    }

    fn sids(matches: &Matches) -> (Vec<String>, Vec<Vec<String>>) {
        let name = |sub: &Arc<Subscription>| String::from_utf8_lossy(&sub.sid).into_owned();
        (
            matches.plain.iter().map(name).collect(),
            matches
                .groups
                .iter()
                .map(|group| group.iter().map(name).collect())
                .collect(),
        )
    }

    #[test]
    fn lookup_order_and_groups() {
        let router = Router::default();
        let subs = [
            subscription("lit", "a.b", None),
            subscription("star", "a.*", None),
            subscription("full", "a.>", None),
            subscription("root", ">", None),
            subscription("q1", "a.b", Some("workers")),
            subscription("q2", "a.*", Some("workers")),
            subscription("q3", "a.b", Some("other")),
            subscription("miss", "a.b.c", None),
        ];
        for sub in &subs {
            router.insert(sub.clone());
        }
        // (subject, plain sids in order, queue groups with their member sids)
        type Case<'a> = (&'a str, Vec<&'a str>, Vec<Vec<&'a str>>);
        let cases: [Case; 4] = [
            (
                "a.b",
                vec!["root", "full", "lit", "star"],
                vec![vec!["q1", "q2"], vec!["q3"]],
            ),
            ("a.c", vec!["root", "full", "star"], vec![vec!["q2"]]),
            ("a.b.c", vec!["root", "full", "miss"], vec![]),
            ("b", vec!["root"], vec![]),
        ];
        for (subject, plain, groups) in cases {
            let (got_plain, got_groups) = sids(&router.lookup(subject));
            assert_eq!(got_plain, plain, "{subject}");
            assert_eq!(got_groups, groups, "{subject}");
        }
        for sub in &subs {
            router.remove(sub);
            router.remove(sub);
        }
        assert!(router.lookup("a.b").is_empty());
        assert!(router.lock().root.is_empty(), "empty nodes are pruned");
    }

    #[test]
    fn cache_is_invalidated_by_changes() {
        let router = Router::default();
        assert!(router.lookup("x").is_empty());
        let generation = router.generation();
        let sub = subscription("1", "x", None);
        router.insert(sub.clone());
        assert_ne!(router.generation(), generation);
        assert_eq!(router.lookup("x").plain.len(), 1);
        router.remove(&sub);
        assert!(router.lookup("x").is_empty());
    }

    #[test]
    fn claim_respects_max() {
        let sub = subscription("1", "x", None);
        assert_eq!(sub.claim(), Claim::Deliver);
        assert!(!sub.set_max(3));
        let claims: Vec<Claim> = (0..3).map(|_| sub.claim()).collect();
        assert_eq!(
            claims,
            [Claim::Deliver, Claim::DeliverLast, Claim::Exhausted]
        );
        assert!(sub.is_exhausted());
    }
}

/// The trie against a reference matcher written the obvious way (proptest, bounded cases).
#[cfg(test)]
mod prop {
    use super::*;
    use crate::bus::broker::BrokerStats;
    use proptest::prelude::*;

    /// The NATS rule, token by token: `*` takes exactly one token, `>` one or more at the end.
    fn reference_matches(pattern: &[&str], subject: &[&str]) -> bool {
        match (pattern.split_first(), subject.split_first()) {
            (None, None) => true,
            (Some((&">", [])), Some(_)) => true,
            (Some((&"*", rest)), Some((_, subject_rest))) => reference_matches(rest, subject_rest),
            (Some((token, rest)), Some((subject_token, subject_rest))) => {
                token == subject_token && reference_matches(rest, subject_rest)
            }
            _ => false,
        }
    }

    fn pattern() -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c", "*"]), 0..4),
            prop_oneof![Just(None::<&str>), Just(Some(">")), Just(Some("a"))],
        )
            .prop_filter_map("a subject has at least one token", |(tokens, last)| {
                let mut tokens: Vec<String> = tokens.into_iter().map(String::from).collect();
                tokens.extend(last.map(String::from));
                (!tokens.is_empty()).then(|| tokens.join("."))
            })
    }

    fn subject() -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c", "d"]), 1..5)
            .prop_map(|tokens| tokens.join("."))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// After any inserts and removals, a lookup returns exactly the live subscriptions
        /// whose pattern the reference matcher accepts, and `subject_matches` agrees too.
        #[test]
        fn lookup_agrees_with_the_reference(
            patterns in proptest::collection::vec((pattern(), any::<bool>()), 1..16),
            removed in proptest::collection::vec(any::<bool>(), 16),
            subjects in proptest::collection::vec(subject(), 1..8),
        ) {
            let outbound = Arc::new(Outbound::new(
                1024,
                crate::bus::broker::outbound::unlimited(),
                Arc::new(BrokerStats::default()),
            ));
            let router = Router::default();
            let mut live = Vec::new();
            for (index, (pattern, queued)) in patterns.iter().enumerate() {
                let subscription = Arc::new(Subscription::new(
                    1,
                    false,
                    outbound.clone(),
                    Bytes::from(index.to_string()),
                    pattern.clone(),
                    queued.then(|| "group".to_string()),
                    Vec::new(),
                ));
                router.insert(subscription.clone());
                // Lookups between changes fill the cache, which the changes must invalidate.
                router.lookup(&subjects[0]);
                if removed[index] {
                    router.remove(&subscription);
                } else {
                    live.push((index, pattern.clone()));
                }
            }
            for subject in &subjects {
                let subject_tokens: Vec<&str> = subject.split('.').collect();
                let mut expected: Vec<usize> = live
                    .iter()
                    .filter(|(_, pattern)| {
                        let pattern_tokens: Vec<&str> = pattern.split('.').collect();
                        let matched = reference_matches(&pattern_tokens, &subject_tokens);
                        assert_eq!(
                            crate::bus::subjects::subject_matches(pattern, subject),
                            matched,
                            "subject_matches({pattern}, {subject})"
                        );
                        matched
                    })
                    .map(|(index, _)| *index)
                    .collect();
                let matches = router.lookup(subject);
                let mut got: Vec<usize> = matches
                    .plain
                    .iter()
                    .chain(matches.groups.iter().flatten())
                    .map(|sub| std::str::from_utf8(&sub.sid).unwrap().parse().unwrap())
                    .collect();
                expected.sort_unstable();
                got.sort_unstable();
                prop_assert_eq!(got, expected, "subject {}", subject);
            }
        }
    }
}
