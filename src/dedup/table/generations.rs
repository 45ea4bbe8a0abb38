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
//! previous generation, overlapped with the wait for the current generation's set; after a
//! single resize, which is the usual case, that is one extra look-up. The list of previous
//! generations never changes while the table lives, so reading it takes no lock; new entries
//! are counted in a shared counter, in a large table only one claim in 64 (by the digest's
//! bits) writes it.
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
//! lost; a copy of a message in flight for that long may pass. Retiring gives the slots' memory
//! back to the system at once (the claim that crossed the line does it); the allocations
//! themselves go with the table, or at its next resize.
//!
//! A shared store can follow the same scheme: its previous geometry read as the previous
//! generation, with the claims' extra look-up and the retirement rule above.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Table;
use crate::dedup::{Claim, Digest, Geometry};

/// Previous generations a table keeps at most: a resize while this many are held drops the
/// oldest. (Each resize within one turnover adds one; a table file's header lists them.)
pub(crate) const MAX_PREVIOUS: usize = 32;

/// The previous generations of a resized table.
pub(super) struct Older {
    /// The previous generations, newest first. The list never changes while the table lives,
    /// so claims read it without a lock; retiring releases the slots' memory (see
    /// [`Table::release_memory`]) and the allocations go with the table.
    tables: Vec<Table>,
    /// Whether `tables` still count: false once they retired.
    live: AtomicBool,
    /// New entries the current generation has taken since the resize, counted in steps of
    /// `step`.
    inserts: AtomicU64,
    /// 1 for small tables; for large ones a new entry is counted, as `SAMPLE` entries, only
    /// when its digest's low bits (which the slots do not keep) are zero: one shared write
    /// per `SAMPLE` new claims instead of one per claim, an unbiased estimate of the count.
    step: u64,
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

/// New entries counted together in a large table (see [`Older::step`]).
const SAMPLE: u64 = 64;

impl Older {
    fn new(tables: Vec<Table>, turnover: u64, state: ResizeState) -> Older {
        Older {
            live: AtomicBool::new(!tables.is_empty()),
            tables,
            inserts: AtomicU64::new(state.inserts),
            // Sampled only where the count is large enough for the estimate to be close.
            step: if turnover >= SAMPLE * SAMPLE {
                SAMPLE
            } else {
                1
            },
            turnover,
            resized_at_s: state.resized_at_s,
        }
    }

    /// The previous generations, while they count.
    #[inline]
    fn live(&self) -> &[Table] {
        // Relaxed: `live` only goes from true to false, and a generation read just after it
        // retired answers as it did just before (or finds its slots empty): either is an
        // answer the table could have given a moment earlier.
        if self.live.load(Ordering::Relaxed) {
            &self.tables
        } else {
            &[]
        }
    }

    /// How the first previous generation holding `digest` answers a claim of it, if one does.
    #[inline]
    fn held(&self, digest: Digest) -> Option<Claim> {
        self.live().iter().find_map(|table| table.lookup(digest))
    }

    /// Applies `op` to the previous generations, newest first, until one answers `true`.
    fn any(&self, op: impl Fn(&Table) -> bool) -> bool {
        self.live().iter().any(op)
    }

    /// Counts a new entry of the current generation, `digest`, and retires the previous
    /// generations when it turns the current one over, or when `max_age` has passed since
    /// the resize.
    #[inline]
    fn inserted(&self, digest: Digest, now_s: Option<u64>, max_age_s: Option<u64>) {
        let expired = match (now_s, max_age_s) {
            (Some(now_s), Some(age)) => now_s >= self.resized_at_s.saturating_add(age),
            _ => false,
        };
        if self.step > 1 && !digest.lo().is_multiple_of(self.step) && !expired {
            return;
        }
        // Relaxed: the count only decides when to release memory, never an answer.
        let inserts = self.inserts.fetch_add(self.step, Ordering::Relaxed) + self.step;
        if inserts >= self.turnover || expired {
            self.retire();
        }
    }

    /// Retires the previous generations: they no longer answer, and their slots' memory goes
    /// back to the system.
    fn retire(&self) {
        if self.live.swap(false, Ordering::Relaxed) {
            for table in &self.tables {
                table.release_memory();
            }
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
    pub fn resize(mut self, geometry: Geometry) -> Result<Table, crate::error::TableError> {
        let current = self.next_generation(geometry)?;
        self.push_generation(current);
        Ok(self)
    }

    /// An empty table of `geometry` with this one's `max_age`: the next generation of a
    /// resize (see [`Table::push_generation`]).
    ///
    /// # Errors
    ///
    /// As [`Table::new`].
    pub(crate) fn next_generation(
        &self,
        geometry: Geometry,
    ) -> Result<Table, crate::error::TableError> {
        match &self.timed {
            None => Table::new(geometry),
            Some(times) => Table::with_max_age(
                geometry,
                std::time::Duration::from_secs(times.max_age_s()),
                times.clock(),
            ),
        }
    }

    /// Makes `current` (made by [`Table::next_generation`], never used) this table's current
    /// generation, and this table's generations its previous ones, read-only until they
    /// retire: [`Table::resize`] in place, for a table behind a lock.
    pub(crate) fn push_generation(&mut self, mut current: Table) {
        let resized_at_s = match &current.timed {
            Some(times) => times.now_s(),
            None => unix_now_s(),
        };
        std::mem::swap(self, &mut current);
        // `self` is the new generation now, and `current` the table that was.
        let mut tables = match current.older.take() {
            Some(older) if older.live.load(Ordering::Relaxed) => older.tables,
            // Retired ones are freed here.
            _ => Vec::new(),
        };
        tables.insert(0, current);
        tables.truncate(MAX_PREVIOUS);
        self.older = Some(Box::new(Older::new(
            tables,
            self.slots(),
            ResizeState {
                resized_at_s,
                inserts: 0,
            },
        )));
    }

    /// `current` with `previous` (newest first) behind it, as a table file kept them.
    pub(crate) fn with_previous(
        mut current: Table,
        previous: Vec<Table>,
        state: ResizeState,
    ) -> Table {
        if !previous.is_empty() {
            let turnover = current.slots();
            let older = Older::new(previous, turnover, state);
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
    pub(crate) fn previous_generations(&self) -> (&[Table], Option<ResizeState>) {
        match &self.older {
            Some(older) if !older.live().is_empty() => {
                let state = ResizeState {
                    resized_at_s: older.resized_at_s,
                    inserts: older.inserts.load(Ordering::Relaxed),
                };
                (older.live(), Some(state))
            }
            _ => (&[], None),
        }
    }

    /// Bytes the table's generations hold (their slots, and their times with `max_age`): the
    /// current one's, and the previous ones' until they retire.
    pub fn held_bytes(&self) -> u64 {
        let per_slot = Geometry::SLOT_BYTES * if self.timed.is_some() { 2 } else { 1 };
        let previous = self.older.as_ref().map_or(0, |older| {
            older.live().iter().map(|table| table.slots()).sum::<u64>()
        });
        (self.slots() + previous) * per_slot
    }

    /// Where a resize stands, while previous generations are held.
    pub fn resizing(&self) -> Option<Resizing> {
        let older = self.older.as_ref()?;
        let tables = older.live();
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
        // Ask for the current generation's set first, so that its wait overlaps the look-up
        // in the previous generation instead of following it.
        self.prefetch(digest);
        if let Some(held) = older.held(digest) {
            return held;
        }
        let claim = self.claim_here(digest, state);
        if claim == Claim::New {
            let now_s = self.timed.as_ref().map(|times| times.now_s());
            let max_age_s = self.timed.as_ref().map(|times| times.max_age_s());
            older.inserted(digest, now_s, max_age_s);
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
