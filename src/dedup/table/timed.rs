//! `max_age` for the in-process table: a time beside every slot, so that a done entry older
//! than `max_age` counts as not seen and a claim replaces it.
//!
//! # Layout
//!
//! A second array, parallel to the slots, holds one `AtomicU64` per slot:
//!
//! ```text
//!  63                          32 31                           0
//! +------------------------------+------------------------------+
//! |  seconds since the Unix epoch |  low 32 bits of the fingerprint |
//! +------------------------------+------------------------------+
//! ```
//!
//! The slots keep their layout, so the fingerprint keeps its 58 bits and the odds of a false
//! "seen" do not change; `max_age` costs 8 bytes per slot, and a second memory access only for
//! lookups that find their fingerprint (copies), since a new digest never reads a time. With
//! `max_age` off there is no array and the table runs its usual code.
//!
//! Whole seconds since the epoch in 32 bits last until 2106: no wrap-around. A copy arriving
//! within `max_age` is caught; one arriving later than `max_age` plus one second passes.
//!
//! # Concurrency
//!
//! A writer stores the slot, then its time, both under the set's guard (or right after the
//! compare-and-swap of a one-way set). A reader loads the slot, the time, and the slot again,
//! and looks again if the slot changed: a time it accepts was therefore written after the slot
//! it read. The fingerprint bits in the time tell a slot's own time from the time of the entry
//! it replaced; a slot whose time is not its own yet is being written right now and counts as
//! young. So an entry is never taken for younger than it is by reading another entry's time:
//! the error that would drop a message. The error the other way, two claims of one digest both
//! finding its old entry expired at the same instant, lets one copy through, as the trade
//! allows. In-flight entries never expire: their claimer is still at work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::memory::zeroed_slots;
use super::set::{backoff, choose_victim, fingerprint, holds, load, place, verdict, SetGuard};
use super::{Table, CURSOR_MASK, CURSOR_SHIFT, DONE, FINGERPRINT_SHIFT, LOCK, STATE_MASK};
use crate::dedup::clock::Clock;
use crate::dedup::{Claim, Digest};
use crate::error::TableError;

/// The times of a table with `max_age`.
pub(super) struct Times {
    /// One per slot, at the same index as the slot (the same `base` offset included).
    times: Box<[AtomicU64]>,
    max_age_s: u64,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Times {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Times")
            .field("max_age_s", &self.max_age_s)
            .finish_non_exhaustive()
    }
}

impl Times {
    /// Times for `len` slots, forgetting done entries after `max_age_s` seconds by `clock`.
    pub(super) fn new(
        len: usize,
        max_age_s: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TableError> {
        Ok(Times {
            // The slots were had; the times, as much again, were not.
            times: zeroed_slots(len).ok_or(TableError::Alloc {
                bytes: len as u64 * 16,
                timed: true,
                machine_bytes: None,
            })?,
            max_age_s,
            clock,
        })
    }

    /// `max_age` in seconds.
    pub(super) fn max_age_s(&self) -> u64 {
        self.max_age_s
    }

    fn now_s(&self) -> u64 {
        self.clock.now_ms() / 1000
    }
}

/// The time word of an entry of `fingerprint` written at `now_s`.
fn stamp(now_s: u64, fingerprint: u64) -> u64 {
    (now_s.min(u64::from(u32::MAX)) << 32) | (fingerprint & 0xffff_ffff)
}

/// Whether the entry `word` (holding `fingerprint`) with time word `time` still counts at
/// `now_s`.
fn young(word: u64, fingerprint: u64, time: u64, now_s: u64, max_age_s: u64) -> bool {
    if word & STATE_MASK != DONE || time & 0xffff_ffff != fingerprint & 0xffff_ffff {
        // In flight, or its time is being written right now.
        return true;
    }
    now_s.saturating_sub(time >> 32) <= max_age_s
}

impl Table {
    /// The slot index of `digest`'s set and its `W` times.
    fn times_of<'t, const W: usize>(
        &self,
        times: &'t Times,
        digest: Digest,
    ) -> (usize, &'t [AtomicU64; W]) {
        let first = self.base + self.geometry.set_of(digest) as usize * W;
        let slice = times.times[first..first + W]
            .try_into()
            .expect("a range of W times is an array of W times");
        (first, slice)
    }

    /// The index of the slot holding `fingerprint` in `words`, if any.
    fn position<const W: usize>(words: &[u64; W], fingerprint: u64) -> Option<usize> {
        words.iter().position(|&word| holds(word, fingerprint))
    }

    /// [`Table::insert_timed`] for the table's ways; out of line, so that tables without
    /// `max_age` keep their own calls small enough to inline.
    #[cold]
    #[inline(never)]
    pub(super) fn insert_timed_any(&self, times: &Times, digest: Digest, state: u64) -> Claim {
        match self.geometry.ways() {
            1 => self.insert_timed::<1>(times, digest, state),
            2 => self.insert_timed::<2>(times, digest, state),
            4 => self.insert_timed::<4>(times, digest, state),
            _ => self.insert_timed::<8>(times, digest, state),
        }
    }

    /// A claim (`state` in flight) or check-and-set (`state` done) with `max_age`.
    pub(super) fn insert_timed<const W: usize>(
        &self,
        times: &Times,
        digest: Digest,
        state: u64,
    ) -> Claim {
        let set = self.set::<W>(digest);
        let (_, time_of) = self.times_of::<W>(times, digest);
        // The times live in their own array: ask for their line now, so that its wait overlaps
        // the set's instead of following it.
        prefetch(time_of);
        let fp = fingerprint(digest);
        let now_s = times.now_s();
        loop {
            let words = load(set);
            let expired = match Self::position(&words, fp) {
                Some(i) => {
                    let time = time_of[i].load(Ordering::Acquire);
                    if set[i].load(Ordering::Acquire) != words[i] {
                        continue;
                    }
                    if young(words[i], fp, time, now_s, times.max_age_s) {
                        return verdict(words[i]);
                    }
                    Some(i)
                }
                None => None,
            };
            let entry = (fp << FINGERPRINT_SHIFT) | state;
            if W == 1 {
                if set[0]
                    .compare_exchange(words[0], entry, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    time_of[0].store(stamp(now_s, fp), Ordering::Release);
                    return Claim::New;
                }
                continue;
            }
            let guard = SetGuard::lock(&set[0], words[0]);
            let mut now = load(set);
            now[0] = guard.first;
            if now != words {
                // Another writer changed the set: decide again from what it holds now.
                drop(guard);
                continue;
            }
            // An expired entry of this very digest is replaced in place (a set holds a
            // fingerprint once); otherwise the usual victim.
            let decision = match expired {
                Some(i) => (i, ((words[0] & CURSOR_MASK) >> CURSOR_SHIFT) as usize % W),
                None => choose_victim(&words),
            };
            write_timed(set, time_of, guard, decision, entry, stamp(now_s, fp));
            return Claim::New;
        }
    }

    /// Marks `digest` done and stamps the time of the commit.
    pub(super) fn commit_timed<const W: usize>(&self, times: &Times, digest: Digest) -> bool {
        let set = self.set::<W>(digest);
        let (_, time_of) = self.times_of::<W>(times, digest);
        let fp = fingerprint(digest);
        let now_s = times.now_s();
        for (slot, time) in set.iter().zip(time_of) {
            let mut word = slot.load(Ordering::Acquire);
            let mut spins = 0u32;
            while holds(word, fp) {
                if word & LOCK != 0 {
                    backoff(&mut spins);
                    word = slot.load(Ordering::Acquire);
                    continue;
                }
                let done = (word & !STATE_MASK) | DONE;
                match slot.compare_exchange_weak(word, done, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        time.store(stamp(now_s, fp), Ordering::Release);
                        return true;
                    }
                    Err(actual) => word = actual,
                }
            }
        }
        false
    }

    /// Whether `digest` is held and not expired.
    pub(super) fn contains_timed<const W: usize>(&self, times: &Times, digest: Digest) -> bool {
        let set = self.set::<W>(digest);
        let (_, time_of) = self.times_of::<W>(times, digest);
        let fp = fingerprint(digest);
        let now_s = times.now_s();
        loop {
            let words = load(set);
            let Some(i) = Self::position(&words, fp) else {
                return false;
            };
            let time = time_of[i].load(Ordering::Acquire);
            if set[i].load(Ordering::Acquire) == words[i] {
                return young(words[i], fp, time, now_s, times.max_age_s);
            }
        }
    }

    /// The time word of slot `index` (for the table file).
    pub(crate) fn time_word(&self, index: usize) -> Option<u64> {
        let times = self.timed.as_ref()?;
        Some(times.times[self.base + index].load(Ordering::Relaxed))
    }

    /// Restores the time word of slot `index` (for the table file).
    pub(crate) fn restore_time(&self, index: usize, word: u64) {
        if let Some(times) = &self.timed {
            times.times[self.base + index].store(word, Ordering::Relaxed);
        }
    }
}

/// Asks the processor to start loading `times` into cache.
#[inline(always)]
pub(super) fn prefetch<const W: usize>(times: &[AtomicU64; W]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults and changes no program state; the pointer
    // comes from a reference, so it is in bounds anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(times.as_ptr().cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = times;
}

/// [`super::set::write_locked`] with the entry's time stored after the slot and before the guard
/// is released.
fn write_timed<const W: usize>(
    set: &[AtomicU64; W],
    time_of: &[AtomicU64; W],
    mut guard: SetGuard<'_>,
    decision: (usize, usize),
    entry: u64,
    time: u64,
) {
    place(set, &mut guard, decision, entry);
    time_of[decision.0].store(time, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::dedup::clock::ManualClock;
    use crate::dedup::Geometry;

    #[derive(Debug, Clone)]
    enum Op {
        /// Claim digest `n`, and commit it if it was new and `commit`.
        Claim { n: u8, commit: bool },
        /// `contains_and_add` of digest `n`.
        Add { n: u8 },
        /// Move the clock forward.
        Wait { ms: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..40, any::<bool>()).prop_map(|(n, commit)| Op::Claim { n, commit }),
            (0u8..40).prop_map(|n| Op::Add { n }),
            (0u32..25_000).prop_map(|ms| Op::Wait { ms }),
        ]
    }

    fn digest(n: u8) -> Digest {
        crate::DigestAlgorithm::default().digest(&[n])
    }

    /// What the table must answer: done entries with their commit second, in-flight ones.
    #[derive(Default)]
    struct Model {
        done: HashMap<u8, u64>,
        in_flight: Vec<u8>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// With 40 digests in 4,096 slots nothing is evicted, so the table must answer exactly
        /// as a map of commit times: caught within `max_age`, passing beyond it.
        #[test]
        fn answers_as_a_map_of_commit_times(ways in prop::sample::select(vec![1u32, 2, 4, 8]), ops in prop::collection::vec(op(), 1..200)) {
            let clock = Arc::new(ManualClock::new(1_700_000_000_000));
            let max_age = 10;
            let table = Table::with_max_age(
                Geometry::new(4096, ways).unwrap(),
                Duration::from_secs(max_age),
                clock.clone(),
            )
            .unwrap();
            let mut model = Model::default();
            for op in ops {
                let now_s = clock.now_ms() / 1000;
                let young = |model: &Model, n: u8| {
                    model.done.get(&n).is_some_and(|&t| now_s - t <= max_age)
                };
                match op {
                    Op::Claim { n, commit } => {
                        let expected = if model.in_flight.contains(&n) {
                            Claim::InFlight
                        } else if young(&model, n) {
                            Claim::Duplicate
                        } else {
                            Claim::New
                        };
                        prop_assert_eq!(table.claim(digest(n)), expected, "claim {}", n);
                        if expected == Claim::New {
                            if commit {
                                prop_assert!(table.commit(digest(n)));
                                model.done.insert(n, now_s);
                            } else {
                                model.done.remove(&n);
                                model.in_flight.push(n);
                            }
                        }
                    }
                    Op::Add { n } => {
                        let expected = model.in_flight.contains(&n) || young(&model, n);
                        prop_assert_eq!(table.contains_and_add(digest(n)), expected, "add {}", n);
                        if !expected {
                            model.done.insert(n, now_s);
                        }
                    }
                    Op::Wait { ms } => clock.advance_ms(u64::from(ms)),
                }
            }
        }
    }

    #[test]
    fn a_copy_is_caught_up_to_max_age_and_passes_a_second_later() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let table = Table::with_max_age(
            Geometry::new(64, 8).unwrap(),
            Duration::from_secs(600),
            clock.clone(),
        )
        .unwrap();
        assert!(!table.contains_and_add(digest(1)));
        clock.advance_ms(600_000);
        assert!(table.contains_and_add(digest(1)), "at max_age: caught");
        clock.advance_ms(1_000);
        assert!(
            !table.contains_and_add(digest(1)),
            "a second later: passes, and is stored anew"
        );
        assert!(table.contains_and_add(digest(1)));
        // In flight never expires: its claimer is still at work.
        assert_eq!(table.claim(digest(2)), Claim::New);
        clock.advance_ms(3_600_000);
        assert_eq!(table.claim(digest(2)), Claim::InFlight);
        // A clock set back makes entries look young, never old.
        assert!(table.commit(digest(2)));
        clock.set_ms(0);
        assert_eq!(table.claim(digest(2)), Claim::Duplicate);
    }

    #[test]
    fn threads_claiming_the_same_digests_get_one_new_each() {
        let clock = Arc::new(ManualClock::new(5_000_000));
        let table = Arc::new(
            Table::with_max_age(
                Geometry::new(1 << 14, 8).unwrap(),
                Duration::from_secs(60),
                clock,
            )
            .unwrap(),
        );
        let news: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let table = table.clone();
                    scope.spawn(move || {
                        (0..2000u32)
                            .filter(|n| {
                                let d = crate::DigestAlgorithm::default().digest(&n.to_le_bytes());
                                table.claim(d) == Claim::New
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(news, 2000);
    }
}
