//! The de-duplication memory: an "opposite of a Bloom filter", made set-associative.
//!
//! A Bloom filter may say "seen" wrongly and never says "not seen" wrongly. This table is the
//! reverse: a fixed array of slots where a digest picks a set and, if no slot of the set holds it,
//! overwrites the oldest one. "Seen" is only wrong if two digests share set and fingerprint
//! (see [`table`](crate::Table) for the odds); "not seen" is wrong once a digest has been pushed
//! out, and the number of slots decides how long that takes (see [`sizing`](crate::sizing)).
//!
//! Three stores share one geometry ([`Geometry`]) and one trait ([`Store`]):
//! - [`Table`](crate::Table): in-process, lock-free reads, one cache line per set.
//! - the Memcached store: one item per set, shared by many consumers.
//! - the Redis store: the same sets as keys of one Redis server or a Redis Cluster.
//!
//! [`NoStore`] de-duplicates nothing; it is the baseline for benchmarks and the `none` store.

#[cfg(feature = "sidecar")]
pub mod backend;
pub mod clock;
#[cfg(any(feature = "memcached", feature = "redis"))]
pub(crate) mod compact;
pub(crate) mod digest;
#[cfg(any(feature = "memcached", feature = "redis"))]
pub mod fleet;
#[cfg(any(feature = "memcached", feature = "redis"))]
pub mod generational;
pub mod journal;
mod json_key;
pub mod local;
#[cfg(feature = "memcached")]
pub(crate) mod memcached;
pub(crate) mod near;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(any(feature = "memcached", feature = "redis"))]
pub(crate) mod shared;
pub(crate) mod table;
pub mod table_file;

use std::future::Future;

use crate::error::StoreError;
pub use digest::Digest;
pub use near::{NearStats, NearTable};

/// What a store knew about a digest when it was claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The store did not hold the digest; it now holds it as in flight for this caller.
    New,
    /// Another delivery of the same content is being processed right now.
    InFlight,
    /// The content was processed before.
    Duplicate,
}

/// Slots a Memcached item holds in the compact layout unless configured otherwise
/// (`MemcachedConfig::slots_per_item`): whole sets, as many as fit. Beside the geometry, in
/// every build, because `size` estimates a table's Memcached memory with it.
pub(crate) const MEMCACHED_SLOTS_PER_ITEM: u32 = 64;

/// Slots a Redis key holds in the compact layout (key format 3): whole sets, as many as fit.
/// Beside the geometry, in every build, because `size` estimates a table's Redis memory with
/// it.
pub(crate) const REDIS_SLOTS_PER_KEY: u32 = 64;

/// The shape of a table: how many slots, grouped in sets of how many ways.
///
/// Every store maps a digest to a set the same way, so a table's contents do not depend on
/// where it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    sets: u64,
    ways: u32,
}

impl Geometry {
    /// The associativities a set supports: a set must fit in one 64-byte cache line.
    pub const SUPPORTED_WAYS: [u32; 4] = [1, 2, 4, 8];

    /// Bytes one slot takes in the in-process table.
    pub const SLOT_BYTES: u64 = 8;

    /// Slots of a table when no size is given: 8,388,608, which is 64 MiB in-process.
    pub const DEFAULT_SLOTS: u64 = 1 << 23;

    /// A geometry with at least `slots` slots, rounded up to whole sets of `ways`.
    ///
    /// # Errors
    ///
    /// [`TableError`](crate::error::TableError) when `slots` is zero or `ways` is not 1, 2, 4 or 8.
    pub fn new(slots: u64, ways: u32) -> Result<Self, crate::error::TableError> {
        use crate::error::TableError;
        if !Self::SUPPORTED_WAYS.contains(&ways) {
            return Err(TableError::Ways(ways));
        }
        if slots == 0 {
            return Err(TableError::ZeroSlots);
        }
        let sets = slots.div_ceil(u64::from(ways));
        if sets
            .checked_mul(u64::from(ways) * Self::SLOT_BYTES)
            .is_none_or(|bytes| bytes > isize::MAX as u64)
        {
            return Err(TableError::TooLarge(slots));
        }
        Ok(Geometry { sets, ways })
    }

    /// The largest geometry whose in-process table fits in `bytes`.
    ///
    /// # Errors
    ///
    /// [`TableError`](crate::error::TableError) when not even one set fits, or `ways` is unsupported.
    pub fn with_memory(bytes: u64, ways: u32) -> Result<Self, crate::error::TableError> {
        use crate::error::TableError;
        if !Self::SUPPORTED_WAYS.contains(&ways) {
            return Err(TableError::Ways(ways));
        }
        let set_bytes = u64::from(ways) * Self::SLOT_BYTES;
        let sets = bytes / set_bytes;
        if sets == 0 {
            return Err(TableError::MemoryTooSmall {
                bytes,
                ways,
                minimum: set_bytes,
            });
        }
        Self::new(sets * u64::from(ways), ways)
    }

    /// Number of sets.
    pub const fn sets(&self) -> u64 {
        self.sets
    }

    /// Slots per set.
    pub const fn ways(&self) -> u32 {
        self.ways
    }

    /// Total slots (buckets).
    pub const fn slots(&self) -> u64 {
        self.sets * self.ways as u64
    }

    /// Bytes of the in-process table.
    pub const fn memory_bytes(&self) -> u64 {
        self.slots() * Self::SLOT_BYTES
    }

    /// The set `digest` belongs to.
    ///
    /// Multiply-shift on the high 64 bits maps uniformly onto any set count, not only powers
    /// of two, so a memory budget is used in full.
    #[inline]
    pub const fn set_of(&self, digest: Digest) -> u64 {
        ((digest.hi() as u128 * self.sets as u128) >> 64) as u64
    }
}

/// Where the de-duplication memory lives.
///
/// All operations act on one digest and, for `commit`, `erase` and `renew`, only if the
/// digest's set still holds that digest (and, for a shared store, this owner's claim): they
/// never remove another message's entry.
///
/// In-process tables never fail; a shared store returns [`StoreError`] and leaves the decision
/// (requeue, or process without de-duplication) to the caller, so nothing is lost.
pub trait Store: Send + Sync {
    /// Claims `digest`: [`Claim::New`] if it was not held (it is now held as in flight),
    /// otherwise what it is held as.
    fn claim(&self, digest: Digest) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Claims many digests, as [`claim`](Store::claim) each; a shared store pipelines them in
    /// few round trips.
    ///
    /// The answers are in the order of `digests`. A digest that appears twice gets `New` once
    /// and `InFlight` after that. Each digest has its own answer: where a burst's sets live on
    /// several servers, one server failing fails only the digests of that server, and the
    /// others are decided as usual.
    fn claim_many(
        &self,
        digests: &[Digest],
    ) -> impl Future<Output = Vec<Result<Claim, StoreError>>> + Send {
        async move {
            let mut claims = Vec::with_capacity(digests.len());
            for &digest in digests {
                claims.push(self.claim(digest).await);
            }
            claims
        }
    }

    /// Claims many digests as [`claim_many`](Store::claim_many) does, and records each
    /// [`Claim::New`] one as done at once, as if committed: for a handler whose accepted
    /// message is final (see `Handler::accepts_for_good`), where a lease would protect
    /// nothing. The answers are `claim_many`'s, in the order of
    /// `digests`; a digest that appears twice gets `New` once and `Duplicate` after that (it
    /// is done already). A claimed-done digest is still `erase`d by its claimer, as a
    /// committed one is.
    ///
    /// Defaults to: [`claim_many`](Store::claim_many), then
    /// [`commit_many`](Store::commit_many) of the new ones. A store overrides it to write
    /// each new entry done in the claim's own write, one command instead of two; where the
    /// default's commit fails, the claim stays in flight until its lease ends, as a failed
    /// commit would leave it, and the answer is still `New`.
    fn claim_done_many(
        &self,
        digests: &[Digest],
    ) -> impl Future<Output = Vec<Result<Claim, StoreError>>> + Send {
        async move {
            let mut claims = self.claim_many(digests).await;
            let new: Vec<Digest> = digests
                .iter()
                .zip(&claims)
                .filter(|(_, claim)| matches!(claim, Ok(Claim::New)))
                .map(|(digest, _)| *digest)
                .collect();
            if new.is_empty() {
                return claims;
            }
            let commits = self.commit_many(&new).await;
            let done: std::collections::HashSet<Digest> = new
                .iter()
                .zip(commits)
                .filter(|(_, commit)| commit == &Ok(true))
                .map(|(digest, _)| *digest)
                .collect();
            // A repeat within the burst was answered `InFlight` by its claim: it is done now.
            for (digest, claim) in digests.iter().zip(&mut claims) {
                if claim == &Ok(Claim::InFlight) && done.contains(digest) {
                    *claim = Ok(Claim::Duplicate);
                }
            }
            claims
        }
    }

    /// Marks an in-flight digest as processed. Returns whether the set still held it.
    fn commit(&self, digest: Digest) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Commits many digests, as [`commit`](Store::commit) each; a shared store pipelines them
    /// in few round trips. The answers are in the order of `digests`.
    fn commit_many(
        &self,
        digests: &[Digest],
    ) -> impl Future<Output = Vec<Result<bool, StoreError>>> + Send {
        async move {
            let mut answers = Vec::with_capacity(digests.len());
            for &digest in digests {
                answers.push(self.commit(digest).await);
            }
            answers
        }
    }

    /// Erases many digests, as [`erase`](Store::erase) each; a shared store pipelines them in
    /// few round trips. The answers are in the order of `digests`.
    fn erase_many(
        &self,
        digests: &[Digest],
    ) -> impl Future<Output = Vec<Result<bool, StoreError>>> + Send {
        async move {
            let mut answers = Vec::with_capacity(digests.len());
            for &digest in digests {
                answers.push(self.erase(digest).await);
            }
            answers
        }
    }

    /// Forgets `digest` so that a retry of the same content is not taken for a duplicate.
    /// Returns whether the set still held it; another digest's entry is never touched.
    fn erase(&self, digest: Digest) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extends the lease of an in-flight claim while a long handler is still working.
    /// Returns whether the claim was still held. Stores without leases answer `true` if the
    /// digest is still held.
    fn renew(&self, digest: Digest) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The table's shape, or `None` for a store that keeps nothing.
    fn geometry(&self) -> Option<Geometry>;
}

/// A store that keeps nothing: every claim is [`Claim::New`].
///
/// The baseline for benchmarks, and the `none` store of the sidecar (de-duplication off).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStore;

impl Store for NoStore {
    async fn claim(&self, _digest: Digest) -> Result<Claim, StoreError> {
        Ok(Claim::New)
    }

    async fn commit(&self, _digest: Digest) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn erase(&self, _digest: Digest) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn renew(&self, _digest: Digest) -> Result<bool, StoreError> {
        Ok(true)
    }

    fn geometry(&self) -> Option<Geometry> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-process table with only the methods a store must write: the defaults do the
    /// rest.
    struct Plain(crate::Table);

    impl Store for Plain {
        async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
            Ok(self.0.claim(digest))
        }

        async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
            Ok(self.0.commit(digest))
        }

        async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
            Ok(self.0.erase(digest))
        }

        async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
            Ok(self.0.contains(digest))
        }

        fn geometry(&self) -> Option<Geometry> {
            Some(self.0.geometry())
        }
    }

    #[tokio::test]
    async fn the_default_claim_done_answers_as_the_tables_own() {
        let plain = Plain(crate::Table::with_slots(64, 4).unwrap());
        let own = crate::Table::with_slots(64, 4).unwrap();
        let [w, x, y] =
            [1u64, 2, 3].map(|n| Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes())));
        // In both: x in flight, w done; then a burst claimed done: y new, its repeat done
        // already, x still in flight.
        assert_eq!(own.claim(x), Claim::New);
        assert_eq!(own.claim(w), Claim::New);
        assert!(own.commit(w));
        assert_eq!(plain.claim(x).await, Ok(Claim::New));
        assert_eq!(plain.claim(w).await, Ok(Claim::New));
        assert_eq!(plain.commit(w).await, Ok(true));
        let burst = [x, y, y, w];
        let expected = vec![
            Ok(Claim::InFlight),
            Ok(Claim::New),
            Ok(Claim::Duplicate),
            Ok(Claim::Duplicate),
        ];
        assert_eq!(Store::claim_done_many(&own, &burst).await, expected);
        assert_eq!(plain.claim_done_many(&burst).await, expected);
        assert_eq!(plain.claim(y).await, Ok(Claim::Duplicate), "y is done");
        assert_eq!(plain.claim(x).await, Ok(Claim::InFlight), "x is not");
    }
}
