//! The fleet's counters in Memcached (the rules are in [`crate::dedup::fleet`]): one round
//! trip to the server that rendezvous hashing picks for `<namespace>:fleet` adds to this
//! bucket's counter and reads the last whole ones.

use std::time::Duration;

use super::{unavailable, MemcachedStore};
use crate::dedup::fleet::{FleetCounters, Share};
use crate::error::StoreError;

impl FleetCounters for MemcachedStore {
    fn fleet_interval(&self) -> Duration {
        self.inner.config.fleet_interval
    }

    async fn share_distinct(&self, distinct: u64) -> Result<f64, StoreError> {
        let share = Share::now(self.fleet_interval());
        // The table's namespace, not the shape's: a fleet keeps one count across a resize.
        let base = format!("{}:fleet", self.inner.config.namespace);
        let key = |b: u64| format!("{base}:{b}");
        let counters: Vec<String> = share.read.iter().map(|&b| key(b)).collect();
        let server = &self.inner.servers[self.route(&base)];
        let timeout = self.inner.config.timeout;
        let mut conn = self.pipe(server).await?;
        let values = tokio::time::timeout(
            timeout,
            conn.add_and_read(
                &key(share.current),
                distinct,
                share.ttl.as_secs(),
                &counters,
            ),
        )
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(|error| unavailable(server, &error))?;
        conn.set_healthy(true);
        Ok(share.rate(&values))
    }
}
