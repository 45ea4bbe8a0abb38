//! The fleet's counters in Redis (the rules are in [`crate::dedup::fleet`]): one script run
//! adds to this bucket's counter and reads the last whole ones. The counters are
//! `{<namespace>:fleet}:<bucket>`: the hash tag puts every counter of one table in one slot,
//! so a Redis Cluster serves them from one node and the run touches no other.

use std::time::Duration;

use super::slots::key_slot;
use super::RedisStore;
use crate::dedup::fleet::{FleetCounters, Share};
use crate::error::StoreError;

/// The script of a share.
pub(super) const FLEET_SCRIPT: &str = include_str!("fleet.lua");

impl RedisStore {
    /// The key of bucket `bucket`'s counter.
    fn fleet_key(&self, bucket: u64) -> String {
        // The table's namespace, not the shape's: a fleet keeps one count across a resize.
        format!("{{{}:fleet}}:{bucket}", self.inner.config.namespace)
    }
}

impl FleetCounters for RedisStore {
    fn fleet_interval(&self) -> Duration {
        self.inner.config.fleet_interval
    }

    async fn share_distinct(&self, distinct: u64) -> Result<f64, StoreError> {
        let inner = &*self.inner;
        let share = Share::now(self.fleet_interval());
        let current = self.fleet_key(share.current);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(inner.fleet_script.get_hash())
            .arg(1 + share.read.len())
            .arg(&current);
        for &bucket in &share.read {
            evalsha.arg(self.fleet_key(bucket));
        }
        evalsha
            .arg(distinct)
            .arg(u64::try_from(share.ttl.as_millis()).unwrap_or(u64::MAX));
        let slot = if inner.config.cluster {
            key_slot(current.as_bytes())
        } else {
            0
        };
        let value = inner.link.eval(&inner.fleet_script, slot, &evalsha).await?;
        let counters: Vec<u64> = redis::from_redis_value(&value).map_err(|error| {
            StoreError::Protocol(format!("the fleet script answered {value:?}: {error}"))
        })?;
        Ok(share.rate(&counters))
    }
}
