//! A Redis Cluster's slot map as a [`Link`] keeps it: read from `CLUSTER SLOTS` of every
//! known node at once (the first answer wins, so a dead or frozen node holds up no other),
//! once per failure however many operations saw it, and the master each slot is routed to.

use std::sync::atomic::Ordering;

use futures::future::select_ok;
use redis::{RedisError, Value};
use tokio::time::Instant;

use super::{host_of, Link};
use crate::dedup::redis::slots::SlotMap;
use crate::error::StoreError;

impl Link {
    /// The master of `slot` (the server, when standalone), reading the slot map first when it
    /// is unknown or stale.
    pub(super) async fn route(&self, slot: u16, deadline: Instant) -> Result<String, StoreError> {
        if !self.cluster {
            return Ok(self.seeds[0].clone());
        }
        if self.stale.load(Ordering::Relaxed) {
            // A node ran out of time: its slots may have a new master. If no node answers,
            // route by the old map.
            let _ = self.refresh_slots(self.generation(), deadline).await;
        }
        if let Some(master) = self.slots_map().master(slot) {
            return Ok(master.to_owned());
        }
        self.refresh_slots(self.generation(), deadline).await?;
        self.slots_map()
            .master(slot)
            .map(str::to_owned)
            .ok_or_else(|| StoreError::Unavailable {
                addr: self.addr.clone(),
                detail: format!("no master serves slot {slot}"),
            })
    }

    /// The master of `slot` in the slot map as last read, if it names one. A cluster's
    /// operations group their keys by it; one grouped by a map that is out of date fails at
    /// the node and is sent again another way.
    pub(in crate::dedup::redis) fn master_of(&self, slot: u16) -> Option<String> {
        self.slots_map().master(slot).map(str::to_owned)
    }

    /// Marks the slot map out of date: the next operation reads it again before routing.
    pub(in crate::dedup::redis) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// How many times the slot map has been read.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Reads the slot map again, unless it was read since generation `seen`: asks every known
    /// master and seed at once, and takes the first map that names a master.
    pub(super) async fn refresh_slots(
        &self,
        seen: u64,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let _refreshing = match tokio::time::timeout_at(deadline, self.refreshing.lock()).await {
            Ok(guard) => guard,
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        if self.generation() != seen {
            // Read by another operation while this one waited.
            return Ok(());
        }
        let mut candidates = self.slots_map().all_masters();
        candidates.extend(self.seeds.iter().cloned());
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.is_empty() {
            return Err(StoreError::Unavailable {
                addr: self.addr.clone(),
                detail: "no node to ask for the slot map".into(),
            });
        }
        let asks = candidates
            .iter()
            .map(|node| Box::pin(self.slots_of(node, deadline)));
        // The nodes that have not answered yet are dropped with the rest of `select_ok`'s
        // answer: nothing waits for them.
        let map = select_ok(asks).await.map(|(map, _unasked)| map)?;
        *self.slots_map() = map;
        self.stale.store(false, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// The slot map as `node` sees it.
    async fn slots_of(&self, node: &str, deadline: Instant) -> Result<SlotMap, StoreError> {
        let open = self.node(node, deadline).await?;
        let mut asking = open.conn.clone();
        let answer: Result<Value, RedisError> = self
            .within(
                deadline,
                node,
                &open,
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut asking),
            )
            .await?;
        match answer {
            Ok(value) => match SlotMap::from_cluster_slots(&value, host_of(node)) {
                Ok(map) if !map.all_masters().is_empty() => Ok(map),
                Ok(_) => Err(StoreError::Unavailable {
                    addr: node.to_owned(),
                    detail: "CLUSTER SLOTS named no master".into(),
                }),
                Err(detail) => Err(StoreError::Protocol(detail)),
            },
            Err(error) => Err(self.failed(node, &error)),
        }
    }

    pub(super) fn slots_map(&self) -> std::sync::MutexGuard<'_, SlotMap> {
        // As above.
        self.slots
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}
