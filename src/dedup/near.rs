//! The near-table: an in-process table of the digests this process committed, consulted
//! before the shared Memcached table.
//!
//! A claim whose digest is there is a copy of a message this process delivered itself, so it
//! answers `Duplicate` without a round trip; that is safe because only committed digests are
//! ever put there (never in-flight ones, which another consumer may still erase). It also
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
