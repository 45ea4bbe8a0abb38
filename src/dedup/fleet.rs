//! The fleet's distinct rate: what every consumer of one shared table sees together.
//!
//! A table shared by several consumers fills at the sum of their distinct rates, and each one
//! sees only its own share. So each consumer adds its count of distinct messages, once per
//! bucket of `fleet_interval` (default `DEFAULT_FLEET_INTERVAL`), to a counter in the store
//! (`<namespace>:fleet:<bucket>` in Memcached, `{<namespace>:fleet}:<bucket>` in Redis, where
//! the bucket is the Unix time divided by the bucket's length), and reads the counters of the
//! last [`FLEET_BUCKETS`] whole buckets in the same round trip: their sum over their span is
//! the fleet's rate. Each consumer adds in the middle of a bucket (`until_next_share`), so
//! every whole bucket holds exactly one count of each. The fleet is every consumer with the
//! same namespace, which is every consumer of the same table, whatever size each follows: the
//! counters are the table's, not a size's, so a resize keeps the fleet's count. Buckets go by
//! wall clocks, so keep them in sync (NTP); each counter expires after three minutes (or
//! eight buckets, if longer).
//!
//! This module holds the rules; each store's `share_distinct` does the one round trip.

use std::future::Future;
use std::time::Duration;

use crate::dedup::shared::now_ms;
use crate::error::StoreError;

/// How often each consumer adds its count, and the length of one counter's bucket, unless
/// `store.fleet_interval` says otherwise.
pub(crate) const DEFAULT_FLEET_INTERVAL: Duration = Duration::from_secs(10);

/// How many whole buckets the fleet's rate is measured over (a minute at the default); a
/// consumer reports the fleet's rate once it has shared one more than this.
pub const FLEET_BUCKETS: u64 = 6;

/// How long a bucket's counter is kept, at the least.
const FLEET_TTL: Duration = Duration::from_secs(180);

/// A store whose consumers share their distinct counts (see the module docs).
pub trait FleetCounters: Send + Sync {
    /// The length of one bucket of the fleet's counters (`store.fleet_interval`).
    fn fleet_interval(&self) -> Duration;

    /// How long until the middle of the next bucket: when to call
    /// [`share_distinct`](FleetCounters::share_distinct) next.
    fn until_next_share(&self) -> Duration {
        until_next_share(self.fleet_interval())
    }

    /// Adds `distinct` (this consumer's distinct messages since its last call) to the current
    /// bucket, and returns the fleet's distinct messages per second over the last
    /// [`FLEET_BUCKETS`] whole buckets. Call it once per bucket, at
    /// [`until_next_share`](FleetCounters::until_next_share);
    /// every consumer of the table needs the same `fleet_interval`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the server of the counters does not answer.
    fn share_distinct(&self, distinct: u64)
        -> impl Future<Output = Result<f64, StoreError>> + Send;
}

/// The rule for `fleet_interval`: the fleet's counters are named by the millisecond.
///
/// # Errors
///
/// What is wrong, for an error message that names the setting.
pub(crate) fn check_fleet_interval(interval: Duration) -> Result<(), &'static str> {
    if interval.as_millis() == 0 {
        Err("must be at least 1ms (the fleet's counters are named by the millisecond)")
    } else {
        Ok(())
    }
}

/// How long until the middle of the next bucket of `interval`: when to share next, so that
/// each bucket gets one count of every consumer, clear of its edges.
pub(crate) fn until_next_share(interval: Duration) -> Duration {
    let length = bucket_millis(interval);
    let now = now_ms();
    let middle = (now / length + 1) * length + length / 2;
    let wait = (middle - now) % length;
    Duration::from_millis(if wait == 0 { length } else { wait })
}

/// The buckets of one share: the one this consumer adds to, and the whole ones it reads.
pub(crate) struct Share {
    /// The current bucket's number.
    pub(crate) current: u64,
    /// The numbers of the last [`FLEET_BUCKETS`] whole buckets, newest first.
    pub(crate) read: Vec<u64>,
    /// How long the current bucket's counter is kept.
    pub(crate) ttl: Duration,
    span_seconds: f64,
}

impl Share {
    /// The buckets of a share made now.
    pub(crate) fn now(interval: Duration) -> Share {
        let length = bucket_millis(interval);
        let current = now_ms() / length;
        Share {
            current,
            read: (1..=FLEET_BUCKETS)
                .map(|back| current.saturating_sub(back))
                .collect(),
            ttl: FLEET_TTL.max(interval * (FLEET_BUCKETS as u32 + 2)),
            span_seconds: (length * FLEET_BUCKETS) as f64 / 1000.0,
        }
    }

    /// The fleet's distinct messages per second, from the counters read.
    pub(crate) fn rate(&self, counters: &[u64]) -> f64 {
        counters.iter().sum::<u64>() as f64 / self.span_seconds
    }
}

fn bucket_millis(interval: Duration) -> u64 {
    u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_reads_the_whole_buckets_before_its_own() {
        let share = Share::now(Duration::from_secs(10));
        assert_eq!(share.read.len() as u64, FLEET_BUCKETS);
        assert_eq!(share.read[0], share.current - 1);
        assert_eq!(share.read[5], share.current - 6);
        assert_eq!(share.ttl, Duration::from_secs(180));
        // 600 distinct messages over six buckets of 10 s.
        assert_eq!(share.rate(&[100; 6]), 10.0);
        assert_eq!(
            Share::now(Duration::from_secs(60)).ttl,
            Duration::from_secs(480)
        );
    }

    #[test]
    fn the_next_share_is_in_the_middle_of_a_bucket() {
        let interval = Duration::from_millis(1000);
        let wait = until_next_share(interval);
        assert!(wait > Duration::ZERO && wait <= interval, "{wait:?}");
        let landing = (now_ms() + wait.as_millis() as u64) % 1000;
        assert!(
            (400..=600).contains(&landing),
            "lands at {landing} ms of its bucket"
        );
    }
}
