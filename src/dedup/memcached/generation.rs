//! The Memcached side of a table's generations (the rules are in
//! [`crate::dedup::generational`]): the descriptor item `<prefix>:table`, read with its CAS
//! token and replaced by a compare-and-swap (an add where it does not exist), and a claim's
//! read-only look-up in a previous shape's set, one read of the set's item decided as a
//! claim would decide it. The reads of a burst's previous items lead the first round trip of
//! its claims on each server (`MemcachedStore::run_ops_reading`), so a claim during a resize
//! costs no round trip of its own, and the digests of one item share its read.
//!
//! The descriptor has no expiry; memcached may still evict it under memory pressure, as any
//! item, but every consumer reads it at each fleet interval, which keeps it recently used.

use std::time::Duration;

use std::collections::HashMap;

use super::batch::BuildSetHasher;
use super::conn::{Read, Write, Written};
use super::layout::{COMPACT_FORMAT, SETS_FORMAT};
use super::set::{Op, Outcome};
use super::{unavailable, MemcachedStore};
use crate::dedup::generational::{Generation, LookedUp, Shape, DESCRIPTOR_SUFFIX};
use crate::dedup::{Claim, Digest, Geometry};
use crate::error::StoreError;

/// How many times a replace of the descriptor that lost its compare-and-swap to a write of
/// the very value it expected is tried again.
const SWAP_TRIES: usize = 4;

/// Sets of the earlier layout read to find whether a namespace without a descriptor holds a
/// table of it.
const PROBED_SETS: u64 = 64;

impl MemcachedStore {
    /// Reads `keys`, all of server `server`, in one round trip, with their CAS tokens.
    async fn read_items(&self, server: usize, keys: &[&str]) -> Result<Vec<Read>, StoreError> {
        let server = &self.inner.servers[server];
        let timeout = self.inner.config.timeout;
        let mut conn = self.pipe(server).await?;
        let read = tokio::time::timeout(timeout, conn.get_many(keys))
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
            .map_err(|error| unavailable(server, &error))?;
        conn.set_healthy(true);
        Ok(read)
    }

    /// The keys of the items `digests` fall in, each once, and each digest's index among them.
    fn look_keys(&self, digests: &[Digest]) -> (Vec<String>, Vec<usize>) {
        let mut keys: Vec<String> = Vec::with_capacity(digests.len());
        let mut index: HashMap<u64, usize, BuildSetHasher> =
            HashMap::with_capacity_and_hasher(digests.len(), BuildSetHasher::default());
        let item_of = digests
            .iter()
            .map(|&digest| {
                let item = self.item_of(digest);
                *index.entry(item).or_insert_with(|| {
                    keys.push(self.key_of_set(item));
                    keys.len() - 1
                })
            })
            .collect();
        (keys, item_of)
    }

    /// What a claim of each digest would answer on the reads of its item (`item_of` indexes
    /// `reads`), decided on a copy never written back.
    fn decide_looks(
        &self,
        digests: &[Digest],
        item_of: &[usize],
        reads: Vec<Result<Read, StoreError>>,
    ) -> Vec<Result<Claim, StoreError>> {
        let facts = self.lease_facts();
        digests
            .iter()
            .zip(item_of)
            .map(|(&digest, &i)| {
                let value = reads[i].as_ref().map_err(Clone::clone)?;
                let item = self.item_of(digest);
                let mut unit = self.decode_counted(value.as_ref().map(|(v, _)| v.clone()), item);
                match self.apply(&mut unit, Op::Claim, digest, facts).0 {
                    Outcome::Claim(claim) => Ok(claim),
                    Outcome::Held(_) => Err(StoreError::Protocol("a claim answered held".into())),
                }
            })
            .collect()
    }

    /// Writes `write` to server `server`.
    async fn write_item(&self, server: usize, write: Write<'_>) -> Result<Written, StoreError> {
        let server = &self.inner.servers[server];
        let timeout = self.inner.config.timeout;
        let mut conn = self.pipe(server).await?;
        let written = tokio::time::timeout(timeout, conn.set_many(&[write]))
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
            .map_err(|error| unavailable(server, &error))?;
        conn.set_healthy(true);
        written
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Protocol("no answer to a write".into()))
    }
}

fn text(key: &str, read: Option<&(Vec<u8>, u64)>) -> Result<Option<String>, StoreError> {
    read.map(|(value, _)| {
        String::from_utf8(value.clone())
            .map_err(|_| StoreError::Protocol(format!("`{key}` does not hold text")))
    })
    .transpose()
}

impl Generation for MemcachedStore {
    fn format(&self) -> u8 {
        self.inner.layout.format()
    }

    /// Its own format, and format 1 (an item per set), which a table moves from.
    fn reads_format(&self, format: u8) -> bool {
        format == SETS_FORMAT || format == COMPACT_FORMAT
    }

    fn table(&self) -> Geometry {
        self.inner.geometry
    }

    fn max_age(&self) -> Option<Duration> {
        self.inner.config.max_age
    }

    /// The table of the earlier layout (key format 1) at this store's geometry, when an item
    /// of it is found among 64 sets spread over the table (`PROBED_SETS`, one read per server):
    /// a table that versions before descriptors kept. A table whose probed sets are all
    /// absent holds little (most of its sets are empty) and is not read.
    async fn earlier_table(&self) -> Result<Option<Shape>, StoreError> {
        if self.inner.layout.format() != COMPACT_FORMAT {
            return Ok(None);
        }
        let geometry = self.inner.geometry;
        let earlier =
            MemcachedStore::new_lazy_in(self.inner.config.clone(), geometry, SETS_FORMAT)?;
        let sets = geometry.sets();
        let mut keys: Vec<String> = (0..PROBED_SETS)
            .map(|i| earlier.key_of_set(i * sets / PROBED_SETS))
            .collect();
        keys.dedup();
        let mut by_server: Vec<Vec<&str>> = vec![Vec::new(); self.inner.servers.len()];
        for key in &keys {
            by_server[earlier.route(key)].push(key);
        }
        for (server, keys) in by_server.iter().enumerate() {
            if !keys.is_empty()
                && earlier
                    .read_items(server, keys)
                    .await?
                    .iter()
                    .any(Option::is_some)
            {
                return Ok(Some(Shape {
                    format: SETS_FORMAT,
                    geometry,
                }));
            }
        }
        Ok(None)
    }

    fn reshaped(&self, shape: Shape) -> Result<Self, StoreError> {
        MemcachedStore::new_lazy_in(self.inner.config.clone(), shape.geometry, shape.format)
    }

    /// One read of each item the digests fall in (a burst's digests of one item share it),
    /// one round trip per server.
    async fn look_up_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let (keys, item_of) = self.look_keys(digests);
        let looks: Vec<(usize, &str)> = keys.iter().map(|k| (self.route(k), k.as_str())).collect();
        let reads = self.run_ops_reading(&[], &looks).await.1;
        self.decide_looks(digests, &item_of, reads)
    }

    /// The claims and the look-ups in one pipeline per server: each server's reads of the
    /// previous items lead the first round trip of this table's claims there.
    async fn claim_looking_up(&self, previous: &Self, digests: &[Digest], done: bool) -> LookedUp {
        let (keys, item_of) = previous.look_keys(digests);
        // The same servers in the same order (`reshaped`), so a server's index is the same.
        let looks: Vec<(usize, &str)> = keys
            .iter()
            .map(|k| (previous.route(k), k.as_str()))
            .collect();
        let op = if done { Op::ClaimDone } else { Op::Claim };
        let ops: Vec<(Op, Digest)> = digests.iter().map(|&d| (op, d)).collect();
        let (outcomes, reads) = self.run_ops_reading(&ops, &looks).await;
        let claims = outcomes
            .into_iter()
            .map(|outcome| match outcome? {
                Outcome::Claim(claim) => Ok(claim),
                Outcome::Held(_) => Err(StoreError::Protocol("claim gave no claim".into())),
            })
            .collect();
        (claims, previous.decide_looks(digests, &item_of, reads))
    }

    async fn descriptor(
        &self,
        replace: Option<(Option<&str>, &str)>,
    ) -> Result<Option<String>, StoreError> {
        let key = self.descriptor_key();
        let server = self.route(&key);
        for _ in 0..SWAP_TRIES {
            let read = self.read_items(server, &[&key]).await?.pop().flatten();
            let held = text(&key, read.as_ref())?;
            let Some((expected, new)) = replace else {
                return Ok(held);
            };
            if held.as_deref() != expected {
                return Ok(held);
            }
            let write = Write {
                key: &key,
                value: new.as_bytes(),
                cas: read.map(|(_, cas)| cas),
                quiet: false,
            };
            if let Written::Stored(_) = self.write_item(server, write).await? {
                return Ok(held);
            }
            // Another writer got there first: what it wrote is the answer, unless it wrote
            // the value expected again.
            let read = self.read_items(server, &[&key]).await?.pop().flatten();
            let now = text(&key, read.as_ref())?;
            if now.as_deref() != expected {
                return Ok(now);
            }
        }
        Err(StoreError::Contended {
            attempts: SWAP_TRIES as u32,
        })
    }

    fn descriptor_key(&self) -> String {
        format!("{}:{DESCRIPTOR_SUFFIX}", self.inner.config.namespace)
    }
}
