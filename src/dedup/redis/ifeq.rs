//! A burst decided in the client and written with the server's own compare-and-set, `SET key
//! new IFEQ old` (Valkey 8.1 or later), instead of the set script: on such a server, claims,
//! commits, erases and renews are plain pipelined commands, and no script runs on the hot
//! path.
//!
//! It is the Memcached store's compare-and-swap with the whole set value as the token. Per
//! master, one pipeline reads the sets of a burst this store does not know (`GET`; a claim's
//! set, while the table fills, `SET key <the set of its one new entry> NX GET`, which creates
//! a set that held nothing and is then decided), the store decides each set's operations in
//! their order as the script would (`value`: the same bytes), and one pipeline writes each set
//! that changed: `SET key new IFEQ old`, where `old` is the value it was decided on, or `SET
//! key new NX` where the key held nothing (`KEEPTTL`: a write keeps whatever expiry a key has,
//! as the script's `SETRANGE` does). A write whose compare fails (another client changed the
//! set since) writes nothing: the set is read again and decided again, at most [`MAX_ROUNDS`]
//! times, and then left to the script, which always decides. The value this store wrote last
//! is kept for up to [`KNOWN_SETS`] sets (all forgotten when full, or on a connection error),
//! so the commit after its own claim (an erase, a renew) is one conditional write with no
//! read; a decision on a kept value that writes nothing is not checked by any write, so it is
//! made again on a fresh read. A claim always reads its set: in a fleet, the set a claim meets
//! was most often written last by another consumer, and a kept value out of date costs a
//! write that fails and then the read anyway, more than the read alone (and a copy, found in
//! flight or done, writes nothing, so it needs the read too). The path's costs are in
//! `docs/benchmarks.md`, "Valkey 8.1: claims and commits with `SET … IFEQ`".
//!
//! Why it is as safe as the script: a value holds the whole state of its set (every entry, its
//! owner and times, the cursor), and every decision is a function of that value, the time and
//! the owner. A conditional write succeeds only where the key still holds the very bytes the
//! decision was made on, so the decision and its write take effect together, as one script run
//! would, at the instant of the write; were a set changed and changed back to the same bytes
//! meanwhile, the decision would still be the one its state gives. A decision that writes
//! nothing rests on a read, which is atomic. Clients of the script and of this path keep the
//! same value format and the same rules, so a fleet of both shares one table.
//!
//! Whether the servers have `IFEQ` is found when the store connects (and, for a store opened
//! lazily, before its first burst): `COMMAND DOCS SET` of each master names an `IFEQ` argument
//! (Valkey 8.1 or later). Redis 7.0 and Valkey 8.0 name none, and keep the script; asking
//! costs no error reply, which an operator watching `errorstat_*` would see. A write refused
//! with a syntax error later (a failover to a replica of an older version) turns this path
//! off.
//!
//! A command answered with an error (`MOVED` or `ASK` in a cluster whose slots moved, a key of
//! another type), or a pipeline that failed (a node that failed) while the operation still
//! has time, leaves its sets to the script, which follows redirections, waits out a failover
//! and reports a key it cannot read. A write that reached the server before the failure is
//! then found by the script: a claim in flight by this owner (its message waits out the
//! lease), a commit done, an erase gone.

mod round;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use futures::future::join_all;
use tokio::time::Instant;

use super::layout::Layout;
use super::recycle;
use super::resp::{Replies, Reply, Span};
use super::value::Facts;
use super::{Op, RedisStore};
use crate::dedup::shared::{now_ms, value_version};
use crate::dedup::Digest;
use crate::error::StoreError;
use crate::fold_hash::IdHasher;

/// Reads and writes of one set before it is left to the script.
const MAX_ROUNDS: usize = 4;

/// The same in the compact layout, whose keys are fewer (a key holds 8 sets) and so met by
/// more writers at once, and whose keys left over are each read and written alone (`items`),
/// which costs more than a round of a pipeline.
const MAX_ROUNDS_COMPACT: usize = 8;

/// The most sets whose last written value a store keeps (up to 275 bytes each at 8 ways).
const KNOWN_SETS: usize = 16_384;

/// How long after a probe that got no answer the next one may be tried.
const PROBE_PAUSE_MS: u64 = 1_000;

/// The answer of a probe not yet made, or that got no answer.
const UNKNOWN: u8 = 0;
/// Every master has `IFEQ`.
const SUPPORTED: u8 = 1;
/// A master has not.
const REFUSED: u8 = 2;

/// What a store knows of this path: whether its servers have `IFEQ`, and the sets it wrote.
#[derive(Debug, Default)]
pub(super) struct Ifeq {
    /// [`UNKNOWN`], [`SUPPORTED`] or [`REFUSED`].
    support: AtomicU8,
    /// Every operation through the script (`RedisStore::force_script`).
    forced_off: AtomicBool,
    /// The wall-clock millisecond before which no probe is tried again.
    probe_after_ms: AtomicU64,
    /// The value this store wrote last to each set, by set number. A `std` mutex: held only
    /// to take or put a value, never across an `.await`.
    known: Mutex<HashMap<u64, Vec<u8>, IdHasher>>,
    /// Writes whose compare failed: another client had changed the set.
    conflicts: AtomicU64,
    /// The last answer the log said ([`SUPPORTED`] or [`REFUSED`]), or [`UNKNOWN`].
    said: AtomicU8,
}

impl Ifeq {
    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>, IdHasher>> {
        // A panic while the lock was held leaves whole values: each is checked by its write.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `value`, just written to `set`; when [`KNOWN_SETS`] are kept, all are forgotten
    /// first. A value in a buffer much larger than itself (one used again, or grown by an
    /// edit) is kept in one of its size: the kept values are most of the store's memory.
    pub(super) fn remember(&self, set: u64, mut value: Vec<u8>) {
        if value.capacity() > value.len() + value.len() / 4 {
            value.shrink_to_fit();
        }
        let mut known = self.known();
        if known.len() >= KNOWN_SETS && !known.contains_key(&set) {
            known.clear();
        }
        if let Some(replaced) = known.insert(set, value) {
            recycle::give(replaced);
        }
    }

    /// Takes what `other`, a store of the same servers, learnt: whether they have `IFEQ`,
    /// whether it is forced off, and what the log said of it (so that it is not said again).
    /// The values it wrote are its own table's, and are not taken.
    pub(super) fn inherit(&self, other: &Ifeq) {
        let support = other.support.load(Ordering::Relaxed);
        if support != UNKNOWN {
            self.support.store(support, Ordering::Relaxed);
        }
        if other.forced_off.load(Ordering::Relaxed) {
            self.forced_off.store(true, Ordering::Relaxed);
        }
        self.said
            .store(other.said.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Forgets every kept value (the server may have restarted, or another path written).
    pub(super) fn forget_all(&self) {
        self.known().clear();
    }

    pub(super) fn force_off(&self) {
        self.forced_off.store(true, Ordering::Relaxed);
    }

    /// Whether bursts go this way now.
    pub(super) fn on(&self) -> bool {
        self.support.load(Ordering::Relaxed) == SUPPORTED
            && !self.forced_off.load(Ordering::Relaxed)
    }

    /// How many writes found their set changed since it was read, and read it again.
    pub(super) fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// Counts a write that found its key changed since it was read.
    pub(super) fn conflicted(&self) {
        // A statistic: nothing else depends on it.
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }
}

/// One key of a run (a set's, or in the compact layout an item's): its operations and what
/// it holds.
struct SetWork {
    /// The key's number: its set's, or in the compact layout its item's.
    set: u64,
    key: String,
    /// Its operations, as indices into the run, in order.
    ops: Vec<usize>,
    /// How many of `ops` are decided for good (the first, by a `SET … NX GET` that created
    /// the set).
    settled: usize,
    /// The value its operations are decided on: what the key held (`None`: nothing).
    read: Option<Held>,
    /// Whether `read` is the value this store wrote last, not a read.
    kept: bool,
    /// Whether `read` is a value exactly as this store writes it (kept, or checked when read),
    /// decided on without a second check.
    as_written: bool,
    /// Left to the script.
    to_script: bool,
}

impl SetWork {
    /// The value its operations are decided on (see [`SetWork::read`]), a value read lying in
    /// `replies`, those of its round's reads.
    fn value<'a>(&'a self, replies: &'a Replies) -> Option<&'a [u8]> {
        match &self.read {
            None => None,
            Some(Held::Own(value)) => Some(value),
            Some(Held::Read(span)) => Some(replies.bulk(*span)),
        }
    }

    /// Sets the value to decide on, giving a buffer of the one it replaces back.
    fn hold(&mut self, read: Option<Held>) {
        if let Some(Held::Own(replaced)) = std::mem::replace(&mut self.read, read) {
            recycle::give(replaced);
        }
    }
}

/// A value a key's operations are decided on.
enum Held {
    /// A value of this store's own: the one it wrote last, or the set its `SET … NX GET`
    /// created.
    Own(Vec<u8>),
    /// A value read: where it lies in the replies of its round's reads, which the round keeps
    /// until its writes are sent (they send it again, as `IFEQ`'s old value), so that it is
    /// never copied out of them.
    Read(Span),
}

/// A run's answers: per digest, the script's code, an error, or `None` for the script.
type Answers = Vec<Option<Result<i64, StoreError>>>;

impl RedisStore {
    /// Whether this burst goes this way: the servers answer `SET … IFEQ`. A store that has
    /// not learnt it yet (opened without its servers) probes them first, at most once a
    /// second while they do not answer.
    pub(super) async fn ifeq_on(&self) -> bool {
        let ifeq = &self.inner.ifeq;
        if ifeq.forced_off.load(Ordering::Relaxed) {
            return false;
        }
        if ifeq.support.load(Ordering::Relaxed) == UNKNOWN
            && now_ms() >= ifeq.probe_after_ms.load(Ordering::Relaxed)
        {
            self.probe_ifeq().await;
        }
        ifeq.on()
    }

    /// Asks the servers whether they have `SET … IFEQ` and records the answer (see the
    /// module docs): unknown while one does not answer.
    pub(super) async fn probe_ifeq(&self) {
        let ifeq = &self.inner.ifeq;
        let support = match self.inner.link.has_set_ifeq().await {
            Ok(true) => SUPPORTED,
            Ok(false) => REFUSED,
            Err(_) => {
                let after = now_ms().saturating_add(PROBE_PAUSE_MS);
                ifeq.probe_after_ms.store(after, Ordering::Relaxed);
                UNKNOWN
            }
        };
        ifeq.support.store(support, Ordering::Relaxed);
        // Said once at connect, and again only if a failover brings a server that answers
        // otherwise; a probe without an answer (an outage) says nothing.
        if support != UNKNOWN && ifeq.said.swap(support, Ordering::Relaxed) != support {
            match support {
                SUPPORTED => tracing::info!(
                    "The Redis store writes each set with SET … IFEQ: its servers have it."
                ),
                REFUSED => tracing::info!(
                    "The Redis store writes through its script: a server has no SET … IFEQ \
                     (Valkey 8.1 and later have it)."
                ),
                _ => {}
            }
        }
    }

    /// Runs `op` on each digest this way (see the module docs): the answers in the order of
    /// `digests`, as the script answers them, `None` for a digest left to the script.
    pub(super) async fn ifeq_many(&self, op: Op, digests: &[Digest]) -> Answers {
        let inner = &*self.inner;
        let runs = self.runs(digests.len(), |i| digests[i]);
        let facts = self.facts(now_ms());
        let deadline = inner.link.deadline();
        let decided = join_all(runs.iter().map(|run| {
            let run: Vec<Digest> = run.iter().map(|&i| digests[i]).collect();
            async move { self.ifeq_run(op, &run, &facts, deadline).await }
        }))
        .await;
        let mut answers: Answers = vec![None; digests.len()];
        for (run, decided) in runs.iter().zip(decided) {
            for (&i, answer) in run.iter().zip(decided) {
                answers[i] = answer;
            }
        }
        answers
    }

    /// What a decision made at `now` needs to know.
    pub(super) fn facts(&self, now: u64) -> Facts {
        let config = &self.inner.config;
        Facts {
            now_ms: now,
            lease_until_ms: now.saturating_add(self.lease_ms()),
            owner: self.inner.owner,
            max_age_ms: config
                .max_age
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            // A geometry has at most 8 ways.
            ways: u8::try_from(self.inner.geometry.ways()).unwrap_or(u8::MAX),
            version: value_version(config.max_age),
        }
    }

    /// One run (digests whose sets one master serves): reads, decisions and conditional
    /// writes, round after round (`round`), until every set is written or decided, or left to
    /// the script.
    async fn ifeq_run(&self, op: Op, run: &[Digest], facts: &Facts, deadline: Instant) -> Answers {
        let mut sets = self.sets_of(run);
        let mut answers: Answers = vec![None; run.len()];
        let mut pending: Vec<usize> = (0..sets.len()).collect();
        let rounds = match self.inner.layout {
            Layout::Sets => MAX_ROUNDS,
            Layout::Items { .. } => MAX_ROUNDS_COMPACT,
        };
        for round in 0..rounds {
            if pending.is_empty() {
                break;
            }
            let read = self
                .read_sets(
                    (op, run),
                    (&mut sets, &mut pending),
                    (round, deadline),
                    (facts, &mut answers),
                )
                .await;
            // The replies of the round's reads, which its values read lie in.
            let replies = match read {
                Ok(replies) => replies,
                Err(error) => {
                    return self.pipeline_failed(error, deadline, (&sets, &pending), answers);
                }
            };
            let writes = self.decide(
                (op, run),
                (&mut sets, &mut pending),
                (facts, &replies),
                &mut answers,
            );
            let written = self
                .write_sets(
                    (&mut sets, &mut pending),
                    (writes, &replies),
                    deadline,
                    &mut answers,
                )
                .await;
            if let Err(error) = written {
                return self.pipeline_failed(error, deadline, (&sets, &pending), answers);
            }
        }
        // Sets still changing under this store after every round are the script's.
        for mut work in sets {
            work.hold(None);
        }
        answers
    }

    /// The keys of `run`'s digests (a set's, or in the compact layout an item's of several
    /// sets) in order of first appearance, each with its operations.
    fn sets_of(&self, run: &[Digest]) -> Vec<SetWork> {
        let mut sets: Vec<SetWork> = Vec::new();
        let mut index: HashMap<u64, usize, IdHasher> = HashMap::default();
        let layout = self.inner.layout;
        for (i, digest) in run.iter().enumerate() {
            let set = layout.key_of(self.inner.geometry.set_of(*digest));
            let at = *index.entry(set).or_insert_with(|| {
                sets.push(SetWork {
                    set,
                    key: self.key_of_set(set),
                    ops: Vec::new(),
                    settled: 0,
                    read: None,
                    kept: false,
                    as_written: false,
                    to_script: false,
                });
                sets.len() - 1
            });
            sets[at].ops.push(i);
        }
        sets
    }
}

/// Whether `reply` is a syntax error: the answer of a server without `IFEQ`.
pub(super) fn is_syntax_error(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(error) if error.contains("syntax error"))
}
