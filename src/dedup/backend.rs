//! Runtime choice of store: the in-process table, Memcached, Redis, or none.
//!
//! [`Backend`] is an enum rather than a `Box<dyn Store>` because [`Store`]'s methods return
//! `impl Future` (not object-safe), and because a `match` per call keeps the hot path free of
//! allocation and virtual calls: the in-process arm compiles down to the table's own calls.
//!
//! The shared stores' arms box their futures. An enum's future is as large as its largest arm, and
//! the Memcached store's are about 1.7 KB: unboxed, every message's task (which holds several
//! of them) would be copied around at that size, in-process table or not. One allocation
//! next to a network round trip costs nothing measurable.

use std::sync::Arc;

use crate::dedup::generational::Generations;
use crate::dedup::journal::Journal;
use crate::dedup::local::LocalTable;
use crate::dedup::memcached::MemcachedStore;
use crate::dedup::near::{NearStats, NearTable};
use crate::dedup::redis::RedisStore;
use crate::dedup::table::Table;
use crate::dedup::{Claim, Digest, Geometry, NoStore, Store};
use crate::error::StoreError;

/// A store chosen at run time (`store.kind = "memory" | "memcached" | "redis" | "none"`).
#[derive(Debug)]
pub enum Backend {
    /// The in-process, lock-free table; one that sizes itself is behind a read-write lock
    /// (see [`LocalTable`]).
    Memory(LocalTable),
    /// The in-process table kept in a file: each commit and erase is also appended to the
    /// file's journal before the message is answered.
    Journalled(LocalTable, Arc<Journal>),
    /// The table shared through Memcached, following the store's descriptor across resizes,
    /// with a near-table in front when configured.
    Memcached(Generations<MemcachedStore>, Option<NearTable>),
    /// The table shared through Redis or a Redis Cluster, following the store's descriptor
    /// across resizes, with a near-table in front when configured.
    Redis(Generations<RedisStore>, Option<NearTable>),
    /// No de-duplication: every claim is [`Claim::New`].
    None(NoStore),
}

impl Backend {
    /// The name used in config files, flags and metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) | Backend::Journalled(..) => "memory",
            Backend::Memcached(..) => "memcached",
            Backend::Redis(..) => "redis",
            Backend::None(_) => "none",
        }
    }

    /// The shared table's namespace (its keys' prefix), for a shared store.
    pub(crate) fn namespace(&self) -> Option<String> {
        match self {
            Backend::Memcached(store, _) => Some(store.current().config().namespace.clone()),
            Backend::Redis(store, _) => Some(store.current().config().namespace.clone()),
            _ => None,
        }
    }

    /// Fraction of slots that hold an entry, where the store can tell cheaply enough for a
    /// periodic report: only the in-process table (a scan of its slots) answers.
    pub fn occupancy(&self) -> Option<f64> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                Some(table.with(Table::occupancy))
            }
            Backend::Memcached(..) | Backend::Redis(..) | Backend::None(_) => None,
        }
    }

    /// For a table of generations (in-process or shared): where a resize stands, `Some(None)`
    /// with one generation; `None` without a table.
    pub fn resizing(&self) -> Option<Option<crate::Resizing>> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                Some(table.with(Table::resizing))
            }
            Backend::Memcached(store, _) => Some(store.resizing()),
            Backend::Redis(store, _) => Some(store.resizing()),
            Backend::None(_) => None,
        }
    }

    /// Shared-store servers ejected and taken back so far, for a store of several servers.
    pub fn ejections(&self) -> Option<(u64, u64)> {
        match self {
            Backend::Memcached(store, _) if store.current().config().servers.len() > 1 => {
                let store = store.current();
                Some((store.ejections(), store.returns()))
            }
            _ => None,
        }
    }

    /// For a Redis Cluster: the `MOVED`/`ASK` answers followed, and the operations tried
    /// again after a node failed or the cluster was failing over.
    pub fn cluster_retries(&self) -> Option<(u64, u64)> {
        match self {
            Backend::Redis(store, _) if store.current().config().cluster => {
                let store = store.current();
                Some((store.redirects(), store.retries()))
            }
            _ => None,
        }
    }

    /// What the near-table answered, when there is one.
    pub fn near_stats(&self) -> Option<NearStats> {
        match self {
            Backend::Memcached(_, Some(near)) | Backend::Redis(_, Some(near)) => Some(near.stats()),
            _ => None,
        }
    }
}

impl Store for Backend {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                Ok(table.with(|t| t.claim(digest)))
            }
            Backend::Memcached(_, Some(near)) if near.committed(digest) => Ok(Claim::Duplicate),
            Backend::Memcached(store, _) => Box::pin(store.claim(digest)).await,
            Backend::Redis(_, Some(near)) if near.committed(digest) => Ok(Claim::Duplicate),
            Backend::Redis(store, _) => Box::pin(store.claim(digest)).await,
            Backend::None(_) => Ok(Claim::New),
        }
    }

    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                table.with(|t| answered(|c| t.claim_many_into(digests, c)))
            }
            Backend::Memcached(store, near) => {
                claim_many_behind(store, near.as_ref(), digests, false).await
            }
            Backend::Redis(store, near) => {
                claim_many_behind(store, near.as_ref(), digests, false).await
            }
            Backend::None(store) => store.claim_many(digests).await,
        }
    }

    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        match self {
            Backend::Memory(table) => {
                table.with(|t| answered(|c| t.claim_done_many_into(digests, c)))
            }
            Backend::Journalled(table, journal) => {
                // Each new entry is a commit in the journal, so that a restart keeps it; one
                // wait for the burst's records when commits are synced.
                let claims = table.with(|t| answered(|c| t.claim_done_many_into(digests, c)));
                let mut any = false;
                for (&digest, claim) in digests.iter().zip(&claims) {
                    if claim == &Ok(Claim::New) {
                        journal.commit(digest);
                        any = true;
                    }
                }
                if any && journal.syncs() {
                    Box::pin(journal.synced()).await;
                }
                claims
            }
            Backend::Memcached(store, near) => {
                claim_many_behind(store, near.as_ref(), digests, true).await
            }
            Backend::Redis(store, near) => {
                claim_many_behind(store, near.as_ref(), digests, true).await
            }
            Backend::None(store) => store.claim_done_many(digests).await,
        }
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(table) => Ok(table.with(|t| t.commit(digest))),
            Backend::Journalled(table, journal) => {
                let held = table.with(|t| t.commit(digest));
                if held {
                    journal.commit(digest);
                    if journal.syncs() {
                        Box::pin(journal.synced()).await;
                    }
                }
                Ok(held)
            }
            Backend::Memcached(store, near) => {
                // The message was delivered whatever Memcached says now: remember it here, so
                // its copies are caught even while Memcached is unreachable.
                remember_near(near.as_ref(), &[digest]);
                Box::pin(store.commit(digest)).await
            }
            Backend::Redis(store, near) => {
                // As for Memcached: delivered, whatever Redis says now.
                remember_near(near.as_ref(), &[digest]);
                Box::pin(store.commit(digest)).await
            }
            Backend::None(_) => Ok(true),
        }
    }

    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        match self {
            Backend::Memory(table) => table.with(|t| answered(|h| t.commit_many_into(digests, h))),
            Backend::Journalled(table, journal) => {
                // A burst's records, then one wait for all of them when commits are synced.
                let held = journal_each(
                    digests,
                    |d| table.with(|t| t.commit(d)),
                    |d| journal.commit(d),
                );
                if journal.syncs() {
                    Box::pin(journal.synced()).await;
                }
                held
            }
            Backend::Memcached(store, near) => {
                remember_near(near.as_ref(), digests);
                Box::pin(store.commit_many(digests)).await
            }
            Backend::Redis(store, near) => {
                remember_near(near.as_ref(), digests);
                Box::pin(store.commit_many(digests)).await
            }
            Backend::None(_) => vec![Ok(true); digests.len()],
        }
    }

    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        match self {
            Backend::Memory(table) => table.with(|t| answered(|h| t.erase_many_into(digests, h))),
            Backend::Journalled(table, journal) => {
                let held = journal_each(
                    digests,
                    |d| table.with(|t| t.erase(d)),
                    |d| journal.erase(d),
                );
                if journal.syncs() {
                    Box::pin(journal.synced()).await;
                }
                held
            }
            Backend::Memcached(store, near) => {
                forget_near(near.as_ref(), digests);
                Box::pin(store.erase_many(digests)).await
            }
            Backend::Redis(store, near) => {
                forget_near(near.as_ref(), digests);
                Box::pin(store.erase_many(digests)).await
            }
            Backend::None(_) => vec![Ok(true); digests.len()],
        }
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(table) => Ok(table.with(|t| t.erase(digest))),
            Backend::Journalled(table, journal) => {
                let held = table.with(|t| t.erase(digest));
                if held {
                    journal.erase(digest);
                    if journal.syncs() {
                        Box::pin(journal.synced()).await;
                    }
                }
                Ok(held)
            }
            Backend::Memcached(store, near) => {
                forget_near(near.as_ref(), &[digest]);
                Box::pin(store.erase(digest)).await
            }
            Backend::Redis(store, near) => {
                forget_near(near.as_ref(), &[digest]);
                Box::pin(store.erase(digest)).await
            }
            Backend::None(_) => Ok(true),
        }
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                Ok(table.with(|t| t.contains(digest)))
            }
            Backend::Memcached(store, _) => Box::pin(store.renew(digest)).await,
            Backend::Redis(store, _) => Box::pin(store.renew(digest)).await,
            Backend::None(_) => Ok(true),
        }
    }

    fn geometry(&self) -> Option<Geometry> {
        match self {
            Backend::Memory(table) | Backend::Journalled(table, _) => {
                Some(table.with(Table::geometry))
            }
            Backend::Memcached(store, _) => store.geometry(),
            Backend::Redis(store, _) => store.geometry(),
            Backend::None(_) => None,
        }
    }
}

/// The in-process table's answers that `fill` writes into a new vector (claims, or whether
/// each commit or erase found its entry), as a store's.
fn answered<T>(fill: impl FnOnce(&mut Vec<T>)) -> Vec<Result<T, StoreError>> {
    let mut answers = Vec::new();
    fill(&mut answers);
    answers.into_iter().map(Ok).collect()
}

/// Makes the near-table, if any, remember digests delivered: their copies are caught here
/// without a round trip, even while the shared store is unreachable.
fn remember_near(near: Option<&NearTable>, digests: &[Digest]) {
    if let Some(near) = near {
        for &digest in digests {
            near.remember(digest);
        }
    }
}

/// Makes the near-table, if any, forget digests about to be erased: a digest claimed done at
/// once is remembered there, and the erase of one (its handler failed it all the same) must
/// let its retry through to the shared table.
fn forget_near(near: Option<&NearTable>, digests: &[Digest]) {
    if let Some(near) = near {
        for &digest in digests {
            near.forget(digest);
        }
    }
}

/// Applies `change` to each digest and journals (`record`) those whose set still held them.
fn journal_each(
    digests: &[Digest],
    change: impl Fn(Digest) -> bool,
    record: impl Fn(Digest),
) -> Vec<Result<bool, StoreError>> {
    digests
        .iter()
        .map(|&digest| {
            let held = change(digest);
            if held {
                record(digest);
            }
            Ok(held)
        })
        .collect()
}

/// Claims `digests` from a shared `store`, answering those the near-table holds (what this
/// process committed itself) without a round trip. With `done`, the new ones are claimed
/// done at once ([`Store::claim_done_many`]) and the near-table remembers them, as it
/// remembers a commit.
async fn claim_many_behind<S: Store>(
    store: &S,
    near: Option<&NearTable>,
    digests: &[Digest],
    done: bool,
) -> Vec<Result<Claim, StoreError>> {
    let ask = |digests| async move {
        if done {
            Box::pin(store.claim_done_many(digests)).await
        } else {
            Box::pin(store.claim_many(digests)).await
        }
    };
    let Some(near) = near else {
        return ask(digests).await;
    };
    let (local, remote) = split_near(near, digests);
    let answers = if remote.is_empty() {
        Vec::new()
    } else {
        ask(&remote).await
    };
    if done {
        for (&digest, claim) in remote.iter().zip(&answers) {
            if claim == &Ok(Claim::New) {
                near.remember(digest);
            }
        }
    }
    merge_near(&local, answers)
}

/// Whether the near-table holds each digest, and the digests it does not hold, to ask the
/// store about.
fn split_near(near: &NearTable, digests: &[Digest]) -> (Vec<bool>, Vec<Digest>) {
    let local: Vec<bool> = digests.iter().map(|d| near.committed(*d)).collect();
    let remote = digests
        .iter()
        .zip(&local)
        .filter(|(_, &hit)| !hit)
        .map(|(d, _)| *d)
        .collect();
    (local, remote)
}

/// The answers in the order of the burst: a duplicate where the near-table held the digest,
/// else the store's next answer.
fn merge_near(
    local: &[bool],
    answers: Vec<Result<Claim, StoreError>>,
) -> Vec<Result<Claim, StoreError>> {
    let mut answers = answers.into_iter();
    local
        .iter()
        .map(|&hit| {
            if hit {
                Ok(Claim::Duplicate)
            } else {
                answers.next().unwrap_or_else(|| {
                    Err(StoreError::Protocol(
                        "a claim of a burst went unanswered".into(),
                    ))
                })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_backend_answers_like_the_table() {
        let backend = Backend::Memory(Table::with_slots(64, 8).unwrap().into());
        let d = Digest::from_u128(42);
        assert_eq!(backend.claim(d).await, Ok(Claim::New));
        assert_eq!(backend.claim(d).await, Ok(Claim::InFlight));
        assert_eq!(backend.commit(d).await, Ok(true));
        assert_eq!(backend.claim(d).await, Ok(Claim::Duplicate));
        assert_eq!(backend.erase(d).await, Ok(true));
        assert_eq!(backend.claim(d).await, Ok(Claim::New));
        assert_eq!(backend.kind(), "memory");
        assert!(backend.occupancy().unwrap() > 0.0);
    }

    #[tokio::test]
    async fn none_backend_keeps_nothing() {
        let backend = Backend::None(NoStore);
        let d = Digest::from_u128(7);
        assert_eq!(backend.claim(d).await, Ok(Claim::New));
        assert_eq!(backend.claim(d).await, Ok(Claim::New));
        assert_eq!(backend.geometry(), None);
    }
}
