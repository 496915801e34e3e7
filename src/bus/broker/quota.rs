//! What one credential may take of the broker, over all its connections together.
//!
//! The broker-wide limits (connections, `max_pending_total`) bound the process; these bound
//! one user inside it, so that no single client uses them up alone: a publish rate (a token
//! bucket; past it the user's connections are read more slowly, so its publishers wait in
//! their own sockets and nothing is dropped) and a pending-bytes budget (past it the user's
//! readers that stopped reading are closed as slow consumers, not someone else's). A
//! connection joins its user's [`UserQuota`] at CONNECT when its permissions say so
//! (`Permissions::quota`).
//!
//! Past the budget only connections whose socket has been full for `MIN_BLOCKED` (they are
//! not reading what the kernel already holds for them) are cut, longest blocked first: a
//! user's reading connection is never cut for the bytes its stalled siblings hold, and
//! whether a connection reads takes that long to see. So the budget is a mark, not a wall:
//! appends past it are not refused; the per-connection limit and the broker-wide budget
//! (which pauses publishers) remain the walls.
//!
//! The bucket is taken in chunks of [`TOKEN_CHUNK`] publishes, so a connection locks it once
//! per chunk, not once per message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::outbound::{Outbound, PendingBudget};

/// Publishes a connection takes from its user's bucket at a time.
pub(crate) const TOKEN_CHUNK: u32 = 32;

/// Limits per user (`BrokerConfig::user_limits`).
#[derive(Clone, Debug, PartialEq)]
pub struct UserLimits {
    /// Messages per second, all of a user's connections together; 0: no rate.
    pub publish_rate: f64,
    /// Messages at once before the rate applies (the bucket's size).
    pub publish_burst: u32,
    /// Bytes queued to a user's connections together; 0: no budget of its own.
    pub max_pending: usize,
}

/// The users that have a connection now, each with its limits' state.
pub(crate) struct Quotas {
    limits: UserLimits,
    users: Mutex<Users>,
}

struct Users {
    by_name: HashMap<String, Weak<UserQuota>>,
    /// Entries of users whose last connection has gone are dropped when the map grows past
    /// this.
    sweep_at: usize,
}

impl Quotas {
    pub(crate) fn new(limits: UserLimits) -> Self {
        Quotas {
            limits,
            users: Mutex::new(Users {
                by_name: HashMap::new(),
                sweep_at: 64,
            }),
        }
    }

    /// The quota of `user`, made on its first connection, with `outbound` among the
    /// connections its pending budget counts.
    pub(crate) fn join(&self, user: &str, outbound: &Arc<Outbound>) -> Arc<UserQuota> {
        let quota = {
            let mut users = self
                .users
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match users.by_name.get(user).and_then(Weak::upgrade) {
                Some(quota) => quota,
                None => {
                    if users.by_name.len() >= users.sweep_at {
                        users.by_name.retain(|_, quota| quota.strong_count() > 0);
                        users.sweep_at = (users.by_name.len() * 2).max(64);
                    }
                    let quota = Arc::new(UserQuota::new(user, &self.limits));
                    users
                        .by_name
                        .insert(user.to_string(), Arc::downgrade(&quota));
                    quota
                }
            }
        };
        if let Some(budget) = &quota.pending {
            quota.members().push(Arc::downgrade(outbound));
            outbound.join_user_budget(budget.clone());
        }
        quota
    }
}

/// One user's publish bucket and pending budget.
pub(crate) struct UserQuota {
    rate: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
    pending: Option<Arc<PendingBudget>>,
    /// The user's connections, for its budget's shedder (weak: a connection that has gone
    /// is skipped and swept).
    members: Arc<Mutex<Vec<Weak<Outbound>>>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl UserQuota {
    fn new(user: &str, limits: &UserLimits) -> Self {
        let members: Arc<Mutex<Vec<Weak<Outbound>>>> = Arc::default();
        let pending = (limits.max_pending > 0).then(|| {
            let budget = Arc::new(PendingBudget::new(limits.max_pending));
            let (weak_budget, weak_members) = (Arc::downgrade(&budget), Arc::downgrade(&members));
            let user = user.to_string();
            // Every append past the budget asks; one scan a millisecond answers them all.
            let last_scan = Mutex::new(None::<Instant>);
            budget.set_shedder(Box::new(move |_needed| {
                let (Some(budget), Some(members)) = (weak_budget.upgrade(), weak_members.upgrade())
                else {
                    return;
                };
                {
                    let mut last = last_scan.lock().unwrap_or_else(|p| p.into_inner());
                    if last.is_some_and(|at| at.elapsed() < Duration::from_millis(1)) {
                        return;
                    }
                    *last = Some(Instant::now());
                }
                shed(&user, &budget, &members);
            }));
            budget
        });
        UserQuota {
            rate: limits.publish_rate,
            burst: f64::from(limits.publish_burst.max(1)),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.publish_burst.max(1)),
                at: Instant::now(),
            }),
            pending,
            members,
        }
    }

    fn members(&self) -> MutexGuard<'_, Vec<Weak<Outbound>>> {
        let mut members = self
            .members
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if members.len() >= 8 && members.len().is_power_of_two() {
            members.retain(|member| member.strong_count() > 0);
        }
        members
    }

    /// Takes up to `want` publishes from the bucket: how many were granted (at least 1), or
    /// how long until one is. Without a rate every request is granted in full.
    pub(crate) fn take_publishes(&self, want: u32) -> Result<u32, Duration> {
        if self.rate <= 0.0 {
            return Ok(want);
        }
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let elapsed = now.duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate));
        }
        let granted = bucket.tokens.floor().min(f64::from(want)) as u32;
        bucket.tokens -= f64::from(granted);
        Ok(granted)
    }
}

/// Cuts `user`'s connections whose socket has been full for `MIN_BLOCKED`, longest blocked
/// first, until it is back within its budget.
fn shed(user: &str, budget: &PendingBudget, members: &Mutex<Vec<Weak<Outbound>>>) {
    let outbounds: Vec<Arc<Outbound>> = members
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    // (blocked for, pending bytes, buffer) of those stuck long enough.
    let mut stuck: Vec<(Duration, usize, Arc<Outbound>)> = outbounds
        .into_iter()
        .filter_map(|outbound| match outbound.pending() {
            (pending, Some(blocked)) if pending > 0 && blocked >= super::MIN_BLOCKED => {
                Some((blocked, pending, outbound))
            }
            _ => None,
        })
        .collect();
    stuck.sort_unstable_by_key(|(blocked, _, _)| std::cmp::Reverse(*blocked));
    for (blocked, pending, outbound) in stuck {
        if budget.total() <= budget.limit() {
            break;
        }
        if outbound.cut_slow() {
            tracing::info!(
                user,
                pending,
                ?blocked,
                total = budget.total(),
                "bus slow consumer: bus.max_pending_per_key reached"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::broker::outbound::Queued;
    use crate::bus::broker::BrokerStats;

    fn limits(rate: f64, burst: u32, max_pending: usize) -> UserLimits {
        UserLimits {
            publish_rate: rate,
            publish_burst: burst,
            max_pending,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_grants_the_burst_then_the_rate() {
        let quota = UserQuota::new("k", &limits(10.0, 5, 0));
        assert_eq!(quota.take_publishes(32), Ok(5));
        let wait = quota.take_publishes(32).unwrap_err();
        assert!(
            wait <= Duration::from_millis(100) && wait > Duration::ZERO,
            "{wait:?}"
        );
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(quota.take_publishes(32), Ok(3));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(quota.take_publishes(2), Ok(2), "granted no more than asked");
        assert_eq!(
            quota.take_publishes(32),
            Ok(3),
            "the bucket holds the burst at most"
        );
        let unlimited = UserQuota::new("k", &limits(0.0, 1, 0));
        assert_eq!(unlimited.take_publishes(32), Ok(32));
    }

    #[test]
    fn one_users_connections_share_a_budget_and_only_its_stuck_readers_are_cut() {
        let stats = Arc::new(BrokerStats::default());
        let broker_wide = crate::bus::broker::outbound::unlimited();
        let quotas = Quotas::new(limits(0.0, 1, 10));
        let new = || Arc::new(Outbound::new(100, broker_wide.clone(), stats.clone()));
        let (hog, reader, stranger) = (new(), new(), new());
        let quota = quotas.join("key-a", &hog);
        let same = quotas.join("key-a", &reader);
        assert!(Arc::ptr_eq(&quota, &same), "one quota per user");
        let _other = quotas.join("key-b", &stranger);
        assert_eq!(hog.push(&[b"12345678"]), Queued::Wake);
        // Another user's buffer is not counted against key-a's budget.
        assert_eq!(stranger.push(&[b"abcdefgh"]), Queued::Wake);
        // Past key-a's budget, but its hog has not been seen blocked: nobody is cut and the
        // append is not refused.
        assert_eq!(reader.push(&[b"abc"]), Queued::Wake);
        assert_eq!(quota.pending.as_ref().unwrap().total(), 11);
        // Its socket has been full long enough now: the next append past the budget cuts it,
        // not the reader.
        hog.mark_blocked();
        std::thread::sleep(crate::bus::broker::MIN_BLOCKED + Duration::from_millis(10));
        assert_eq!(reader.push(&[b"d"]), Queued::Pending);
        assert!(hog.pending().0 == 0 && hog.push(&[b"x"]) == Queued::Closed);
        assert_eq!(
            stats
                .slow_consumers
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(quota.pending.as_ref().unwrap().total(), 4);
        assert_eq!(reader.pending().0, 4);
        assert_eq!(stranger.pending().0, 8);
    }

    #[test]
    fn users_whose_connections_have_gone_are_swept() {
        let stats = Arc::new(BrokerStats::default());
        let broker_wide = crate::bus::broker::outbound::unlimited();
        let quotas = Quotas::new(limits(1.0, 1, 10));
        for i in 0..200 {
            let outbound = Arc::new(Outbound::new(100, broker_wide.clone(), stats.clone()));
            drop(quotas.join(&format!("agent:{i}"), &outbound));
        }
        assert!(quotas.users.lock().unwrap().by_name.len() <= 128);
    }
}
