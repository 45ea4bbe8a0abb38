//! Batches: operations grouped by server and by set, each server's sets read and written in
//! pipelines of compare-and-swap writes ([`MemcachedStore::run_ops`]), and the values this
//! store wrote last, kept so that its next operation on a set needs no read.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;

use super::conn::{self, Write, Written};
use super::set::{apply, encode, Op, Outcome, SetState};
use super::{is_connection_error, unavailable, MemcachedStore, Server};
use crate::dedup::Digest;
use crate::error::StoreError;

/// Sets per pipeline round trip in a batch. Bounded so that a huge batch never fills both
/// directions' socket buffers while we are still writing.
const MAX_PIPELINE_SETS: usize = 256;

/// The most sets whose last written value a store keeps (about 300 bytes each at 8 ways).
const KNOWN_SETS: usize = 16_384;

/// Keeps `value`, just written to `key` with the new CAS token `cas`; when [`KNOWN_SETS`] are
/// kept, all are forgotten first (removing one at a time from the front of a hash map makes
/// each removal scan the emptied front: slower than the reads it saves).
fn remember(sets: &mut HashMap<String, (Vec<u8>, u64)>, key: &str, value: Vec<u8>, cas: u64) {
    if let Some(kept) = sets.get_mut(key) {
        *kept = (value, cas);
        return;
    }
    if sets.len() >= KNOWN_SETS {
        sets.clear();
    }
    sets.insert(key.to_owned(), (value, cas));
}

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
        let inner = &*self.inner;
        // set -> (server, position in that server's list)
        let mut set_index: HashMap<u64, (usize, usize)> = HashMap::with_capacity(ops.len());
        let mut per_server: Vec<Vec<SetOps>> = vec![Vec::new(); inner.servers.len()];
        let mut server_of_op = Vec::with_capacity(ops.len());
        for (index, (_, digest)) in ops.iter().enumerate() {
            let set = inner.geometry.set_of(*digest);
            let (server, slot) = *set_index.entry(set).or_insert_with(|| {
                let key = self.key_of_set(set);
                let server = self.route(&key);
                per_server[server].push(SetOps {
                    key,
                    ops: Vec::new(),
                });
                (server, per_server[server].len() - 1)
            });
            per_server[server][slot].ops.push(index);
            server_of_op.push(server);
        }
        let results = join_all(per_server.iter().zip(&inner.servers).map(
            |(sets, server)| async move {
                if sets.is_empty() {
                    Ok(Vec::new())
                } else {
                    self.run_sets_on(server, sets, ops).await
                }
            },
        ))
        .await;
        let mut outcomes: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
        let mut failures: Vec<Option<StoreError>> = vec![None; inner.servers.len()];
        for (server, result) in results.into_iter().enumerate() {
            match result {
                Ok(answers) => {
                    for (index, outcome) in answers {
                        outcomes[index] = Some(Ok(outcome));
                    }
                }
                Err(err) => failures[server] = Some(err),
            }
        }
        outcomes
            .into_iter()
            .zip(server_of_op)
            .map(|(outcome, server)| {
                outcome.unwrap_or_else(|| {
                    Err(failures[server].clone().unwrap_or_else(|| {
                        StoreError::Protocol("an operation of a batch went unanswered".into())
                    }))
                })
            })
            .collect()
    }

    /// [`Self::run_ops`] for the sets that live on `server`; a connection error empties the
    /// server's pool and forgets every set's last written value.
    async fn run_sets_on(
        &self,
        server: &Server,
        sets: &[SetOps],
        ops: &[(Op, Digest)],
    ) -> Result<Vec<(usize, Outcome)>, StoreError> {
        let result = self.run_sets_pipelined(server, sets, ops).await;
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
        ops: &[(Op, Digest)],
    ) -> Result<Vec<(usize, Outcome)>, StoreError> {
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
        let mut answers = Vec::with_capacity(ops.len());
        let mut conn = self.pipe(server).await?;
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
                    to_read.iter().map(|&p| chunk[p].key.as_str()).collect();
                let reads = if pending_keys.is_empty() {
                    Vec::new()
                } else {
                    within(timeout, conn.get_many(&pending_keys), io_error).await?
                };
                let found = reads.iter().filter(|read| read.is_some()).count();
                note_absent(&inner.absent, reads.len() - found, found);
                let from_known = known.len();
                let reads: Vec<(usize, conn::Read)> = known
                    .into_iter()
                    .chain(to_read.into_iter().zip(reads))
                    .collect();
                let (planned, undecided) =
                    self.plan(chunk, ops, reads, from_known, &mut first_try, &mut answers);
                let writes: Vec<Write<'_>> = planned
                    .iter()
                    .map(|plan| Write {
                        key: &chunk[plan.set].key,
                        value: &plan.value,
                        cas: plan.cas,
                        quiet: plan.quiet,
                    })
                    .collect();
                let written = if writes.is_empty() {
                    Vec::new()
                } else {
                    within(timeout, conn.set_many(&writes), io_error).await?
                };
                pending = undecided;
                self.note_written(chunk, planned, written, &mut answers, &mut pending);
                if !pending.is_empty() {
                    tokio::task::yield_now().await;
                }
            }
        }
        conn.set_healthy(true);
        Ok(answers)
    }

    /// Takes the answers of the writes of `planned` that were stored (and keeps the values
    /// written, see `remember`) and puts the sets whose write lost a race in `pending`.
    fn note_written(
        &self,
        chunk: &[SetOps],
        planned: Vec<Planned>,
        written: Vec<Written>,
        answers: &mut Vec<(usize, Outcome)>,
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
                    answers.extend(outcomes);
                    match cas {
                        Some(cas) => remember(&mut sets, &chunk[p].key, value, cas),
                        None => drop(sets.remove(&chunk[p].key)),
                    }
                }
                Written::Conflict => {
                    inner.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    sets.remove(&chunk[p].key);
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
        // gets that one chance; a set decided again is read.
        let mut known = Vec::with_capacity(pending.len());
        let mut to_read = Vec::with_capacity(pending.len());
        let guess_absent = inner.absent.load(Ordering::Relaxed) > 0;
        {
            let sets = inner.known.lock().unwrap_or_else(|p| p.into_inner());
            for &p in pending {
                match sets.get(&chunk[p].key).filter(|_| first_try[p]) {
                    Some((value, cas)) => known.push((p, Some((value.clone(), *cas)))),
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
        chunk: &[SetOps],
        ops: &[(Op, Digest)],
        reads: Vec<(usize, conn::Read)>,
        from_known: usize,
        first_try: &mut [bool],
        answers: &mut Vec<(usize, Outcome)>,
    ) -> (Vec<Planned>, Vec<usize>) {
        let facts = self.lease_facts();
        let filling = self.inner.absent.load(Ordering::Relaxed) > 0;
        // For each pending set: its new value (if it changed), the CAS token of the
        // read, and the outcomes that the write would make true.
        let mut planned = Vec::with_capacity(reads.len());
        let mut undecided = Vec::new();
        for (i, (p, read)) in reads.into_iter().enumerate() {
            let cached = i < from_known;
            first_try[p] = false;
            let (mut entries, cas) = match read {
                Some((value, cas)) => (self.decode_counted(Some(&value)), Some(cas)),
                None => (SetState::empty(self.ways()), None),
            };
            let mut outcomes = Vec::with_capacity(chunk[p].ops.len());
            let mut changed = false;
            for &index in &chunk[p].ops {
                let (op, digest) = ops[index];
                let (outcome, did) = apply(&mut entries, op, digest, facts);
                changed |= did;
                outcomes.push((index, outcome));
            }
            if changed {
                // A write whose new token no operation of ours is waiting for (a commit,
                // unlike a claim, has no commit of its own to follow), on a table that is
                // still filling, where a set is seldom met again before this store forgets
                // it: sent quiet, which spares the server its answer. The set is then not
                // known: met again, it is read (or, guessed absent, written as new, which
                // fails, and then read).
                let quiet = filling
                    && chunk[p].ops.iter().all(|&index| {
                        matches!(ops[index].0, Op::ClaimDone | Op::Commit | Op::Erase)
                    });
                planned.push(Planned {
                    set: p,
                    value: encode(&entries, self.value_version()),
                    cas,
                    quiet,
                    outcomes,
                });
            } else if cached {
                // Nothing to write, so nothing verifies the value it was decided on.
                undecided.push(p);
            } else {
                answers.extend(outcomes);
            }
        }
        (planned, undecided)
    }
}

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
    /// The outcomes the write makes true: (operation index, outcome).
    outcomes: Vec<(usize, Outcome)>,
}

/// The operations of one batch that fall in one set.
#[derive(Clone)]
struct SetOps {
    /// The set's item key.
    key: String,
    /// Indices into the batch's operations, in order.
    ops: Vec<usize>,
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
