//! Per-key token buckets (contract §4: `rate_limit.requests_per_second` and `burst`), and
//! per-key counts of requests in progress (`rate_limit.max_in_flight`).
//!
//! A std mutex over a map is enough: the critical section is a few arithmetic operations and
//! nothing awaits while it is held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Error, Result};

pub struct RateLimiter {
    rate_per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    pub fn new(rate_per_second: f64, burst: u32) -> Self {
        RateLimiter {
            rate_per_second: rate_per_second.max(0.001),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key_id`, or says how long until one is available.
    pub fn check(&self, key_id: &str) -> Result<()> {
        self.check_at(key_id, Instant::now())
    }

    fn check_at(&self, key_id: &str, now: Instant) -> Result<()> {
        let mut buckets = self.buckets.lock().expect("rate limiter lock poisoned");
        let bucket = buckets.entry(key_id.to_string()).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate_per_second).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / self.rate_per_second;
        Err(Error::RateLimited {
            retry_after: Duration::from_secs_f64(wait.ceil().max(1.0)),
        })
    }

    /// Drops the bucket of a deleted key.
    pub fn forget(&self, key_id: &str) {
        self.buckets
            .lock()
            .expect("rate limiter lock poisoned")
            .remove(key_id);
    }
}

/// Both per-key limits, as the domain holds them.
pub struct KeyLimits {
    pub rate: RateLimiter,
    pub in_flight: InFlight,
}

/// Counts each key's requests in progress; a request past `max` is refused (429) instead of
/// waiting, so one key cannot hold an unbounded share of the server (e.g. with bodies that
/// never finish).
pub struct InFlight {
    max: usize,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

/// One request's slot, given back when dropped.
#[must_use = "the slot is given back when the admission is dropped"]
pub struct Admission {
    key_id: String,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl InFlight {
    pub fn new(max: usize) -> Self {
        InFlight {
            max: max.max(1),
            counts: Arc::default(),
        }
    }

    /// Takes a slot for `key_id`, or refuses with `TooManyInFlight`.
    pub fn admit(&self, key_id: &str) -> Result<Admission> {
        let mut counts = self.counts.lock().expect("in-flight lock poisoned");
        let count = counts.entry(key_id.to_string()).or_default();
        if *count >= self.max {
            return Err(Error::TooManyInFlight(format!(
                "this key already has {} requests in progress (rate_limit.max_in_flight); \
                 retry when one has finished",
                self.max
            )));
        }
        *count += 1;
        Ok(Admission {
            key_id: key_id.to_string(),
            counts: self.counts.clone(),
        })
    }

    /// Requests in progress for `key_id`.
    pub fn count(&self, key_id: &str) -> usize {
        let counts = self.counts.lock().expect("in-flight lock poisoned");
        counts.get(key_id).copied().unwrap_or(0)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().expect("in-flight lock poisoned");
        if let Some(count) = counts.get_mut(&self.key_id) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_slots_are_per_key_and_given_back() {
        let in_flight = InFlight::new(2);
        let a = in_flight.admit("k").unwrap();
        let b = in_flight.admit("k").unwrap();
        assert!(matches!(
            in_flight.admit("k"),
            Err(Error::TooManyInFlight(_))
        ));
        let other = in_flight.admit("other").unwrap();
        drop(a);
        let c = in_flight.admit("k").unwrap();
        drop((b, c, other));
        assert_eq!(in_flight.count("k"), 0);
        assert!(in_flight.counts.lock().unwrap().is_empty());
    }

    #[test]
    fn burst_then_refill() {
        let limiter = RateLimiter::new(2.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            limiter.check_at("k", start).unwrap();
        }
        let Err(Error::RateLimited { retry_after }) = limiter.check_at("k", start) else {
            panic!("fourth request within the burst window must be limited");
        };
        assert_eq!(retry_after, Duration::from_secs(1));
        limiter.check_at("other", start).unwrap();
        limiter
            .check_at("k", start + Duration::from_millis(500))
            .unwrap();
        assert!(limiter
            .check_at("k", start + Duration::from_millis(500))
            .is_err());
    }
}
