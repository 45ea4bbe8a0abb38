//! The fleet's distinct rate: what every consumer of one shared table sees together.
//!
//! A table shared by several consumers fills at the sum of their distinct rates, and each one
//! sees only its own share. So each consumer adds its count of distinct messages, once per
//! bucket of [`FLEET_BUCKET`], to a counter in the store (`<namespace>:fleet:<bucket>`, where
//! the bucket is the Unix time divided by the bucket's length), and reads the counters of the
//! last [`FLEET_BUCKETS`] whole buckets in the same round trip: their sum over their span is
//! the fleet's rate. The fleet is every consumer with the same namespace and table shape,
//! which is every consumer of the same table. Buckets go by wall clocks, so keep them in sync
//! (NTP); each counter expires after [`FLEET_TTL`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{unavailable, MemcachedStore};
use crate::error::StoreError;

/// How often each consumer adds its count, and the length of one counter's bucket.
pub const FLEET_BUCKET: Duration = Duration::from_secs(10);

/// How many whole buckets the fleet's rate is measured over (a minute at the default).
pub const FLEET_BUCKETS: u64 = 6;

/// How long a bucket's counter is kept.
const FLEET_TTL: Duration = Duration::from_secs(180);

impl MemcachedStore {
    /// Adds `distinct` (this consumer's distinct messages since its last call) to the current
    /// bucket of length `bucket`, and returns the fleet's distinct messages per second over the
    /// last [`FLEET_BUCKETS`] whole buckets. Call it once per `bucket`, with the same `bucket`
    /// in every consumer ([`FLEET_BUCKET`]; tests use shorter ones).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the server of the counters does not answer.
    pub async fn share_distinct(&self, distinct: u64, bucket: Duration) -> Result<f64, StoreError> {
        let length = bucket.as_millis().max(1) as u64;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let current = now / length;
        let base = format!("{}:fleet", self.namespace());
        let key = |b: u64| format!("{base}:{b}");
        let counters: Vec<String> = (1..=FLEET_BUCKETS)
            .map(|back| key(current.saturating_sub(back)))
            .collect();
        let server = &self.inner.servers[self.route(&base)];
        let timeout = self.inner.config.timeout;
        let mut conn = self.pipe(server).await?;
        let ttl = FLEET_TTL.max(bucket * (FLEET_BUCKETS as u32 + 2)).as_secs();
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
