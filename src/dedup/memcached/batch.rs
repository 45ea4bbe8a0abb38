//! Batches: operations grouped by server and by set, each server's sets read and written in
//! pipelines of compare-and-swap writes ([`MemcachedStore::run_ops`]), and the values this
//! store wrote last, kept so that its next operation on a set needs no read.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;

use super::conn::{self, Read, Write, Written};
use super::set::{Op, Outcome};
use super::{is_connection_error, unavailable, MemcachedStore, Server};
use crate::dedup::Digest;
use crate::error::StoreError;
use crate::fold_hash::IdHasher;

/// Sets per pipeline round trip in a batch. Bounded so that a huge batch never fills both
/// directions' socket buffers while we are still writing.
const MAX_PIPELINE_SETS: usize = 256;

/// The most sets whose last written value a store keeps (about 300 bytes each at 8 ways).
const KNOWN_SETS: usize = 16_384;

/// The values this store wrote last, by set number, with their CAS tokens.
pub(super) type KnownSets = HashMap<u64, (Vec<u8>, u64), BuildSetHasher>;

/// Keeps `value`, just written to `set` with the new CAS token `cas`; when [`KNOWN_SETS`] are
/// kept, all are forgotten first (removing one at a time from the front of a hash map makes
/// each removal scan the emptied front: slower than the reads it saves).
fn remember(sets: &mut KnownSets, set: u64, value: Vec<u8>, cas: u64) {
    if sets.len() >= KNOWN_SETS && !sets.contains_key(&set) {
        sets.clear();
    }
    sets.insert(set, (value, cas));
}

/// Hashes set numbers: spread by the digests they come from, nobody picks them to collide.
pub(super) type BuildSetHasher = IdHasher;

/// Adds what one round learnt to `score`: `absent` sets found absent (or added), `present`
/// found existing. Bounded, so that the guess follows a table that fills up within a few
/// rounds.
fn note_absent(score: &std::sync::atomic::AtomicI64, absent: usize, present: usize) {
    const BOUND: i64 = 1024;
    let change = i64::try_from(absent).unwrap_or(BOUND) - i64::try_from(present).unwrap_or(BOUND);
    if change != 0 {
        // Relaxed: a hint, never a decision.
        let _ = score.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some((old + change).clamp(-BOUND, BOUND))
        });
    }
}

impl MemcachedStore {
    /// Applies `ops` in pipelines: grouped by server (all servers at once) and by set (a
    /// set's operations in their order, then one write). Returns each operation's outcome;
    /// an operation fails only with the server of its set.
    pub(super) async fn run_ops(&self, ops: &[(Op, Digest)]) -> Vec<Result<Outcome, StoreError>> {
        self.run_ops_reading(ops, &[]).await.0
    }

    /// [`Self::run_ops`], and reads the items `looks` (each a key and the index of the server
    /// it lives on, of this store or another table on the same servers) in the first round
    /// trip of their server's pipeline: no round trip of their own. Returns each operation's
    /// outcome and each look's read; both fail only with their server.
    pub(super) async fn run_ops_reading(
        &self,
        ops: &[(Op, Digest)],
        looks: &[(usize, &str)],
    ) -> Gathered {
        let inner = &*self.inner;
        let mut looks_of: Vec<Vec<&str>> = vec![Vec::new(); inner.servers.len()];
        for &(server, key) in looks {
            looks_of[server].push(key);
        }
        // set -> (server, position in that server's list)
        let mut set_index: HashMap<u64, (usize, usize), BuildSetHasher> =
            HashMap::with_capacity_and_hasher(ops.len(), BuildSetHasher::default());
        let mut per_server: Vec<Vec<SetOps>> = vec![Vec::new(); inner.servers.len()];
        let mut server_of_op = Vec::with_capacity(ops.len());
        // Every set's key, one after the other in one string, and each operation's set.
        let mut keys = String::with_capacity(ops.len() * (inner.namespace.len() + 12));
        let mut set_of_op = Vec::with_capacity(ops.len());
        for (_, digest) in ops {
            // The unit of a batch is an item (a set in format 1, several in format 2).
            let set = self.item_of(*digest);
            let (server, slot) = *set_index.entry(set).or_insert_with(|| {
                let start = keys.len();
                self.push_key_of_set(&mut keys, set);
                let server = self.route(&keys[start..]);
                per_server[server].push(SetOps {
                    set,
                    key: start..keys.len(),
                    ops: 0..0,
                });
                (server, per_server[server].len() - 1)
            });
            // Counts the set's operations for now.
            per_server[server][slot].ops.end += 1;
            server_of_op.push(server);
            set_of_op.push((server, slot));
        }
        // Each set's operations, in their order, as one range of `order`.
        let mut next = 0;
        for sets in &mut per_server {
            for set in sets {
                let count = set.ops.end;
                set.ops = next..next;
                next += count;
            }
        }
        let mut order = vec![0; ops.len()];
        for (index, &(server, slot)) in set_of_op.iter().enumerate() {
            let set = &mut per_server[server][slot];
            order[set.ops.end] = index;
            set.ops.end += 1;
        }
        let batch = Batch {
            keys: &keys,
            order: &order,
            ops,
        };
        let results = join_all(per_server.iter().zip(&inner.servers).zip(&looks_of).map(
            |((sets, server), looks)| async move {
                if sets.is_empty() && looks.is_empty() {
                    Ok((Vec::new(), Vec::new()))
                } else {
                    self.run_sets_on(server, sets, batch, looks).await
                }
            },
        ))
        .await;
        gather(results, ops.len(), server_of_op, looks)
    }

    /// [`Self::run_ops`] for the sets that live on `server`; a connection error empties the
    /// server's pool and forgets every set's last written value.
    async fn run_sets_on(
        &self,
        server: &Server,
        sets: &[SetOps],
        batch: Batch<'_>,
        looks: &[&str],
    ) -> Result<(Vec<(usize, Outcome)>, Vec<Read>), StoreError> {
        let result = self.run_sets_pipelined(server, sets, batch, looks).await;
        if result.as_ref().is_err_and(is_connection_error) {
            server.pipes.clear();
            // The server may have restarted (its CAS tokens start again from 1) or its sets
            // may move to another server.
            self.inner.forget_known();
        }
        self.note_health(server, &result);
        result
    }

    async fn run_sets_pipelined(
        &self,
        server: &Server,
        sets: &[SetOps],
        batch: Batch<'_>,
        looks: &[&str],
    ) -> Result<(Vec<(usize, Outcome)>, Vec<Read>), StoreError> {
        let inner = &*self.inner;
        let timeout = inner.config.timeout;
        // An answer we cannot parse (including memcached's error lines) is a protocol error;
        // anything else means the connection is gone.
        let io_error = |err: std::io::Error| match err.kind() {
            std::io::ErrorKind::InvalidData => {
                StoreError::Protocol(format!("{}: {err}", server.addr))
            }
            _ => unavailable(server, &err),
        };
        let mut answers = Vec::with_capacity(batch.ops.len());
        // The outcomes of a round's planned writes (see `Planned::outcomes`).
        let mut staged = Vec::new();
        let mut conn = self.pipe(server).await?;
        // The looks, until a round trip takes them, and their reads.
        let (mut lead, mut looked) = (looks, Vec::with_capacity(looks.len()));
        for chunk in sets.chunks(MAX_PIPELINE_SETS) {
            let mut pending: Vec<usize> = (0..chunk.len()).collect();
            let mut first_try = vec![true; chunk.len()];
            let mut rounds = 0;
            while !pending.is_empty() {
                let (known, to_read) = self.split_known(chunk, &pending, &first_try);
                if !to_read.is_empty() {
                    if rounds == inner.config.max_cas_retries {
                        conn.set_healthy(true);
                        return Err(StoreError::Contended { attempts: rounds });
                    }
                    rounds += 1;
                }
                let pending_keys: Vec<&str> =
                    to_read.iter().map(|&p| batch.key(&chunk[p])).collect();
                let reads = if pending_keys.is_empty() {
                    Vec::new()
                } else {
                    // The looks lead the first round trip.
                    let lead = std::mem::take(&mut lead);
                    let keys: Vec<&str> = lead.iter().chain(&pending_keys).copied().collect();
                    let mut reads = within(timeout, conn.get_many(&keys), io_error).await?;
                    looked.extend(reads.drain(..lead.len()));
                    reads
                };
                let found = reads.iter().filter(|read| read.is_some()).count();
                note_absent(&inner.absent, reads.len() - found, found);
                let from_known = known.len();
                let reads: Vec<(usize, conn::Read)> = known
                    .into_iter()
                    .chain(to_read.into_iter().zip(reads))
                    .collect();
                staged.clear();
                let (planned, undecided) = self.plan(
                    (chunk, batch),
                    reads,
                    from_known,
                    &mut first_try,
                    (&mut answers, &mut staged),
                );
                let writes: Vec<Write<'_>> = planned
                    .iter()
                    .map(|plan| Write {
                        key: batch.key(&chunk[plan.set]),
                        value: &plan.value,
                        cas: plan.cas,
                        quiet: plan.quiet,
                    })
                    .collect();
                let written = if writes.is_empty() {
                    Vec::new()
                } else {
                    let lead = std::mem::take(&mut lead);
                    let (reads, written) =
                        within(timeout, conn.read_and_set_many(lead, &writes), io_error).await?;
                    looked.extend(reads);
                    written
                };
                pending = undecided;
                self.note_written(
                    chunk,
                    planned,
                    written,
                    (&mut answers, &staged),
                    &mut pending,
                );
                if !pending.is_empty() {
                    tokio::task::yield_now().await;
                }
            }
        }
        if !lead.is_empty() {
            looked = within(timeout, conn.get_many(lead), io_error).await?;
        }
        conn.set_healthy(true);
        Ok((answers, looked))
    }

    /// Takes the answers of the writes of `planned` that were stored (and keeps the values
    /// written, see `remember`) and puts the sets whose write lost a race in `pending`.
    fn note_written(
        &self,
        chunk: &[SetOps],
        planned: Vec<Planned>,
        written: Vec<Written>,
        (answers, staged): (&mut Answers, &[(usize, Outcome)]),
        pending: &mut Vec<usize>,
    ) {
        let inner = &*self.inner;
        let (mut added, mut existed) = (0, 0);
        let mut sets = inner.known.lock().unwrap_or_else(|p| p.into_inner());
        for (plan, written) in planned.into_iter().zip(written) {
            let Planned {
                set: p,
                value,
                cas,
                outcomes,
                ..
            } = plan;
            if cas.is_none() {
                match written {
                    Written::Stored(_) => added += 1,
                    Written::Conflict => existed += 1,
                }
            }
            match written {
                Written::Stored(cas) => {
                    answers.extend_from_slice(&staged[outcomes]);
                    match cas {
                        Some(cas) => remember(&mut sets, chunk[p].set, value, cas),
                        None => drop(sets.remove(&chunk[p].set)),
                    }
                }
                Written::Conflict => {
                    inner.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    sets.remove(&chunk[p].set);
                    pending.push(p);
                }
            }
        }
        drop(sets);
        note_absent(&inner.absent, added, existed);
    }

    /// Sorts the pending sets of a round: those this store wrote last (or, while most sets
    /// are absent, does not know), to decide without a read, and those to read.
    fn split_known(
        &self,
        chunk: &[SetOps],
        pending: &[usize],
        first_try: &[bool],
    ) -> (Vec<(usize, conn::Read)>, Vec<usize>) {
        let inner = &*self.inner;
        // Sets this store wrote last are decided on the value it wrote, without a read:
        // the write's compare-and-swap with that value's token verifies it. Each set
        // gets that one chance; a set decided again is read. The value is taken out: the
        // write replaces it, and a set that is not written is read again anyway.
        let mut known = Vec::with_capacity(pending.len());
        let mut to_read = Vec::with_capacity(pending.len());
        let guess_absent = self.filling();
        {
            let mut sets = inner.known.lock().unwrap_or_else(|p| p.into_inner());
            for &p in pending {
                let kept = if first_try[p] {
                    sets.remove(&chunk[p].set)
                } else {
                    None
                };
                match kept {
                    Some(kept) => known.push((p, Some(kept))),
                    // Written as new (`ME`), which fails if the set exists after all.
                    None if first_try[p] && guess_absent => known.push((p, None)),
                    None => to_read.push(p),
                }
            }
        }
        (known, to_read)
    }

    /// Applies each read set's operations: the sets that changed, to write; the sets decided
    /// on a kept value that need no write, to decide again on a fresh read (returned second);
    /// the answers of the others go to `answers`. The first `from_known` of `reads` were not
    /// read.
    fn plan(
        &self,
        (chunk, batch): (&[SetOps], Batch<'_>),
        reads: Vec<(usize, conn::Read)>,
        from_known: usize,
        first_try: &mut [bool],
        (answers, staged): (&mut Answers, &mut Answers),
    ) -> (Vec<Planned>, Vec<usize>) {
        let facts = self.lease_facts();
        let filling = self.filling();
        // For each pending set: its new value (if it changed), the CAS token of the
        // read, and the outcomes that the write would make true.
        let mut planned = Vec::with_capacity(reads.len());
        let mut undecided = Vec::new();
        let mut reads = reads.into_iter();
        for ahead in reads.as_slice().iter().take(PREFETCH_AHEAD) {
            prefetch(ahead);
        }
        let mut i = 0;
        while let Some((p, read)) = reads.next() {
            if let Some(ahead) = reads.as_slice().get(PREFETCH_AHEAD - 1) {
                prefetch(ahead);
            }
            let cached = i < from_known;
            i += 1;
            first_try[p] = false;
            // The value read is changed in its own buffer (in the compact layout).
            let item = chunk[p].set;
            let (value, cas) = read.map_or((None, None), |(value, cas)| (Some(value), Some(cas)));
            // A kept value is one this store wrote: as it writes them.
            let mut entries = if cached {
                self.decode_written(value, item)
            } else {
                self.decode_counted(value, item)
            };
            let set_ops = batch.ops_of(&chunk[p]);
            let first = staged.len();
            let mut changed = false;
            for &index in set_ops {
                let (op, digest) = batch.ops[index];
                let (outcome, did) = self.apply(&mut entries, op, digest, facts);
                changed |= did;
                staged.push((index, outcome));
            }
            let outcomes = first..staged.len();
            if changed {
                // A write whose new token no operation of ours is waiting for (a commit,
                // unlike a claim, has no commit of its own to follow), on a table that is
                // still filling, where a set is seldom met again before this store forgets
                // it: sent quiet, which spares the server its answer. The set is then not
                // known: met again, it is read (or, guessed absent, written as new, which
                // fails, and then read).
                let quiet = filling
                    && set_ops.iter().all(|&index| {
                        matches!(batch.ops[index].0, Op::ClaimDone | Op::Commit | Op::Erase)
                    });
                planned.push(Planned {
                    set: p,
                    value: self.encode(entries),
                    cas,
                    quiet,
                    outcomes,
                });
            } else if cached {
                // Nothing to write, so nothing verifies the value it was decided on.
                undecided.push(p);
            } else {
                answers.extend(staged.drain(outcomes));
            }
        }
        (planned, undecided)
    }
}

/// How many values ahead of the one it decides [`MemcachedStore::plan`] has the processor
/// load: most values are kept ones, written a whole batch earlier and out of cache by now,
/// and each costs a wait for memory at its header, its set and its records otherwise.
const PREFETCH_AHEAD: usize = 4;

/// Asks the processor to start loading the value `read` into cache, all of it (it is read,
/// changed and copied out whole).
fn prefetch((_, read): &(usize, conn::Read)) {
    let Some((value, _)) = read else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    for line in value.chunks(64) {
        // SAFETY: a prefetch is a hint: it never faults and changes no program state; the
        // pointer is in bounds of `value` anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// A batch's outcome: each operation's, and each look's read.
type Gathered = (
    Vec<Result<Outcome, StoreError>>,
    Vec<Result<Read, StoreError>>,
);

/// Each server's answers, and its reads of the looks, or its error.
type ServerResult = Result<(Vec<(usize, Outcome)>, Vec<Read>), StoreError>;

/// Each operation's outcome (`server_of_op` gives each one's server) and each look's read,
/// from the servers' `results`: what a server that failed leaves unanswered takes its error.
fn gather(
    results: Vec<ServerResult>,
    ops: usize,
    server_of_op: Vec<usize>,
    looks: &[(usize, &str)],
) -> Gathered {
    let mut outcomes: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops];
    let mut failures: Vec<Option<StoreError>> = vec![None; results.len()];
    let mut reads_of: Vec<std::vec::IntoIter<Read>> = Vec::with_capacity(failures.len());
    for (server, result) in results.into_iter().enumerate() {
        match result {
            Ok((answers, reads)) => {
                for (index, outcome) in answers {
                    outcomes[index] = Some(Ok(outcome));
                }
                reads_of.push(reads.into_iter());
            }
            Err(err) => {
                failures[server] = Some(err);
                reads_of.push(Vec::new().into_iter());
            }
        }
    }
    // Each server's reads, in the order of its looks.
    let reads = looks
        .iter()
        .map(|&(server, _)| match &failures[server] {
            Some(err) => Err(err.clone()),
            None => reads_of[server]
                .next()
                .ok_or_else(|| StoreError::Protocol("a read of a batch went unanswered".into())),
        })
        .collect();
    let outcomes = outcomes
        .into_iter()
        .zip(server_of_op)
        .map(|(outcome, server)| {
            outcome.unwrap_or_else(|| {
                Err(failures[server].clone().unwrap_or_else(|| {
                    StoreError::Protocol("an operation of a batch went unanswered".into())
                }))
            })
        })
        .collect();
    (outcomes, reads)
}

/// Operations' outcomes: (index in the batch, outcome).
type Answers = Vec<(usize, Outcome)>;

/// A set's planned write.
struct Planned {
    /// The set's index in its chunk.
    set: usize,
    /// The set's new value.
    value: Vec<u8>,
    /// The CAS token of the value it was decided on (`None`: absent).
    cas: Option<u64>,
    /// Whether the write is sent quiet (see [`Write::quiet`]).
    quiet: bool,
    /// The outcomes the write makes true, (operation index, outcome), as a range of the
    /// round's staged outcomes.
    outcomes: Range<usize>,
}

/// The operations of one batch that fall in one set.
#[derive(Clone)]
struct SetOps {
    /// The set's number.
    set: u64,
    /// The set's item key, as a range of [`Batch::keys`].
    key: Range<usize>,
    /// The set's operations, as a range of [`Batch::order`].
    ops: Range<usize>,
}

/// One batch's operations and what its sets point into: one string and one list for all of
/// them, instead of a string and a list per set.
#[derive(Clone, Copy)]
struct Batch<'a> {
    /// Every set's item key, one after the other.
    keys: &'a str,
    /// Indices into `ops`, each set's in their order, one set after the other.
    order: &'a [usize],
    ops: &'a [(Op, Digest)],
}

impl<'a> Batch<'a> {
    fn key(&self, set: &SetOps) -> &'a str {
        &self.keys[set.key.clone()]
    }

    /// The indices into `ops` of the operations on `set`, in their order.
    fn ops_of(&self, set: &SetOps) -> &'a [usize] {
        &self.order[set.ops.clone()]
    }
}

/// One network step within `timeout`, its I/O error made a [`StoreError`] by `io_error`.
async fn within<T>(
    timeout: Duration,
    step: impl std::future::Future<Output = std::io::Result<T>>,
    io_error: impl Fn(std::io::Error) -> StoreError,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, step)
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(io_error)
}
