//! Digests whose message was requeued with a delay that its receiver asked for, and until when.
//!
//! When a consumer behind the serve sink REQs a message with a delay (or an HTTP endpoint
//! answers `Retry-After`), it is asking for that content later, most often because its own
//! downstream is down. The message is requeued upstream with that delay and its claim erased
//! (so its retry is not taken for a copy); but a copy from another nsqd would then be claimed
//! new at once and handed to the same receiver that just asked for time. So the digest is
//! deferred here until the delay ends: a copy that arrives meanwhile is requeued to come back
//! when the delay ends, without a claim, and the content reaches the receiver no sooner than
//! it asked.
//!
//! Deferrals are this process's own: a copy that reaches another sidecar of a fleet is decided
//! by the shared store as before. At most [`MAX_DEFERRED`] digests are deferred at once; past
//! that a new deferral is not kept (its copies are decided at once, as before: a copy may reach
//! the receiver early, nothing is lost).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::dedup::Digest;
use crate::fold_hash::IdHasher;

/// The most digests deferred at once.
pub(super) const MAX_DEFERRED: usize = 1 << 16;

/// Deferred digests and when each deferral ends.
#[derive(Debug, Default)]
pub(super) struct Deferred {
    /// A `std` mutex: held for a burst's lookups, never across an `.await`.
    until: Mutex<HashMap<Digest, Instant, IdHasher>>,
    /// Whether `until` may hold anything: every burst asks, and most never defer, so the
    /// answer is no without taking the lock.
    any: AtomicBool,
}

impl Deferred {
    /// Defers `digest` for `delay` from now (a later end replaces an earlier one).
    pub(super) fn defer(&self, digest: Digest, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        let now = Instant::now();
        let end = now + delay;
        let mut until = self.lock();
        if until.len() >= MAX_DEFERRED && !until.contains_key(&digest) {
            until.retain(|_, end| *end > now);
            if until.len() >= MAX_DEFERRED {
                return;
            }
        }
        let kept = until.entry(digest).or_insert(end);
        *kept = (*kept).max(end);
        // Relaxed: the lock orders the map; a burst that misses the flag just set decides its
        // copies as before.
        self.any.store(true, Ordering::Relaxed);
    }

    /// For each digest, how much longer it is deferred (`None`: not deferred), as of `now`.
    /// Ended deferrals are forgotten as they are met.
    pub(super) fn remaining(
        &self,
        digests: &[Digest],
        now: Instant,
    ) -> Option<Vec<Option<Duration>>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let mut until = self.lock();
        let remaining = digests
            .iter()
            .map(|digest| match until.get(digest) {
                Some(&end) if end > now => Some(end - now),
                Some(_) => {
                    until.remove(digest);
                    None
                }
                None => None,
            })
            .collect();
        if until.is_empty() {
            self.any.store(false, Ordering::Relaxed);
        }
        Some(remaining)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Digest, Instant, IdHasher>> {
        // A panic cannot leave the map half-written: a poisoned lock is still usable.
        self.until.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_deferred_until_its_delay_ends_and_then_forgotten() {
        let deferred = Deferred::default();
        let (a, b) = (Digest::from_u128(1), Digest::from_u128(2));
        let now = Instant::now();
        assert_eq!(deferred.remaining(&[a], now), None, "nothing deferred yet");
        deferred.defer(a, Duration::ZERO);
        assert_eq!(
            deferred.remaining(&[a], now),
            None,
            "a zero delay defers nothing"
        );
        deferred.defer(a, Duration::from_secs(90));
        let left = deferred.remaining(&[a, b], now).unwrap();
        assert!(left[0].unwrap() > Duration::from_secs(89), "{left:?}");
        assert_eq!(left[1], None);
        // A shorter deferral does not end a longer one early.
        deferred.defer(a, Duration::from_secs(1));
        assert!(deferred.remaining(&[a], now).unwrap()[0].unwrap() > Duration::from_secs(89));
        let later = Instant::now() + Duration::from_secs(91);
        assert_eq!(deferred.remaining(&[a], later), Some(vec![None]));
        assert_eq!(deferred.remaining(&[a], later), None, "ended, forgotten");
    }

    #[test]
    fn past_the_bound_ended_deferrals_make_room_and_new_ones_are_not_kept() {
        let deferred = Deferred::default();
        for n in 0..MAX_DEFERRED as u128 {
            deferred.defer(Digest::from_u128(n), Duration::from_secs(60));
        }
        let extra = Digest::from_u128(u128::MAX);
        deferred.defer(extra, Duration::from_secs(60));
        let now = Instant::now();
        assert_eq!(deferred.remaining(&[extra], now), Some(vec![None]));
        assert!(deferred.remaining(&[Digest::from_u128(0)], now).unwrap()[0].is_some());
    }
}
