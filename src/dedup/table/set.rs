//! One set's operations, on its `W` slots of the format `mod.rs` describes: look a digest up,
//! insert it under the set's guard (or, with one way, by one compare-and-swap), choose the
//! slot it replaces, and change an entry's state in place (`commit`, `erase`).
//!
//! Everything here is `#[inline(always)]` and generic over `W`, so that each associativity's
//! loops unroll into the table's operations.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(target_arch = "x86_64")]
use super::{line, LINE_SLOTS};
use super::{CURSOR_MASK, CURSOR_SHIFT, DONE, FINGERPRINT_SHIFT, LIVE, LOCK, STATE_MASK};
use crate::dedup::{Claim, Digest};

/// Loads every slot of a set.
#[inline(always)]
pub(super) fn load<const W: usize>(set: &[AtomicU64; W]) -> [u64; W] {
    // Acquire pairs with the Release of the writer that stored each entry.
    std::array::from_fn(|i| set[i].load(Ordering::Acquire))
}

/// The entry that holds `fingerprint`, if any. A set holds a fingerprint at most once, so the
/// scan needs no early exit (and no branch on slot contents).
#[inline(always)]
pub(super) fn find<const W: usize>(set: &[AtomicU64; W], fingerprint: u64) -> Option<u64> {
    find_in(&load(set), fingerprint)
}

#[inline(always)]
pub(super) fn find_in<const W: usize>(words: &[u64; W], fingerprint: u64) -> Option<u64> {
    let mut matches = 0u32;
    for (index, &word) in words.iter().enumerate() {
        matches |= u32::from(holds(word, fingerprint)) << index;
    }
    (matches != 0).then(|| words[matches.trailing_zeros() as usize])
}

/// Claims `fingerprint` in `set`, writing it with `state` if it is new.
#[inline(always)]
pub(super) fn insert<const W: usize>(set: &[AtomicU64; W], fingerprint: u64, state: u64) -> Claim {
    #[cfg(target_arch = "x86_64")]
    if let Ok(line) = <&[AtomicU64; LINE_SLOTS]>::try_from(set.as_slice()) {
        return line::insert(line, fingerprint, state);
    }
    insert_portable(set, fingerprint, state)
}

/// [`insert`] on any target and associativity.
#[inline(always)]
pub(super) fn insert_portable<const W: usize>(
    set: &[AtomicU64; W],
    fingerprint: u64,
    state: u64,
) -> Claim {
    // Lock-free fast path: a digest that is already held needs no guard.
    let words = load(set);
    if let Some(word) = find_in(&words, fingerprint) {
        return verdict(word);
    }
    if W == 1 {
        return insert_single(&set[0], words[0], fingerprint, state);
    }
    // Decide before taking the guard, then check under it that the set did not change (the
    // common case); if it did, another writer may have inserted this very digest, so look and
    // decide again. The guard's Acquire makes every earlier holder's writes visible here.
    let mut decision = choose_victim(&words);
    let guard = SetGuard::lock(&set[0], words[0]);
    let mut now = load(set);
    now[0] = guard.first;
    if now != words {
        match decide_again(&now, fingerprint) {
            Ok(again) => decision = again,
            Err(claim) => return claim,
        }
    }
    write_locked(
        set,
        guard,
        decision,
        (fingerprint << FINGERPRINT_SHIFT) | state,
    )
}

/// For an insert that finds, under the set's guard, that the set changed since it chose its
/// victim: another writer may have inserted this very digest, so look again (`Err` with the
/// answer if it is there), else choose the victim again.
#[inline(always)]
pub(super) fn decide_again<const W: usize>(
    now: &[u64; W],
    fingerprint: u64,
) -> Result<(usize, usize), Claim> {
    match find_in(now, fingerprint) {
        Some(word) => Err(verdict(word)),
        None => Ok(choose_victim(now)),
    }
}

/// Writes `entry` into the slot `decision` picked ([`choose_victim`]) and sets the set's cursor
/// as it says, under the set's guard (released on return), once the caller has checked that
/// the set does not hold the entry's fingerprint.
#[inline(always)]
pub(super) fn write_locked<const W: usize>(
    set: &[AtomicU64; W],
    mut guard: SetGuard<'_>,
    decision: (usize, usize),
    entry: u64,
) -> Claim {
    place(set, &mut guard, decision, entry);
    Claim::New
}

/// The write of [`write_locked`], leaving the guard held: the entry in the victim's slot and
/// the cursor in the first slot's word that the guard's release stores.
#[inline(always)]
pub(super) fn place<const W: usize>(
    set: &[AtomicU64; W],
    guard: &mut SetGuard<'_>,
    (victim, cursor): (usize, usize),
    entry: u64,
) {
    let cursor = (cursor as u64) << CURSOR_SHIFT;
    // Selects, not branches (see `choose_victim`). When the victim is the first slot, the entry
    // is written by the guard's release, and the store below rewrites the first slot with the
    // guard still held, which changes nothing anyone can act on.
    let first = if victim == 0 {
        entry | cursor
    } else {
        (guard.first & !CURSOR_MASK) | cursor
    };
    // Only guard holders insert, so a plain store cannot lose another insert. A concurrent
    // `commit` or `erase` of the evicted entry either happened before (and is overwritten, as
    // an eviction should) or fails its compare-and-swap afterwards.
    set[victim].store(
        if victim == 0 { first | LOCK } else { entry },
        Ordering::Release,
    );
    guard.first = first;
}

/// Applies `change` to the slot that holds `fingerprint`, if any, with compare-and-swap.
#[inline(always)]
pub(super) fn update<const W: usize>(
    set: &[AtomicU64; W],
    fingerprint: u64,
    change: impl Fn(u64) -> u64,
) -> bool {
    for slot in set {
        let mut word = slot.load(Ordering::Acquire);
        let mut spins = 0u32;
        while holds(word, fingerprint) {
            if word & LOCK != 0 {
                // The set's first slot belongs to a guard holder until it releases the guard
                // (a few instructions later) with a plain store, which would overwrite our
                // change: wait for it.
                backoff(&mut spins);
                word = slot.load(Ordering::Acquire);
                continue;
            }
            match slot.compare_exchange_weak(
                word,
                change(word),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                // The state changed, a guard was taken, or the entry was evicted: look again.
                Err(actual) => word = actual,
            }
        }
    }
    false
}

/// The fingerprint kept in a slot: the top 58 bits of the digest's low half.
#[inline]
pub(super) fn fingerprint(digest: Digest) -> u64 {
    digest.lo() >> FINGERPRINT_SHIFT
}

#[inline(always)]
pub(super) fn holds(word: u64, fingerprint: u64) -> bool {
    const KEY_MASK: u64 = !0 << FINGERPRINT_SHIFT | LIVE;
    word & KEY_MASK == (fingerprint << FINGERPRINT_SHIFT) | LIVE
}

#[inline]
pub(super) fn verdict(word: u64) -> Claim {
    if word & STATE_MASK == DONE {
        Claim::Duplicate
    } else {
        Claim::InFlight
    }
}

/// The classic one-way table: compare-and-swap on the single slot, no guard. `word` is the
/// slot's value as last loaded.
#[inline(always)]
pub(super) fn insert_single(
    slot: &AtomicU64,
    mut word: u64,
    fingerprint: u64,
    state: u64,
) -> Claim {
    let entry = (fingerprint << FINGERPRINT_SHIFT) | state;
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

/// Picks the slot a new entry goes to, and the set's cursor afterwards: the first empty slot
/// (cursor unchanged), else the slot at the cursor (which moves on by one).
///
/// No branch on slot contents, only selects: whether a set is full is random, and a
/// mispredicted branch taken once the set's cache line has arrived would throw away the loads
/// of the next operations that the processor had already started.
#[inline(always)]
pub(super) fn choose_victim<const W: usize>(words: &[u64; W]) -> (usize, usize) {
    let mut live = 0u32;
    for (index, &word) in words.iter().enumerate() {
        live |= ((word & LIVE) as u32) << index;
    }
    let cursor = ((words[0] & CURSOR_MASK) >> CURSOR_SHIFT) as usize % W;
    let first_empty = (!live).trailing_zeros() as usize;
    if first_empty < W {
        (first_empty, cursor)
    } else {
        (cursor, (cursor + 1) % W)
    }
}

/// Waits a little for a set's guard to be released: spins first, then, if the holder was likely
/// descheduled, gives it the core.
#[inline]
pub(super) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The writer guard of a set: the `LOCK` bit of its first slot.
///
/// While the bit is set, only the holder writes the first slot (`commit` and `erase` wait for
/// the bit to clear), so the holder releases the guard with a plain store of `first`: one
/// locked instruction per insert, the compare-and-swap that takes the guard.
pub(super) struct SetGuard<'a> {
    pub(super) word: &'a AtomicU64,
    /// The first slot's value without the guard bit; stored back on release.
    pub(super) first: u64,
}

impl<'a> SetGuard<'a> {
    /// Takes the guard of the set whose first slot is `word`, last seen holding `current`.
    #[inline(always)]
    pub(super) fn lock(word: &'a AtomicU64, mut current: u64) -> Self {
        let mut spins = 0u32;
        loop {
            if current & LOCK == 0 {
                // Acquire: see every write of the previous holder, which released with Release.
                match word.compare_exchange_weak(
                    current,
                    current | LOCK,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return SetGuard {
                            word,
                            first: current,
                        }
                    }
                    Err(actual) => current = actual,
                }
                continue;
            }
            backoff(&mut spins);
            current = word.load(Ordering::Relaxed);
        }
    }
}

impl Drop for SetGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: publish this holder's writes to the next holder and to lock-free readers.
        self.word.store(self.first & !LOCK, Ordering::Release);
    }
}
