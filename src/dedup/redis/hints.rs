//! Where this store's in-flight claims wrote their entries: the slot of each digest it
//! claimed, so that the digest's commit, erase or renew reads and writes only that entry
//! (`set.lua`, "a hint") instead of reading its whole set again.
//!
//! A hint is never trusted: the script checks that the entry at the slot still starts with
//! the slot and the digest and is occupied, and then the state and the owner as always;
//! otherwise it reads the whole set, as without a hint. So a stale hint (the entry pushed out
//! by another claim, erased, taken over after its lease, or a server restarted empty) costs a
//! read, never a wrong answer. Hints are forgotten when they are used by a commit or an erase,
//! all at once on a connection error (the server may have restarted), and all at once when
//! [`MAX_HINTS`] are kept (claims that were never committed nor erased).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::dedup::Digest;

/// The most claims whose slot a store keeps, about 40 bytes each: many more than a sidecar
/// has in flight (`max_in_flight`).
pub(super) const MAX_HINTS: usize = 65_536;

/// The slots of this store's in-flight claims, by digest.
#[derive(Debug, Default)]
pub(super) struct Hints {
    /// A `std` mutex: held only to look up or change entries, never across an `.await`.
    slots: Mutex<HashMap<Digest, u8>>,
}

impl Hints {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, u8>> {
        // A panic while the lock was held cannot leave a wrong hint that matters: the script
        // checks every hint.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the slot of each digest that was just claimed new; when [`MAX_HINTS`] are kept,
    /// all are forgotten first.
    pub(super) fn remember(&self, claimed: impl IntoIterator<Item = (Digest, u8)>) {
        let mut slots = self.lock();
        for (digest, slot) in claimed {
            if slots.len() >= MAX_HINTS && !slots.contains_key(&digest) {
                slots.clear();
            }
            slots.insert(digest, slot);
        }
    }

    /// The slot of each digest, forgotten (for a commit or an erase, after which the digest
    /// has no claim of ours to come back to).
    pub(super) fn take(&self, digests: &[Digest]) -> Vec<Option<u8>> {
        let mut slots = self.lock();
        digests.iter().map(|digest| slots.remove(digest)).collect()
    }

    /// The slot of each digest, kept (for a renew, after which the claim goes on).
    pub(super) fn get(&self, digests: &[Digest]) -> Vec<Option<u8>> {
        let slots = self.lock();
        digests
            .iter()
            .map(|digest| slots.get(digest).copied())
            .collect()
    }

    /// Forgets every slot.
    pub(super) fn forget_all(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u128) -> Digest {
        Digest::from_u128(n)
    }

    #[test]
    fn a_commit_takes_the_hint_and_a_renew_keeps_it() {
        let hints = Hints::default();
        hints.remember([(digest(1), 3), (digest(2), 0)]);
        assert_eq!(hints.get(&[digest(1), digest(3)]), vec![Some(3), None]);
        assert_eq!(hints.get(&[digest(1)]), vec![Some(3)], "a renew keeps it");
        assert_eq!(hints.take(&[digest(1), digest(2)]), vec![Some(3), Some(0)]);
        assert_eq!(hints.take(&[digest(1), digest(2)]), vec![None, None]);
    }

    #[test]
    fn hints_are_bounded_and_forgotten_all_at_once() {
        let hints = Hints::default();
        hints.remember((0..MAX_HINTS as u128).map(|n| (digest(n), 1)));
        assert_eq!(hints.get(&[digest(0)]), vec![Some(1)]);
        // A claim claimed again keeps its place; a new one past the bound empties the rest.
        hints.remember([(digest(5), 2)]);
        assert_eq!(hints.get(&[digest(0), digest(5)]), vec![Some(1), Some(2)]);
        hints.remember([(digest(u128::MAX), 4)]);
        assert_eq!(
            hints.get(&[digest(0), digest(u128::MAX)]),
            vec![None, Some(4)]
        );
        hints.forget_all();
        assert_eq!(hints.get(&[digest(u128::MAX)]), vec![None]);
    }
}
