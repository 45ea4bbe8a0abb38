//! The near-table: an in-process table of the digests this process committed, consulted
//! before the shared table (Memcached). On by default, sized by
//! [`NearTable::default_geometry`]; `store.near_table = "off"` turns it off.
//!
//! A claim whose digest is there is a copy of a message this process delivered itself, so it
//! answers `Duplicate` without a round trip; that is safe because only committed digests are
//! ever put there (never in-flight ones, which another consumer may still erase), and the
//! digests claimed done at once for a handler whose accepted message is final, which are
//! forgotten here when they are erased (that handler failed one all the same). It also
//! keeps catching those copies while Memcached is unreachable. Everything else goes to
//! Memcached as before.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::dedup::table::Table;
use crate::dedup::{Digest, Geometry};
use crate::error::TableError;

/// Digests this process committed, with counts of what it answered.
#[derive(Debug)]
pub struct NearTable {
    table: Table,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// What a near-table answered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NearStats {
    /// Claims answered `Duplicate` locally.
    pub hits: u64,
    /// Claims that went on to the shared table.
    pub misses: u64,
}

impl NearTable {
    /// Slots of the smallest near-table a default gives: 1 MiB.
    pub const MIN_DEFAULT_SLOTS: u64 = 1 << 17;
    /// Slots of the largest near-table a default gives: 64 MiB.
    pub const MAX_DEFAULT_SLOTS: u64 = 1 << 23;

    /// The near-table's shape when none is configured: a quarter of the shared table's slots,
    /// between [`MIN_DEFAULT_SLOTS`](Self::MIN_DEFAULT_SLOTS) and
    /// [`MAX_DEFAULT_SLOTS`](Self::MAX_DEFAULT_SLOTS), in sets of 8.
    ///
    /// It holds only this process's commits, so with four or more consumers sharing the table
    /// (each committing a quarter of the digests or less) it remembers as far back as the
    /// shared table does; alone or with fewer, a quarter of that or more. For the default
    /// shared table (8,388,608 slots) that is 16 MiB, the size that caught every copy across a
    /// Memcached restart in the measurement behind it.
    pub fn default_geometry(shared: Geometry) -> Geometry {
        let slots = (shared.slots() / 4).clamp(Self::MIN_DEFAULT_SLOTS, Self::MAX_DEFAULT_SLOTS);
        Geometry::new(slots, 8).expect("between 1 MiB and 64 MiB, in sets of 8")
    }

    /// A near-table of this shape.
    ///
    /// # Errors
    ///
    /// The table's memory cannot be had.
    /// With `max_age`, its entries expire as the shared table's do.
    pub fn new(
        geometry: Geometry,
        max_age: Option<(
            std::time::Duration,
            std::sync::Arc<dyn crate::dedup::clock::Clock>,
        )>,
    ) -> Result<Self, TableError> {
        Ok(NearTable {
            table: match max_age {
                None => Table::new(geometry)?,
                Some((age, clock)) => Table::with_max_age(geometry, age, clock)?,
            },
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Whether this process committed `digest` (and the near-table still remembers it).
    pub fn committed(&self, digest: Digest) -> bool {
        let hit = self.table.contains(digest);
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Remembers that this process delivered the message of `digest`.
    pub fn remember(&self, digest: Digest) {
        self.table.contains_and_add(digest);
    }

    /// Forgets `digest`, erased from the shared table: its message is to be handled again,
    /// so its next claim must reach the shared table.
    pub fn forget(&self, digest: Digest) {
        self.table.erase(digest);
    }

    /// The counts so far.
    pub fn stats(&self) -> NearStats {
        NearStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// The near-table's shape.
    pub fn geometry(&self) -> Geometry {
        self.table.geometry()
    }
}
