//! The in-process table: a fixed array of 64-bit slots, grouped in sets of one cache line.
//! A resize starts a new array and keeps the previous one read-only behind it until it
//! retires (see `generations`).
//!
//! # Slot format
//!
//! Each slot is one `AtomicU64`:
//!
//! ```text
//!  63                                        6 5        3   2    1 0
//! +-------------------------------------------+----------+------+-----+
//! |  fingerprint (58 bits of the digest)      |  cursor  | lock | state|
//! +-------------------------------------------+----------+------+-----+
//! ```
//!
//! - `state`: `00` empty, `01` in flight, `11` done. Bit 0 says the slot holds an entry, so
//!   matching a digest is one mask and one compare.
//! - `lock` and `cursor`: only meaningful in the first slot of a set. `lock` is the set's writer
//!   guard; `cursor` is the slot the next eviction replaces.
//! - `fingerprint`: the top 58 bits of the digest's low half. The set index comes from the high
//!   half, so a stored entry matches another digest only if both share the set *and* those 58
//!   bits.
//!
//! # Replacement
//!
//! A new digest goes to the first empty slot of its set; in a full set it replaces the slot at
//! the cursor, and the cursor moves on by one. Slots fill in order and are replaced in the same
//! order, so the oldest entry goes first (FIFO), and a duplicate hit changes nothing. After an
//! `erase`, the slot it empties is refilled first and keeps its place in the rotation, so that
//! entry is replaced somewhat earlier than strict FIFO would; erasures happen only when a
//! handler fails.
//!
//! # False "seen"
//!
//! A digest that was never inserted is reported as seen only if one of the `ways` entries of
//! its set carries the same 58-bit fingerprint: at most `ways / 2^58` per lookup, about 2.8e-17
//! with 8 ways (3.5e-18 with 1). At a million messages a second for a year (3.2e13 lookups)
//! that is 0.0009 expected false drops with 8 ways.
//!
//! # Concurrency
//!
//! Lookups are lock-free: a claim first loads its set and returns at once if the digest is
//! there (the common case for duplicates). Inserting needs more care: with several ways, two
//! threads claiming the same new digest could pick different victim slots and both report
//! [`Claim::New`]. So an insert into a set of more than one way takes the set's guard (the
//! `lock` bit of its first slot) with one compare-and-swap, checks that the set is as it was
//! when it decided (else it looks again), writes, and releases the guard with a plain store.
//! That release cannot overwrite anyone: while the bit is set only the holder writes the first
//! slot, because `commit` and `erase` wait for the bit to clear. `commit` and `erase` are
//! single compare-and-swaps that act only if the slot still holds their digest; an insert that
//! evicts that slot meanwhile simply wins. With `ways = 1` there is no guard at all: the
//! compare-and-swap on the single slot is the only write, exactly the published algorithm.
//!
//! Each operation is specialised for its associativity (`W` = 1, 2, 4 or 8), so the loops over a
//! set unroll, and nothing branches on slot contents: which slot is oldest is random, and a
//! mispredicted branch taken once the set's cache line arrives would throw away the loads the
//! processor had already started for the next operations.
//!
//! On x86-64 the 8-way insert reads and compares the whole line in SSE2 registers: the same
//! decisions in about a third fewer instructions, which lets more claims wait for memory at
//! once (see `line`).

mod generations;
mod memory;
mod set;
mod timed;

/// The 8-way insert on x86-64, on whole cache lines with SSE2.
#[cfg(target_arch = "x86_64")]
mod line;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use generations::Resizing;
pub(crate) use generations::{ResizeState, MAX_PREVIOUS};
use memory::{advise_huge_pages, release_pages, zeroed_slots};
pub(crate) use memory::{check_fits, machine_memory_bytes};
use set::{find, fingerprint, insert, update, verdict};

use crate::dedup::clock::Clock;
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::{StoreError, TableError};

const STATE_MASK: u64 = 0b11;
/// Bit 0 of the state: the slot holds an entry.
const LIVE: u64 = 0b01;
const IN_FLIGHT: u64 = 0b01;
const DONE: u64 = 0b11;
const LOCK: u64 = 1 << 2;
const CURSOR_SHIFT: u32 = 3;
const CURSOR_MASK: u64 = 0b111 << CURSOR_SHIFT;
const FINGERPRINT_SHIFT: u32 = 6;

/// Slots on one cache line: sets of up to this many ways never straddle two lines.
const LINE_SLOTS: usize = 8;

/// A lock-free, set-associative table of recently seen digests.
///
/// Memory is allocated once, zeroed lazily by the operating system, and never grows:
/// `slots * 8` bytes. [`Table::resize`] makes a new table of another size that keeps this
/// one, read-only, as its previous generation for a while. See the docs of
/// `src/dedup/table/mod.rs` for the slot format and the odds of a false "seen".
///
/// # Example
///
/// ```
/// use nsq_dedupe::{Claim, Digest, DigestAlgorithm, Table};
///
/// let table = Table::with_slots(1 << 16, 8)?;
/// let digest = DigestAlgorithm::default().digest(b"payload");
/// assert!(!table.contains_and_add(digest)); // first sight
/// assert!(table.contains_and_add(digest)); // a copy
///
/// // Two-phase, for consumers that must not lose messages:
/// let other = DigestAlgorithm::default().digest(b"other payload");
/// assert_eq!(table.claim(other), Claim::New);
/// assert_eq!(table.claim(other), Claim::InFlight);
/// assert!(table.erase(other)); // the handler failed: forget it so the retry is not a duplicate
/// assert_eq!(table.claim(other), Claim::New);
/// assert!(table.commit(other));
/// assert_eq!(table.claim(other), Claim::Duplicate);
/// # Ok::<(), nsq_dedupe::error::TableError>(())
/// ```
pub struct Table {
    /// The slots, with up to `LINE_SLOTS - 1` spare ones in front so that `base` can start on
    /// a cache line.
    slots: Box<[AtomicU64]>,
    /// Index of the first slot of set 0; `slots[base]` is 64-byte aligned.
    base: usize,
    geometry: Geometry,
    /// A time per slot when entries expire (`max_age`); see `timed`.
    timed: Option<timed::Times>,
    /// The previous generations after a resize, read-only until they retire; see
    /// `generations`. `None` for a table that was never resized.
    older: Option<Box<generations::Older>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

/// Calls `$table.$op::<W>(args...)` with `W` the table's ways.
macro_rules! on_ways {
    ($table:expr, $op:ident($($arg:expr),*)) => {
        match $table.geometry.ways() {
            1 => $table.$op::<1>($($arg),*),
            2 => $table.$op::<2>($($arg),*),
            4 => $table.$op::<4>($($arg),*),
            _ => $table.$op::<8>($($arg),*),
        }
    };
}

/// Calls `$op::<W>(set, args...)` with `W` the table's ways, so that each associativity gets
/// its own unrolled code; the match is one predictable branch per call.
macro_rules! on_set {
    ($table:expr, $digest:expr, $op:ident($($arg:expr),*)) => {
        match $table.geometry.ways() {
            1 => $op::<1>($table.set::<1>($digest), $($arg),*),
            2 => $op::<2>($table.set::<2>($digest), $($arg),*),
            4 => $op::<4>($table.set::<4>($digest), $($arg),*),
            // `Geometry` admits only 1, 2, 4 and 8.
            _ => $op::<8>($table.set::<8>($digest), $($arg),*),
        }
    };
}

impl Table {
    /// A table of the given shape.
    ///
    /// # Errors
    ///
    /// [`TableError::Alloc`] when the table is larger than the machine's memory or the system
    /// will not give it; [`Geometry::new`] has already checked that the size fits the address
    /// space.
    pub fn new(geometry: Geometry) -> Result<Self, TableError> {
        let len = usize::try_from(geometry.slots())
            .expect("Geometry::new bounds the table by isize::MAX bytes")
            + (LINE_SLOTS - 1);
        check_fits(geometry, false)?;
        let slots = zeroed_slots(len).ok_or_else(|| TableError::Alloc {
            bytes: geometry.memory_bytes(),
            timed: false,
            machine_bytes: machine_memory_bytes(),
        })?;
        let base = slots.as_ptr().align_offset(LINE_SLOTS * 8);
        assert!(
            base < LINE_SLOTS,
            "an 8-byte-aligned pointer is 64-byte aligned within 7 slots"
        );
        advise_huge_pages(&slots);
        Ok(Table {
            slots,
            base,
            geometry,
            timed: None,
            older: None,
        })
    }

    /// A table whose done entries count as not seen once older than `max_age` by `clock`
    /// (whole seconds, at least one), at 8 more bytes per slot. See `timed`.
    ///
    /// # Errors
    ///
    /// As [`Table::new`], for twice the memory.
    pub fn with_max_age(
        geometry: Geometry,
        max_age: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TableError> {
        check_fits(geometry, true)?;
        let mut table = Table::new(geometry)?;
        let max_age_s = max_age.as_secs().max(1);
        table.timed = Some(timed::Times::new(table.slots.len(), max_age_s, clock)?);
        Ok(table)
    }

    /// `max_age` in whole seconds, when entries expire.
    pub fn max_age(&self) -> Option<Duration> {
        self.timed
            .as_ref()
            .map(|t| Duration::from_secs(t.max_age_s()))
    }

    /// A table of at least `slots` slots (rounded up to whole sets) in sets of `ways`.
    ///
    /// # Errors
    ///
    /// [`TableError`] when `slots` is 0, `ways` is not 1, 2, 4 or 8, the table is too large for
    /// the address space, or the system will not give the memory.
    pub fn with_slots(slots: u64, ways: u32) -> Result<Self, TableError> {
        Table::new(Geometry::new(slots, ways)?)
    }

    /// The largest table of `ways`-way sets that fits in `bytes`.
    ///
    /// # Errors
    ///
    /// [`TableError`] when not even one set fits, `ways` is unsupported, or the system will
    /// not give the memory.
    pub fn with_memory(bytes: u64, ways: u32) -> Result<Self, TableError> {
        Table::new(Geometry::with_memory(bytes, ways)?)
    }

    /// Touches every page of the table now, so that the operating system's first-touch page
    /// faults (zeroing up to the whole table) do not land on the first messages.
    ///
    /// The table's memory is mapped lazily; a service that wants even latency from its first
    /// message calls this at start-up, and benchmarks call it so that they measure lookups,
    /// not page faults. Safe to call at any time: it changes no slot.
    pub fn prefault(&self) {
        // One slot per 4 KiB page. A compare-and-swap of the slot's value with itself writes
        // (so the page gets memory of its own, not the shared zero page) without changing
        // anything, even while other threads use the table: if the slot changed meanwhile, the
        // swap fails and the other writer has touched the page. (An idempotent `fetch_or(0)`
        // would not do: the compiler may drop it, and did.)
        for slot in self.slots.iter().step_by(4096 / 8) {
            let value = slot.load(Ordering::Relaxed);
            let _ = slot.compare_exchange(value, value, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Gives the slots' (and times') memory back to the system, for a generation that
    /// retired: it then holds nothing. See `memory::release_pages`.
    fn release_memory(&self) {
        release_pages(&self.slots);
        if let Some(times) = &self.timed {
            times.release_memory();
        }
    }

    /// The table's shape.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Total slots (buckets).
    pub fn slots(&self) -> u64 {
        self.geometry.slots()
    }

    /// Bytes of slot memory.
    pub fn memory_bytes(&self) -> u64 {
        self.geometry.memory_bytes()
    }

    /// How many slots hold an entry. Scans the whole table: meant for stats, not the hot path.
    pub fn occupied(&self) -> u64 {
        self.slots[self.base..][..self.geometry.slots() as usize]
            .iter()
            .filter(|slot| slot.load(Ordering::Relaxed) & LIVE != 0)
            .count() as u64
    }

    /// The fraction of slots that hold an entry (see [`Table::occupied`]).
    pub fn occupancy(&self) -> f64 {
        self.occupied() as f64 / self.geometry.slots() as f64
    }

    /// The slots' values, in order, each read atomically: a snapshot for the table file.
    /// Entries may change while it is taken; each value is one some slot held.
    pub(crate) fn snapshot_words(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots[self.base..][..self.geometry.slots() as usize]
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
    }

    /// Puts a slot value of a table file into slot `index` of this (new, unused) table: a done
    /// entry as it is, an in-flight one released (its claimer is gone), no set's guard held.
    pub(crate) fn restore_slot(&self, index: usize, word: u64) -> Restored {
        let (value, restored) = match word & STATE_MASK {
            DONE => (word & !LOCK, Restored::Done),
            IN_FLIGHT => (word & CURSOR_MASK, Restored::Released),
            // `10` is no state this layout writes; such a slot is dropped as empty.
            _ => (word & CURSOR_MASK, Restored::Empty),
        };
        self.slots[self.base + index].store(value, Ordering::Relaxed);
        restored
    }

    /// One-step check-and-set: `true` if `digest` was held (seen before, or in flight),
    /// otherwise it is inserted as done and the answer is `false`.
    #[inline]
    pub fn contains_and_add(&self, digest: Digest) -> bool {
        self.claim_done(digest) != Claim::New
    }

    /// A claim that holds a [`Claim::New`] digest as done at once, as a claim then a
    /// [`commit`](Table::commit) would, in one write: for a handler whose accepted message is
    /// final. Other digests answer as [`claim`](Table::claim) answers them.
    #[inline]
    pub fn claim_done(&self, digest: Digest) -> Claim {
        if let Some(older) = &self.older {
            return self.claim_resizing(older, digest, DONE);
        }
        self.claim_here(digest, DONE)
    }

    /// Two-phase check: see [`Claim`]. A [`Claim::New`] digest is held as in flight until
    /// [`commit`](Table::commit) or [`erase`](Table::erase).
    #[inline]
    pub fn claim(&self, digest: Digest) -> Claim {
        if let Some(older) = &self.older {
            return self.claim_resizing(older, digest, IN_FLIGHT);
        }
        self.claim_here(digest, IN_FLIGHT)
    }

    /// A claim (`state` in flight or done) in the current generation alone.
    #[inline]
    fn claim_here(&self, digest: Digest, state: u64) -> Claim {
        if let Some(times) = &self.timed {
            return self.insert_timed_any(times, digest, state);
        }
        on_set!(self, digest, insert(fingerprint(digest), state))
    }

    /// How this generation alone answers a claim of `digest` that it holds, changing nothing.
    fn lookup(&self, digest: Digest) -> Option<Claim> {
        if let Some(times) = &self.timed {
            return on_ways!(self, lookup_timed(times, digest));
        }
        on_set!(self, digest, find(fingerprint(digest))).map(verdict)
    }

    /// Claims every digest of `digests` in order, appending the answers to `claims`: the same
    /// answers as calling [`claim`](Table::claim) on each, faster on large tables.
    ///
    /// A single claim waits for its set's cache line to arrive from memory before the next can
    /// start; here the sets of the next few digests are requested while one is being decided,
    /// so their waits overlap.
    pub fn claim_many_into(&self, digests: &[Digest], claims: &mut Vec<Claim>) {
        self.many_into(digests, claims, Table::claim);
    }

    /// [`claim_done`](Table::claim_done) on every digest of `digests` in order, appending the
    /// answers to `claims`, with the sets of the next digests requested while one is decided
    /// (as [`claim_many_into`](Table::claim_many_into)).
    pub fn claim_done_many_into(&self, digests: &[Digest], claims: &mut Vec<Claim>) {
        self.many_into(digests, claims, Table::claim_done);
    }

    /// [`contains_and_add`](Table::contains_and_add) on every digest of `digests` in order,
    /// appending the answers to `seen`, with the sets of the next digests requested while one
    /// is decided (as [`claim_many_into`](Table::claim_many_into)).
    pub fn contains_and_add_many_into(&self, digests: &[Digest], seen: &mut Vec<bool>) {
        self.many_into(digests, seen, Table::contains_and_add);
    }

    /// [`commit`](Table::commit) on every digest of `digests` in order, appending to `held`
    /// whether each set still held its digest, with the sets of the next digests requested
    /// while one is committed (as [`claim_many_into`](Table::claim_many_into)): a part's
    /// commits come a handler's answer after their claims, when a consumer holding thousands
    /// of messages has long pushed their sets out of cache.
    pub fn commit_many_into(&self, digests: &[Digest], held: &mut Vec<bool>) {
        self.many_into(digests, held, Table::commit);
    }

    /// [`erase`](Table::erase) on every digest of `digests` in order, appending to `held`
    /// whether each set still held its digest, with the sets of the next digests requested
    /// while one is erased (as [`commit_many_into`](Table::commit_many_into)).
    pub fn erase_many_into(&self, digests: &[Digest], held: &mut Vec<bool>) {
        self.many_into(digests, held, Table::erase);
    }

    /// Appends `one`'s answer for each digest of `digests` to `answers`, in order, with the
    /// sets of the next digests requested while one is decided.
    #[inline]
    fn many_into<T>(
        &self,
        digests: &[Digest],
        answers: &mut Vec<T>,
        one: impl Fn(&Self, Digest) -> T,
    ) {
        answers.reserve(digests.len());
        self.prefetched(digests, |digest| answers.push(one(self, digest)));
    }

    /// Calls `decide` on each digest in order, having asked for the sets of the next few.
    #[inline]
    fn prefetched(&self, digests: &[Digest], mut decide: impl FnMut(Digest)) {
        const AHEAD: usize = 8;
        for digest in digests.iter().take(AHEAD) {
            self.prefetch(*digest);
        }
        for (i, digest) in digests.iter().enumerate() {
            if let Some(next) = digests.get(i + AHEAD) {
                self.prefetch(*next);
            }
            decide(*digest);
        }
    }

    /// Asks the processor to start loading `digest`'s set into cache.
    #[inline(always)]
    fn prefetch(&self, digest: Digest) {
        let first =
            self.base + self.geometry.set_of(digest) as usize * self.geometry.ways() as usize;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it never faults, reads nothing into the program's
        // state and writes nothing, so it cannot break any invariant; the pointer is in bounds
        // of `slots` anyway, because `set_of` is below `sets`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(self.slots.as_ptr().add(first).cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = first;
    }

    /// Marks `digest` as processed. Returns whether its set still held it (in flight or done).
    ///
    /// During a resize, an entry claimed before it is committed in the previous generation
    /// that holds it.
    pub fn commit(&self, digest: Digest) -> bool {
        let held = if let Some(times) = &self.timed {
            on_ways!(self, commit_timed(times, digest))
        } else {
            let done = |word| (word & !STATE_MASK) | DONE;
            on_set!(self, digest, update(fingerprint(digest), done))
        };
        held || (self.older.is_some() && self.commit_previous(digest))
    }

    /// Empties the slot that holds `digest`. Returns whether its set still held it; another
    /// digest's entry is never touched.
    ///
    /// During a resize, where the current generation does not hold `digest`, its entry in the
    /// previous generation that holds it is emptied.
    pub fn erase(&self, digest: Digest) -> bool {
        // Keep the set's cursor, which lives in its first slot.
        let empty = |word| word & CURSOR_MASK;
        let held = on_set!(self, digest, update(fingerprint(digest), empty));
        held || (self.older.is_some() && self.erase_previous(digest))
    }

    /// Whether the set holds `digest` (in flight or done), without changing anything; during
    /// a resize, in any generation.
    pub fn contains(&self, digest: Digest) -> bool {
        let here = if let Some(times) = &self.timed {
            on_ways!(self, contains_timed(times, digest))
        } else {
            on_set!(self, digest, find(fingerprint(digest))).is_some()
        };
        here || (self.older.is_some() && self.contains_previous(digest))
    }

    /// The `W` slots of `digest`'s set, as an array so that loops over them unroll.
    #[inline(always)]
    fn set<const W: usize>(&self, digest: Digest) -> &[AtomicU64; W] {
        // `set_of` is below `sets`, so the set lies inside the table; `base` is on a cache line
        // and W divides 8, so a set never crosses a line.
        let first = self.base + self.geometry.set_of(digest) as usize * W;
        self.slots[first..first + W]
            .try_into()
            .expect("a range of W slots is an array of W slots")
    }
}

impl Store for Table {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        Ok(Table::claim(self, digest))
    }

    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let mut claims = Vec::with_capacity(digests.len());
        self.claim_many_into(digests, &mut claims);
        claims.into_iter().map(Ok).collect()
    }

    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let mut claims = Vec::with_capacity(digests.len());
        self.claim_done_many_into(digests, &mut claims);
        claims.into_iter().map(Ok).collect()
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(Table::commit(self, digest))
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(Table::erase(self, digest))
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(self.contains(digest))
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.geometry)
    }
}

/// What restoring one slot of a table file did (see [`Table::restore_slot`]).
pub(crate) enum Restored {
    /// The slot was empty.
    Empty,
    /// A done entry, restored as it was.
    Done,
    /// An in-flight entry, released: its claimer is gone.
    Released,
}

#[cfg(test)]
mod tests;
