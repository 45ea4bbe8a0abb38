//! The in-process table: a fixed array of 64-bit slots, grouped in sets of one cache line.
//!
//! # Slot format
//!
//! Each slot is one `AtomicU64`:
//!
//! ```text
//!  63                                   11 10       3   2    1 0
//! +---------------------------------------+----------+------+-----+
//! |  fingerprint (53 bits of the digest)  | stamp(8) | lock | state|
//! +---------------------------------------+----------+------+-----+
//! ```
//!
//! - `state`: 0 empty, 1 in flight, 2 done. A word whose state is 0 holds nothing.
//! - `lock`: only meaningful in the first slot of a set; it is the set's writer guard.
//! - `stamp`: the set's insertion counter when the entry was written, so the oldest entry of a
//!   full set is the one replaced (FIFO). A duplicate hit does not change it.
//! - `fingerprint`: the top 53 bits of the digest's low half. The set index comes from the high
//!   half, so a stored entry matches another digest only if both share the set *and* those 53
//!   bits.
//!
//! # False "seen"
//!
//! A digest that was never inserted is reported as seen only if one of the `ways` entries of
//! its set carries the same 53-bit fingerprint: at most `ways / 2^53` per lookup,
//! about 8.9e-16 with 8 ways (1.1e-16 with 1). At a million messages a second for a year
//! (3.2e13 lookups) that is 0.028 expected false drops with 8 ways. Shorter fingerprints would
//! buy nothing: the slot already fits in 8 bytes.
//!
//! # Concurrency
//!
//! Lookups are lock-free: a claim first scans its set with plain atomic loads and returns at
//! once if the digest is there (the common case for duplicates). Inserting needs more care:
//! with several ways, two threads claiming the same new digest could pick different victim
//! slots and both report [`Claim::New`]. So inserts into a set of more than one way take the
//! set's guard (the `lock` bit of its first slot), scan again and write while holding it; the
//! critical section is a handful of loads and one store on one cache line, and with millions of
//! sets two writers rarely meet. `commit` and `erase` never take the guard: they change one
//! slot with compare-and-swap, only if it still holds their digest, and a concurrent insert
//! that evicts that slot simply wins. With `ways = 1` there is no guard at all: the
//! compare-and-swap on the single slot is the only write, exactly the published algorithm.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::{StoreError, TableError};

const STATE_MASK: u64 = 0b11;
const EMPTY: u64 = 0;
const IN_FLIGHT: u64 = 1;
const DONE: u64 = 2;
const LOCK: u64 = 1 << 2;
const STAMP_SHIFT: u32 = 3;
const FINGERPRINT_SHIFT: u32 = 11;

/// Slots on one cache line: sets of up to this many ways never straddle two lines.
const LINE_SLOTS: usize = 8;

/// A lock-free, set-associative table of recently seen digests.
///
/// Memory is allocated once, zeroed lazily by the operating system, and never grows:
/// `slots * 8` bytes. See the [module docs](self) for the slot format and the odds of a false
/// "seen".
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
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// A table of the given shape.
    ///
    /// # Panics
    ///
    /// If the allocation fails, as any allocation does; [`Geometry::new`] has already checked
    /// that the size fits the address space.
    pub fn new(geometry: Geometry) -> Self {
        let len = usize::try_from(geometry.slots())
            .expect("Geometry::new bounds the table by isize::MAX bytes")
            + (LINE_SLOTS - 1);
        // An 8-byte-aligned request is served by `calloc`, which maps fresh, lazily zeroed
        // pages for large tables; asking for 64-byte alignment instead would make the
        // allocator zero the whole table eagerly. So we align by skipping up to 7 slots.
        let zeroed = Box::<[AtomicU64]>::new_zeroed_slice(len);
        // SAFETY: `AtomicU64` has the same in-memory representation as `u64`, for which
        // all-zero bytes are a valid value, so a zeroed slice is fully initialised. Zero is
        // also the empty slot (state 0).
        let slots = unsafe { zeroed.assume_init() };
        let base = slots.as_ptr().align_offset(LINE_SLOTS * 8);
        assert!(
            base < LINE_SLOTS,
            "an 8-byte-aligned pointer is 64-byte aligned within 7 slots"
        );
        advise_huge_pages(&slots);
        Table {
            slots,
            base,
            geometry,
        }
    }

    /// A table of at least `slots` slots (rounded up to whole sets) in sets of `ways`.
    ///
    /// # Errors
    ///
    /// [`TableError`] when `slots` is 0, `ways` is not 1, 2, 4 or 8, or the table is too large.
    pub fn with_slots(slots: u64, ways: u32) -> Result<Self, TableError> {
        Ok(Table::new(Geometry::new(slots, ways)?))
    }

    /// The largest table of `ways`-way sets that fits in `bytes`.
    ///
    /// # Errors
    ///
    /// [`TableError`] when not even one set fits or `ways` is unsupported.
    pub fn with_memory(bytes: u64, ways: u32) -> Result<Self, TableError> {
        Ok(Table::new(Geometry::with_memory(bytes, ways)?))
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
            .filter(|slot| slot.load(Ordering::Relaxed) & STATE_MASK != EMPTY)
            .count() as u64
    }

    /// The fraction of slots that hold an entry (see [`Table::occupied`]).
    pub fn occupancy(&self) -> f64 {
        self.occupied() as f64 / self.geometry.slots() as f64
    }

    /// One-step check-and-set: `true` if `digest` was held (seen before, or in flight),
    /// otherwise it is inserted as done and the answer is `false`.
    #[inline]
    pub fn contains_and_add(&self, digest: Digest) -> bool {
        self.insert(digest, DONE) != Claim::New
    }

    /// Two-phase check: see [`Claim`]. A [`Claim::New`] digest is held as in flight until
    /// [`commit`](Table::commit) or [`erase`](Table::erase).
    #[inline]
    pub fn claim(&self, digest: Digest) -> Claim {
        self.insert(digest, IN_FLIGHT)
    }

    /// Marks `digest` as processed. Returns whether its set still held it (in flight or done).
    pub fn commit(&self, digest: Digest) -> bool {
        self.update(digest, |word| (word & !STATE_MASK) | DONE)
    }

    /// Empties the slot that holds `digest`. Returns whether its set still held it; another
    /// digest's entry is never touched.
    pub fn erase(&self, digest: Digest) -> bool {
        // Keep only the guard bit: an erase must not release or take a writer's guard.
        self.update(digest, |word| word & LOCK)
    }

    /// Whether the set holds `digest` (in flight or done), without changing anything.
    pub fn contains(&self, digest: Digest) -> bool {
        let fingerprint = fingerprint(digest);
        find(self.set(digest), fingerprint).is_some()
    }

    /// The slots of `digest`'s set.
    #[inline]
    fn set(&self, digest: Digest) -> &[AtomicU64] {
        let ways = self.geometry.ways() as usize;
        // `set_of` is below `sets`, so the set lies inside the table; `base` is on a cache line
        // and ways divide 8, so a set never crosses a line.
        let first = self.base + self.geometry.set_of(digest) as usize * ways;
        &self.slots[first..first + ways]
    }

    /// Claims `digest`, writing it with `state` if it is new.
    #[inline]
    fn insert(&self, digest: Digest, state: u64) -> Claim {
        let fingerprint = fingerprint(digest);
        let set = self.set(digest);
        // Lock-free fast path: a digest that is already held needs no guard. Acquire pairs
        // with the Release of the writer that stored it.
        if let Some((_, word)) = find(set, fingerprint) {
            return verdict(word);
        }
        if let [slot] = set {
            return insert_single(slot, fingerprint, state);
        }
        let _guard = SetGuard::lock(&set[0]);
        // Scan again: another writer may have inserted this digest since the first scan.
        // The guard's Acquire makes every earlier guard holder's writes visible here. Each slot
        // is read once; the copy is only used to decide, never written back.
        let mut words = [0u64; LINE_SLOTS];
        for (word, slot) in words.iter_mut().zip(set) {
            *word = slot.load(Ordering::Acquire);
        }
        let words = &words[..set.len()];
        if let Some(&word) = words.iter().find(|&&word| holds(word, fingerprint)) {
            return verdict(word);
        }
        let (victim, stamp) = choose_victim(words);
        let entry = (fingerprint << FINGERPRINT_SHIFT) | (u64::from(stamp) << STAMP_SHIFT) | state;
        // Only guard holders insert, so a plain store cannot lose another insert. A concurrent
        // `commit` or `erase` of the evicted entry either happened before (and is overwritten,
        // as an eviction should) or fails its compare-and-swap afterwards. The first slot keeps
        // its guard bit until the guard is dropped.
        let keep = if victim == 0 { LOCK } else { 0 };
        set[victim].store(entry | keep, Ordering::Release);
        Claim::New
    }

    /// Applies `change` to the slot that holds `digest`, if any, with compare-and-swap.
    fn update(&self, digest: Digest, change: impl Fn(u64) -> u64) -> bool {
        let fingerprint = fingerprint(digest);
        for slot in self.set(digest) {
            let mut word = slot.load(Ordering::Acquire);
            while holds(word, fingerprint) {
                match slot.compare_exchange_weak(
                    word,
                    change(word),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return true,
                    // The guard bit or the state changed under us, or the entry was evicted:
                    // look again.
                    Err(actual) => word = actual,
                }
            }
        }
        false
    }
}

/// The fingerprint kept in a slot: the top 53 bits of the digest's low half.
#[inline]
fn fingerprint(digest: Digest) -> u64 {
    digest.lo() >> FINGERPRINT_SHIFT
}

#[inline]
fn holds(word: u64, fingerprint: u64) -> bool {
    word & STATE_MASK != EMPTY && word >> FINGERPRINT_SHIFT == fingerprint
}

#[inline]
fn find(set: &[AtomicU64], fingerprint: u64) -> Option<(usize, u64)> {
    set.iter().enumerate().find_map(|(index, slot)| {
        let word = slot.load(Ordering::Acquire);
        holds(word, fingerprint).then_some((index, word))
    })
}

#[inline]
fn verdict(word: u64) -> Claim {
    if word & STATE_MASK == IN_FLIGHT {
        Claim::InFlight
    } else {
        Claim::Duplicate
    }
}

/// The classic one-way table: compare-and-swap on the single slot, no guard.
#[inline]
fn insert_single(slot: &AtomicU64, fingerprint: u64, state: u64) -> Claim {
    let entry = (fingerprint << FINGERPRINT_SHIFT) | state;
    let mut word = slot.load(Ordering::Acquire);
    loop {
        if holds(word, fingerprint) {
            return verdict(word);
        }
        match slot.compare_exchange_weak(word, entry, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Claim::New,
            // Someone else wrote the slot; if it was this digest, the loop reports it.
            Err(actual) => word = actual,
        }
    }
}

/// Picks the slot a new entry goes to (the first empty slot, else the oldest entry) and the
/// stamp it gets (one past the newest).
///
/// Stamps are 8-bit and compared by wrapping difference from the first live entry's stamp,
/// which orders them correctly while the live entries of a set span fewer than 128 insertions.
/// Without erasures they span at most `ways`; a survivor can fall further behind only if its
/// set sees more than a hundred insert-and-erase cycles, and then the worst outcome is that a
/// newer entry is evicted first.
///
/// The loop has no branch on slot contents, only selects: which slot is oldest is random, and a
/// mispredicted branch here, taken only once the set's cache line has arrived, would throw away
/// the loads of the next operations that the processor had already started.
#[inline]
fn choose_victim(words: &[u64]) -> (usize, u8) {
    let live = |word: u64| word & STATE_MASK != EMPTY;
    let stamp = |word: u64| (word >> STAMP_SHIFT) as u8;
    let reference = words
        .iter()
        .rev()
        .fold(0u8, |r, &word| if live(word) { stamp(word) } else { r });
    // Key per slot: empty slots 0..8 (by index), live ones 8 + (age + 128) * 8 + index, so the
    // minimum is the first empty slot, else the oldest entry.
    let mut best = u32::MAX;
    let mut newest = -1i32;
    for (index, &word) in words.iter().enumerate() {
        let age = i32::from(stamp(word).wrapping_sub(reference) as i8);
        let key = if live(word) {
            8 + ((age + 128) as u32) * 8 + index as u32
        } else {
            index as u32
        };
        best = best.min(key);
        newest = if live(word) { newest.max(age) } else { newest };
    }
    // With no live entry, `newest` stays -1 and the stamp is `reference` = 0.
    let stamp = reference.wrapping_add((newest + 1) as u8);
    ((best % 8) as usize, stamp)
}

/// Asks the kernel to back the table with 2 MiB pages where the allocation covers whole ones.
///
/// Lookups land on random slots, so with 4 KiB pages nearly every lookup of a large table also
/// misses the TLB. Transparent huge pages are often enabled in `madvise` mode only; this is
/// that advice. Where the kernel declines, nothing changes.
#[cfg(target_os = "linux")]
fn advise_huge_pages(slots: &[AtomicU64]) {
    const HUGE_PAGE: usize = 2 << 20;
    let start = slots.as_ptr() as usize;
    let end = start + std::mem::size_of_val(slots);
    let (first, last) = (start.next_multiple_of(HUGE_PAGE), end & !(HUGE_PAGE - 1));
    if last > first {
        // SAFETY: `[first, last)` is page-aligned and lies inside `slots`, memory this table
        // owns. MADV_HUGEPAGE is advice about how to back the pages: it neither unmaps them nor
        // changes their contents (huge pages fault in zeroed, and collapsing small pages into
        // a huge one copies them), so the slots keep their values and stay valid.
        let _ = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_HUGEPAGE,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_slots: &[AtomicU64]) {}

/// The writer guard of a set: the `LOCK` bit of its first slot.
///
/// Held for a few loads and one store. Dropping it releases the set.
struct SetGuard<'a> {
    word: &'a AtomicU64,
}

impl<'a> SetGuard<'a> {
    #[inline]
    fn lock(word: &'a AtomicU64) -> Self {
        let mut spins = 0u32;
        // Acquire: see every write of the previous holder, which released the bit.
        while word.fetch_or(LOCK, Ordering::Acquire) & LOCK != 0 {
            while word.load(Ordering::Relaxed) & LOCK != 0 {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    // The holder was likely descheduled: give it the core.
                    std::thread::yield_now();
                }
            }
        }
        SetGuard { word }
    }
}

impl Drop for SetGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: publish this holder's writes to the next holder and to lock-free readers.
        self.word.fetch_and(!LOCK, Ordering::Release);
    }
}

impl Store for Table {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        Ok(Table::claim(self, digest))
    }

    async fn claim_many(&self, digests: &[Digest]) -> Result<Vec<Claim>, StoreError> {
        Ok(digests
            .iter()
            .map(|&digest| Table::claim(self, digest))
            .collect())
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

#[cfg(test)]
mod tests;
