//! The fleet's distinct rate: what every consumer of one shared table sees together.
//!
//! A table shared by several consumers fills at the sum of their distinct rates, and each one
//! sees only its own share. So each consumer adds its count of distinct messages, once per
//! bucket of `fleet_interval` ([`MemcachedConfig::fleet_interval`], default
//! [`DEFAULT_FLEET_INTERVAL`]), to a counter in the store (`<namespace>:fleet:<bucket>`, where
//! the bucket is the Unix time divided by the bucket's length), and reads the counters of the
//! last [`FLEET_BUCKETS`] whole buckets in the same round trip: their sum over their span is
//! the fleet's rate. Each consumer adds in the middle of a bucket ([`until_next_share`]), so
//! every whole bucket holds exactly one count of each. The fleet is every consumer with the
//! same namespace and table shape, which is every consumer of the same table. Buckets go by
//! wall clocks, so keep them in sync (NTP); each counter expires after [`FLEET_TTL`] (or eight
//! buckets, if longer).
//!
//! [`MemcachedConfig::fleet_interval`]: super::MemcachedConfig::fleet_interval
//! [`until_next_share`]: MemcachedStore::until_next_share

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{unavailable, MemcachedStore};
use crate::error::StoreError;

/// How often each consumer adds its count, and the length of one counter's bucket, unless
/// `store.fleet_interval` says otherwise.
pub const DEFAULT_FLEET_INTERVAL: Duration = Duration::from_secs(10);

/// How many whole buckets the fleet's rate is measured over (a minute at the default); a
/// consumer reports the fleet's rate once it has shared one more than this.
pub const FLEET_BUCKETS: u64 = 6;

/// How long a bucket's counter is kept.
const FLEET_TTL: Duration = Duration::from_secs(180);

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

impl MemcachedStore {
    /// The length of one bucket of the fleet's counters (`store.fleet_interval`).
    pub fn fleet_interval(&self) -> Duration {
        self.inner.config.fleet_interval
    }

    /// How long until the middle of the next bucket: when to call [`share_distinct`] next, so
    /// that each bucket gets one count of every consumer, clear of its edges.
    ///
    /// [`share_distinct`]: MemcachedStore::share_distinct
    pub fn until_next_share(&self) -> Duration {
        let length = self.bucket_millis();
        let now = unix_millis();
        let middle = (now / length + 1) * length + length / 2;
        let wait = (middle - now) % length;
        Duration::from_millis(if wait == 0 { length } else { wait })
    }

    fn bucket_millis(&self) -> u64 {
        (self.fleet_interval().as_millis() as u64).max(1)
    }

    /// Adds `distinct` (this consumer's distinct messages since its last call) to the current
    /// bucket, and returns the fleet's distinct messages per second over the last
    /// [`FLEET_BUCKETS`] whole buckets. Call it once per bucket, at
    /// [`until_next_share`](MemcachedStore::until_next_share); every consumer of the table
    /// needs the same `fleet_interval`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the server of the counters does not answer.
    pub async fn share_distinct(&self, distinct: u64) -> Result<f64, StoreError> {
        let length = self.bucket_millis();
        let current = unix_millis() / length;
        let base = format!("{}:fleet", self.namespace());
        let key = |b: u64| format!("{base}:{b}");
        let counters: Vec<String> = (1..=FLEET_BUCKETS)
            .map(|back| key(current.saturating_sub(back)))
            .collect();
        let server = &self.inner.servers[self.route(&base)];
        let timeout = self.inner.config.timeout;
        let mut conn = self.pipe(server).await?;
        let ttl = FLEET_TTL
            .max(self.fleet_interval() * (FLEET_BUCKETS as u32 + 2))
            .as_secs();
        let values = tokio::time::timeout(
            timeout,
            conn.add_and_read(&key(current), distinct, ttl, &counters),
        )
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(|error| unavailable(server, &error))?;
        conn.set_healthy(true);
        let span = (length * FLEET_BUCKETS) as f64 / 1000.0;
        Ok(values.iter().sum::<u64>() as f64 / span)
    }
}
