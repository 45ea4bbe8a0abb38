//! Store writes that failed and are tried again: the commits of delivered messages, the
//! erases of failed ones, and the erases of requeued claims that got no answer (they may have
//! reached the store).
//!
//! Each of these leaves an entry in flight under this owner, which holds back every copy of
//! its content (answered `InFlight`, requeued) until the lease ends: 65 s by default. A shared
//! store that failed over or came back after a short outage answers again within seconds, so
//! the pipeline sends the writes again before its next claims, and copies are decided as soon
//! as the store answers instead of a lease later.
//!
//! Trying again is safe: a commit or an erase only touches this owner's own entry of that
//! digest, and answers `false` where there is none (the lease lapsed and another owner took
//! it over). An erase that lands after a later claim of the same digest by this owner lets
//! one copy through: a duplicate, never a loss.
//!
//! The erase of a claim that got no answer is sent before the next burst's claims, so it
//! lands before this owner claims that digest again in a later burst; a burst running at the
//! same time may still claim it first, and the erase then lets one copy through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::dedup::Digest;

/// The most writes kept of each kind. Beyond it the oldest are forgotten: their entries end
/// with their lease, as they would without a retry.
const MAX_KEPT: usize = 1 << 16;

/// The writes not yet accepted by the store.
#[derive(Debug, Default)]
pub(super) struct Unsettled {
    /// A `std` mutex: held only to push or take the lists, never across an `.await`.
    writes: Mutex<Writes>,
    /// Whether `writes` may hold anything: every burst asks, and with a store that answers
    /// (the in-process table always does) the answer is no without taking the lock.
    any: AtomicBool,
}

/// Digests to commit, and digests to erase.
#[derive(Debug, Default)]
pub(super) struct Writes {
    pub(super) commits: Vec<Digest>,
    pub(super) erases: Vec<Digest>,
}

impl Writes {
    pub(super) fn is_empty(&self) -> bool {
        self.commits.is_empty() && self.erases.is_empty()
    }
}

impl Unsettled {
    /// Keeps `commits` and `erases` to try again.
    pub(super) fn keep(&self, commits: &[Digest], erases: &[Digest]) {
        if commits.is_empty() && erases.is_empty() {
            return;
        }
        let mut writes = self.lock();
        extend_bounded(&mut writes.commits, commits);
        extend_bounded(&mut writes.erases, erases);
        // Relaxed: the lock orders the lists; a burst that misses the flag just set takes
        // them with the next burst.
        self.any.store(true, Ordering::Relaxed);
    }

    /// Takes every kept write, leaving none.
    pub(super) fn take(&self) -> Writes {
        if !self.any.load(Ordering::Relaxed) {
            return Writes::default();
        }
        let mut writes = self.lock();
        self.any.store(false, Ordering::Relaxed);
        std::mem::take(&mut *writes)
    }

    /// How many writes are kept.
    pub(super) fn len(&self) -> usize {
        let writes = self.lock();
        writes.commits.len() + writes.erases.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writes> {
        // A panic cannot leave the lists half-written: a poisoned lock is still usable.
        self.writes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Appends `more` to `kept`, dropping the oldest beyond [`MAX_KEPT`].
fn extend_bounded(kept: &mut Vec<Digest>, more: &[Digest]) {
    kept.extend_from_slice(more);
    if kept.len() > MAX_KEPT {
        let excess = kept.len() - MAX_KEPT;
        kept.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_failed_until_taken_and_forgets_the_oldest_beyond_the_bound() {
        let unsettled = Unsettled::default();
        let d = |n: u128| Digest::from_u128(n);
        unsettled.keep(&[d(1), d(2)], &[d(3)]);
        assert_eq!(unsettled.len(), 3);
        let writes = unsettled.take();
        assert_eq!(writes.commits, [d(1), d(2)]);
        assert_eq!(writes.erases, [d(3)]);
        assert!(unsettled.take().is_empty());

        let many: Vec<Digest> = (0..MAX_KEPT as u128 + 10).map(d).collect();
        unsettled.keep(&many, &[]);
        let writes = unsettled.take();
        assert_eq!(writes.commits.len(), MAX_KEPT);
        assert_eq!(writes.commits[0], d(10), "the oldest ten were forgotten");
    }
}
