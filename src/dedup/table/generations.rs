//! Generations of the in-process table: a resized table keeps its previous slots, read-only,
//! until nothing in them can still be inside the window, so that a resize forgets nothing.
//!
//! A table's size is fixed by its slot array, and a stored entry cannot be moved to a table of
//! another size: it keeps 58 bits of the digest's low half, while the set comes from the high
//! half, which is not stored. So a resize starts a new *generation* instead: a new, empty
//! array takes every new entry, and the previous arrays stay beside it, read-only, newest
//! first:
//!
//! - A claim first looks the digest up in the previous generations: held there (done, or in
//!   flight), it answers as that entry says, and writes nothing. Otherwise it claims in the
//!   current generation as a table of one generation does. Nothing ever inserts into a
//!   previous generation, so what the look-up found cannot change under the claim except by
//!   the entry's own commit or erase: "seen" is never wrong, and an entry in flight there
//!   still counts as in flight.
//! - `commit` and `erase` act on the current generation, and where it does not hold the
//!   digest, on the first previous one that does: a message claimed before the resize is
//!   committed (or erased, so that its retry passes) where its entry is, and only that entry.
//!
//! A claim during a resize therefore costs one more look-up (one set, one cache line) per
//! previous generation, a read lock of the list of them, and one counter increment when the
//! digest is new; after a single resize, which is the usual case, that is one extra look-up.
//!
//! # Retirement
//!
//! At most [`MAX_PREVIOUS`] previous generations are kept (each resize before the previous ones
//! retire adds one; a resize past that drops the oldest). They are dropped together, at the
//! first of:
//!
//! - the current generation has taken as many new entries since the resize as it has slots:
//!   it has turned over once. A table remembers about its size in entries (each set keeps its
//!   `ways` newest), so by then the entries a table of the new size would still hold were
//!   all claimed after the resize, and are in the current generation;
//! - with `max_age`, `max_age` has passed since the resize: every done entry of a previous
//!   generation was stamped before the resize, so it has expired.
//!
//! An entry still in flight in a previous generation when it retires is forgotten as an
//! evicted one is: its commit or erase answers `false`, and its redelivery passes. Nothing is
//! lost; a copy of a message in flight for that long may pass. Retiring frees the memory on
//! the thread whose claim crossed the line.
//!
//! A shared store can follow the same scheme: its previous geometry read as the previous
//! generation, with the claims' extra look-up and the retirement rule above.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Table;
use crate::dedup::{Claim, Digest};

/// Previous generations a table keeps at most: a resize while this many are held drops the
/// oldest. (Each resize within one turnover adds one; a table file's header lists them.)
pub(crate) const MAX_PREVIOUS: usize = 32;

/// The previous generations of a resized table.
pub(super) struct Older {
    /// The previous generations, newest first; emptied when they retire. Each is an `Arc` so
    /// that a snapshot can write them without holding the lock.
    tables: RwLock<Vec<Arc<Table>>>,
    /// Whether `tables` may still hold anything: claims check it before taking the lock.
    live: AtomicBool,
    /// New entries the current generation has taken since the resize.
    inserts: AtomicU64,
    /// Retire once `inserts` reaches this: the current generation's slots.
    turnover: u64,
    /// When the resize happened, in seconds since the Unix epoch.
    resized_at_s: u64,
}

/// Where a resize stands (see [`Table::resizing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resizing {
    /// Generations held, the current one included (2 after one resize).
    pub generations: usize,
    /// Slots of the previous generations together.
    pub previous_slots: u64,
    /// New entries the current generation takes before the previous ones retire.
    pub inserts_left: u64,
    /// With `max_age`, seconds before the previous generations retire.
    pub seconds_left: Option<u64>,
}

/// What a table file keeps of a resize, to carry it across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResizeState {
    /// When the resize happened, in seconds since the Unix epoch.
    pub(crate) resized_at_s: u64,
    /// New entries the current generation had taken since.
    pub(crate) inserts: u64,
}

impl std::fmt::Debug for Older {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Older")
            .field("live", &self.live)
            .field("inserts", &self.inserts)
            .field("turnover", &self.turnover)
            .finish_non_exhaustive()
    }
}

impl Older {
    fn new(tables: Vec<Arc<Table>>, turnover: u64, state: ResizeState) -> Older {
        Older {
            live: AtomicBool::new(!tables.is_empty()),
            tables: RwLock::new(tables),
            inserts: AtomicU64::new(state.inserts),
            turnover,
            resized_at_s: state.resized_at_s,
        }
    }

    fn tables(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Table>>> {
        // A panic while the lock was held left the list whole: it is only ever replaced.
        self.tables
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How the first previous generation holding `digest` answers a claim of it, if one does.
    #[inline]
    fn held(&self, digest: Digest) -> Option<Claim> {
        // Acquire pairs with nothing in particular: `live` only ever goes from true to false,
        // and a stale `true` just takes the lock and finds the list empty.
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.tables().iter().find_map(|table| table.lookup(digest))
    }

    /// Applies `op` to the previous generations, newest first, until one answers `true`.
    fn any(&self, op: impl Fn(&Table) -> bool) -> bool {
        if !self.live.load(Ordering::Acquire) {
            return false;
        }
        self.tables().iter().any(|table| op(table))
    }

    /// Counts a new entry of the current generation, and retires the previous generations
    /// when it turns the current one over, or when `max_age` has passed since the resize.
    fn inserted(&self, now_s: Option<u64>, max_age_s: Option<u64>) {
        // Relaxed: the count only decides when to free memory, never an answer.
        let inserts = self.inserts.fetch_add(1, Ordering::Relaxed) + 1;
        let expired = match (now_s, max_age_s) {
            (Some(now_s), Some(age)) => now_s >= self.resized_at_s.saturating_add(age),
            _ => false,
        };
        if inserts >= self.turnover || expired {
            self.retire();
        }
    }

    /// Drops the previous generations: their memory is freed once no snapshot holds them.
    fn retire(&self) {
        if self.live.swap(false, Ordering::AcqRel) {
            let tables = std::mem::take(
                &mut *self
                    .tables
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
            // Dropped here, after the lock: claims wait for no deallocation.
            drop(tables);
        }
    }
}

/// Seconds since the Unix epoch by the system clock.
fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

impl Table {
    /// This table resized to `geometry`: a new, empty current generation of that shape (with
    /// the same `max_age`), and this table's generations kept read-only behind it until they
    /// retire (see the docs of `src/dedup/table/generations.rs`).
    ///
    /// # Example
    ///
    /// ```
    /// use nsq_dedupe::{Claim, DigestAlgorithm, Geometry, Table};
    ///
    /// let table = Table::with_slots(1 << 12, 8)?;
    /// let seen = DigestAlgorithm::default().digest(b"seen before");
    /// let pending = DigestAlgorithm::default().digest(b"in flight");
    /// assert!(!table.contains_and_add(seen));
    /// assert_eq!(table.claim(pending), Claim::New);
    ///
    /// let table = table.resize(Geometry::new(1 << 14, 8)?)?;
    /// assert_eq!(table.slots(), 1 << 14);
    /// assert_eq!(table.claim(seen), Claim::Duplicate); // held by the previous generation
    /// assert_eq!(table.claim(pending), Claim::InFlight);
    /// assert!(table.commit(pending)); // where its entry is
    /// assert_eq!(table.claim(pending), Claim::Duplicate);
    /// # Ok::<(), nsq_dedupe::error::TableError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Table::new`] for the new generation; the memory of the previous ones stays in use
    /// until they retire.
    pub fn resize(
        mut self,
        geometry: crate::dedup::Geometry,
    ) -> Result<Table, crate::error::TableError> {
        let mut current = match &self.timed {
            None => Table::new(geometry)?,
            Some(times) => Table::with_max_age(
                geometry,
                std::time::Duration::from_secs(times.max_age_s()),
                times.clock(),
            )?,
        };
        let mut tables = match self.older.take() {
            Some(older) => {
                let live = older.live.load(Ordering::Acquire);
                let tables = std::mem::take(
                    &mut *older
                        .tables
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()),
                );
                if live {
                    tables
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        };
        tables.insert(0, Arc::new(self));
        tables.truncate(MAX_PREVIOUS);
        let resized_at_s = match &current.timed {
            Some(times) => times.now_s(),
            None => unix_now_s(),
        };
        current.older = Some(Box::new(Older::new(
            tables,
            current.slots(),
            ResizeState {
                resized_at_s,
                inserts: 0,
            },
        )));
        Ok(current)
    }

    /// `current` with `previous` (newest first) behind it, as a table file kept them.
    pub(crate) fn with_previous(
        mut current: Table,
        previous: Vec<Table>,
        state: ResizeState,
    ) -> Table {
        if !previous.is_empty() {
            let turnover = current.slots();
            let older = Older::new(
                previous.into_iter().map(Arc::new).collect(),
                turnover,
                state,
            );
            current.older = Some(Box::new(older));
            // A table file may have been saved just before the retirement was due.
            if state.inserts >= turnover {
                current.older.as_ref().expect("just set").retire();
            }
        }
        current
    }

    /// The previous generations still held, newest first, and where the resize stands: for
    /// the table file. Empty when the table has one generation.
    pub(crate) fn previous_generations(&self) -> (Vec<Arc<Table>>, Option<ResizeState>) {
        match &self.older {
            Some(older) if older.live.load(Ordering::Acquire) => {
                let tables = older.tables().clone();
                let state = ResizeState {
                    resized_at_s: older.resized_at_s,
                    inserts: older.inserts.load(Ordering::Relaxed),
                };
                let state = (!tables.is_empty()).then_some(state);
                (tables, state)
            }
            _ => (Vec::new(), None),
        }
    }

    /// Where a resize stands, while previous generations are held.
    pub fn resizing(&self) -> Option<Resizing> {
        let older = self.older.as_ref()?;
        if !older.live.load(Ordering::Acquire) {
            return None;
        }
        let tables = older.tables();
        if tables.is_empty() {
            return None;
        }
        let seconds_left = self.timed.as_ref().map(|times| {
            older
                .resized_at_s
                .saturating_add(times.max_age_s())
                .saturating_sub(times.now_s())
        });
        Some(Resizing {
            generations: 1 + tables.len(),
            previous_slots: tables.iter().map(|table| table.slots()).sum(),
            inserts_left: older
                .turnover
                .saturating_sub(older.inserts.load(Ordering::Relaxed)),
            seconds_left,
        })
    }

    /// A claim (`state` in flight or done) while previous generations are held.
    #[inline(never)]
    pub(super) fn claim_resizing(&self, older: &Older, digest: Digest, state: u64) -> Claim {
        if let Some(held) = older.held(digest) {
            return held;
        }
        let claim = self.claim_here(digest, state);
        if claim == Claim::New {
            let now_s = self.timed.as_ref().map(|times| times.now_s());
            let max_age_s = self.timed.as_ref().map(|times| times.max_age_s());
            older.inserted(now_s, max_age_s);
        }
        claim
    }

    /// `commit` in the previous generations, where the current one does not hold `digest`.
    #[cold]
    pub(super) fn commit_previous(&self, digest: Digest) -> bool {
        self.older
            .as_ref()
            .is_some_and(|older| older.any(|table| table.commit(digest)))
    }

    /// `erase` in the previous generations, where the current one does not hold `digest`.
    #[cold]
    pub(super) fn erase_previous(&self, digest: Digest) -> bool {
        self.older
            .as_ref()
            .is_some_and(|older| older.any(|table| table.erase(digest)))
    }

    /// Whether a previous generation holds `digest`.
    #[cold]
    pub(super) fn contains_previous(&self, digest: Digest) -> bool {
        self.older
            .as_ref()
            .is_some_and(|older| older.held(digest).is_some())
    }
}

#[cfg(test)]
mod tests;
