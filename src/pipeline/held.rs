//! Copies that wait beside their original.
//!
//! A copy whose claim finds its digest in flight is, most often, a copy of a message this
//! very process is handing to its handler: the copy from a second nsqd, arriving while the
//! first is still being written or served. Requeueing it upstream would bring it back a
//! `in_flight_requeue_delay` later, and again while the original is still on its way: with a
//! slow consumer behind the serve sink, copies bounce between nsqd and the sidecar. So the
//! copy waits here instead, TOUCHed with its original ([`Held::touch`]), and is decided when
//! the original settles ([`Held::close`]): finished as a copy once the original is delivered,
//! or decided again (and so delivered) once the original's claim is erased.
//!
//! Only copies of this process's own originals wait: a digest's entry lives from just before
//! this process claims it ([`Held::join`]) while any claim of it is on its way, and then, if
//! one was new, until that one is settled ([`Held::close`]). A copy in flight elsewhere
//! (another sidecar of a fleet) is requeued as before: its entry ends when the claims on their
//! way end and none was new ([`Held::leave`]).
//!
//! # The bound
//!
//! A held copy is still in flight at its nsqd, but set aside ([`Message::park`]): it does not
//! count toward the consumer's `max_in_flight`, whose RDY rises by one for each, so copies never
//! take the place of new messages (a consumer such as `nsq_to_file`, which writes a batch only
//! once it holds `--max-in-flight` messages, would otherwise wait for its timer).
//! [`Policy::max_held_copies`](super::Policy::max_held_copies) bounds them. Past it a copy is
//! requeued as one in flight elsewhere is: nothing is lost either way, a held copy that is
//! dropped requeues itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::dedup::Digest;
use crate::fold_hash::IdHasher;
use crate::nsq::Message;

/// Shards of the map, so that bursts settling at once rarely wait for each other's lock.
const SHARDS: usize = 16;

/// The shard of `digest`: its low bits, as random as any hash of them.
fn shard_of(digest: Digest) -> usize {
    digest.as_u128() as usize % SHARDS
}

/// Who opened a digest: one claim call of one burst.
pub(super) type Owner = u64;

/// An original in flight here (or claims of its digest still on their way) and the copies
/// that wait on it.
#[derive(Debug, Default)]
struct Original {
    /// The claim call whose claim was new, once one was.
    owner: Option<Owner>,
    /// Claims of the digest on their way (joined, not yet left).
    claimers: u32,
    copies: Vec<Message>,
}

/// The originals by digest.
type Originals = HashMap<Digest, Original, IdHasher>;

/// This process's originals in flight and the copies that wait on each.
#[derive(Debug)]
pub(super) struct Held {
    /// `std` mutexes: held for a lookup and the answers it queues, never across an `.await`.
    shards: [Mutex<Originals>; SHARDS],
    /// The last owner handed out.
    owners: AtomicU64,
    /// Copies held now, across the shards.
    copies: AtomicUsize,
    /// The most copies held at once.
    limit: usize,
}

impl Held {
    /// A map that holds at most `limit` copies at once (0: none, every copy in flight is
    /// requeued).
    pub(super) fn new(limit: usize) -> Self {
        Held {
            shards: std::array::from_fn(|_| Mutex::new(Originals::default())),
            owners: AtomicU64::new(0),
            copies: AtomicUsize::new(0),
            limit,
        }
    }

    /// Whether copies are held at all.
    pub(super) fn is_enabled(&self) -> bool {
        self.limit > 0
    }

    /// Joins each digest, before its claim, for a new owner: a copy whose claim finds the
    /// digest in flight after that claim may wait on it. The caller then either
    /// [`open`](Held::open)s a digest (its claim was new) or [`leave`](Held::leave)s it.
    ///
    /// Joining before claiming is what makes holding exact: a copy claimed after its
    /// original's claim always finds the original's entry, however the bursts' tasks are
    /// scheduled, because an entry with claims on their way is never removed.
    pub(super) fn join(&self, digests: &[Digest]) -> Owner {
        // Relaxed: a unique number, nothing else is ordered by it.
        let owner = self.owners.fetch_add(1, Ordering::Relaxed) + 1;
        self.each_by_shard(digests, |shard, _, digest| {
            shard.entry(digest).or_default().claimers += 1;
        });
        owner
    }

    /// `owner`'s claims of `digests` were new: copies wait on each until `owner` closes it.
    pub(super) fn open_many(&self, digests: &[Digest], owner: Owner) {
        self.each_by_shard(digests, |shard, _, digest| {
            let original = shard.entry(digest).or_default();
            original.claimers = original.claimers.saturating_sub(1);
            original.owner = Some(owner);
        });
    }

    /// A claim of `digest` was not new. When it was the last on its way and none was new,
    /// the entry ends: the copies held on it meanwhile, which the caller answers as that
    /// claim says.
    pub(super) fn leave(&self, digest: Digest) -> Vec<Message> {
        let mut shard = self.shard(digest);
        let Some(original) = shard.get_mut(&digest) else {
            return Vec::new();
        };
        original.claimers = original.claimers.saturating_sub(1);
        if original.claimers > 0 || original.owner.is_some() {
            return Vec::new();
        }
        let copies = shard.remove(&digest).map(|o| o.copies).unwrap_or_default();
        drop(shard);
        self.release(copies)
    }

    /// Holds `copy` beside its original in flight here. Gives it back when its digest is not
    /// this process's own in flight (anymore), or when as many copies as the bound allows
    /// are held already.
    pub(super) fn hold(&self, digest: Digest, mut copy: Message) -> Result<(), Message> {
        let mut shard = self.shard(digest);
        let Some(original) = shard.get_mut(&digest) else {
            return Err(copy);
        };
        // Relaxed: a bound, not a synchronisation; the shard's lock orders each digest's copies.
        if self.copies.fetch_add(1, Ordering::Relaxed) >= self.limit {
            self.copies.fetch_sub(1, Ordering::Relaxed);
            return Err(copy);
        }
        copy.park(true);
        original.copies.push(copy);
        Ok(())
    }

    /// TOUCHes the copies waiting on `digests`, so that nsqd keeps them in flight as long as
    /// their originals. Returns how many TOUCHes were queued and how many nsqd no longer takes
    /// (that copy timed out or its connection closed: nsqd redelivers it).
    pub(super) fn touch(&self, digests: &[Digest]) -> (usize, usize) {
        if self.copies.load(Ordering::Relaxed) == 0 {
            return (0, 0);
        }
        let (mut touched, mut failed) = (0, 0);
        for &digest in digests {
            let shard = self.shard(digest);
            for copy in shard.get(&digest).into_iter().flat_map(|o| &o.copies) {
                match copy.touch() {
                    Ok(()) => touched += 1,
                    Err(error) => {
                        failed += 1;
                        tracing::debug!(id = %copy.id(), %error, "TOUCH of a held copy failed; nsqd will redeliver it.");
                    }
                }
            }
        }
        (touched, failed)
    }

    /// Ends each owner's time with its digest, their originals settled: the copies held on
    /// each, in the order of `opened`, which the caller answers now. Nothing for an entry
    /// that is not that owner's.
    pub(super) fn close_many(&self, opened: &[(Digest, Owner)]) -> Vec<Vec<Message>> {
        let mut copies: Vec<Vec<Message>> = std::iter::repeat_with(Vec::new)
            .take(opened.len())
            .collect();
        let digests: Vec<Digest> = opened.iter().map(|&(digest, _)| digest).collect();
        let mut any = false;
        self.each_by_shard(&digests, |shard, i, digest| {
            if let Some(original) = shard.get(&digest) {
                if original.owner == Some(opened[i].1) {
                    copies[i] = shard.remove(&digest).map(|o| o.copies).unwrap_or_default();
                    any |= !copies[i].is_empty();
                }
            }
        });
        if any {
            copies = copies.into_iter().map(|c| self.release(c)).collect();
        }
        copies
    }

    /// Copies leaving the map: counted out and taken back from their set-aside.
    fn release(&self, copies: Vec<Message>) -> Vec<Message> {
        if !copies.is_empty() {
            self.copies.fetch_sub(copies.len(), Ordering::Relaxed);
        }
        let mut copies = copies;
        for copy in &mut copies {
            copy.park(false);
        }
        copies
    }

    /// Copies held now.
    pub(super) fn len(&self) -> usize {
        self.copies.load(Ordering::Relaxed)
    }

    fn shard(&self, digest: Digest) -> MutexGuard<'_, Originals> {
        self.lock(shard_of(digest))
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Originals> {
        // A panic cannot leave a map half-written: a poisoned lock is still usable.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls `each(map, i, digests[i])` for every digest of a burst with its shard's map,
    /// locking each shard once (not once per digest): the lookups under one lock are then
    /// independent of each other, so the processor overlaps their cache misses (a burst's
    /// entries were last touched a store round trip ago), which a lock taken and released
    /// between them, a full barrier each, would serialise.
    fn each_by_shard(
        &self,
        digests: &[Digest],
        mut each: impl FnMut(&mut Originals, usize, Digest),
    ) {
        // The digests' places grouped by shard (a counting sort): one pass to count, one to
        // place, one to visit.
        let mut starts = [0usize; SHARDS + 1];
        for &digest in digests {
            starts[shard_of(digest) + 1] += 1;
        }
        for shard in 0..SHARDS {
            starts[shard + 1] += starts[shard];
        }
        let mut next = starts;
        let mut places = vec![0; digests.len()];
        for (i, &digest) in digests.iter().enumerate() {
            let shard = shard_of(digest);
            places[next[shard]] = i;
            next[shard] += 1;
        }
        for shard in 0..SHARDS {
            let group = &places[starts[shard]..starts[shard + 1]];
            if group.is_empty() {
                continue;
            }
            let mut map = self.lock(shard);
            for &i in group {
                each(&mut map, i, digests[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Held, SHARDS};
    use crate::dedup::Digest;
    use crate::nsq::Message;

    /// Digests in every shard, several in some, so that a burst's digests are visited out of
    /// their order.
    fn digests(count: u8) -> Vec<Digest> {
        (0..count)
            .map(|i| Digest::from_u128(u128::from(i) * 7 % SHARDS as u128 + (u128::from(i) << 64)))
            .collect()
    }

    fn ids(copies: &[Message]) -> Vec<u8> {
        copies.iter().map(|c| c.id().0[0]).collect()
    }

    #[test]
    fn close_many_gives_each_original_its_own_copies_in_the_order_asked() {
        let held = Held::new(100);
        let digests = digests(40);
        let owner = held.join(&digests);
        held.open_many(&digests, owner);
        // One copy on every third original, with the original's number as its ID.
        for (i, &digest) in digests.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
            assert!(held.hold(digest, Message::for_test(i as u8)).is_ok());
        }
        assert_eq!(held.len(), 14);
        // Closed in another order than opened, the first by another owner (not its own).
        let mut closing: Vec<_> = digests.iter().rev().map(|&d| (d, owner)).collect();
        closing[0].1 = owner + 1;
        let copies = held.close_many(&closing);
        assert_eq!(copies.len(), 40);
        for (k, copies) in copies.iter().enumerate() {
            let i = 39 - k;
            let expected: Vec<u8> = if i % 3 == 0 && k != 0 {
                vec![i as u8]
            } else {
                vec![]
            };
            assert_eq!(ids(copies), expected, "the copies of original {i}");
        }
        assert_eq!(
            held.len(),
            1,
            "the copy of the original closed by another owner stays"
        );
        let copies = held.close_many(&[(digests[39], owner)]);
        assert_eq!(ids(&copies[0]), vec![39], "its own owner closes it");
        assert_eq!(held.len(), 0);
    }
}
