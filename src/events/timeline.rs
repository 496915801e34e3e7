//! Events per minute over a recent window, for the console's health chart.
//!
//! Counts come from the log's time index alone (`Stream::seq_for_time` at each minute
//! boundary; the difference of two boundaries is that minute's count), so an hour of a busy
//! stream costs 61 index lookups, not a read of every record. Records are appended in time
//! order, which is what makes the difference exact.

use serde::Serialize;

use crate::auth::{Principal, Role};
use crate::{clock, Result};

/// The most minutes one timeline covers (a day).
pub const MAX_MINUTES: u32 = 24 * 60;

#[derive(Debug, Serialize)]
pub struct Timeline {
    /// Start of the first bucket (RFC 3339, on a minute boundary).
    pub since: String,
    pub bucket_seconds: u32,
    /// One count per minute, oldest first; the last is the minute in progress.
    pub counts: Vec<u64>,
}

/// Events appended in each of the last `minutes` minutes (1–`MAX_MINUTES`; 0 means 60). Any
/// key.
pub async fn per_minute(
    domain: &crate::domain::Domain,
    principal: &Principal,
    minutes: u32,
) -> Result<Timeline> {
    principal.require(Role::Readonly)?;
    let minutes = if minutes == 0 {
        60
    } else {
        minutes.min(MAX_MINUTES)
    };
    let log = domain.events.log();
    let now = clock::now_millis();
    let first = (now - now.rem_euclid(60_000)) - (i64::from(minutes) - 1) * 60_000;
    let mut boundaries = Vec::with_capacity(minutes as usize + 1);
    for index in 0..=i64::from(minutes) {
        let at = first + index * 60_000;
        boundaries.push(if at > now {
            log.last_seq().await? + 1
        } else {
            log.seq_for_time(at).await?
        });
    }
    let counts = boundaries
        .windows(2)
        .map(|pair| pair[1].saturating_sub(pair[0]))
        .collect();
    Ok(Timeline {
        since: clock::format_rfc3339(first),
        bucket_seconds: 60,
        counts,
    })
}
