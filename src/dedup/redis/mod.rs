//! The Redis-backed table: one de-duplication memory shared by many consumers, on one Redis
//! (or Valkey) server or spread over a Redis Cluster.
//!
//! [`RedisStore`] keeps the Memcached store's table: the same [`Geometry`], the same
//! digest-to-set mapping, replacement order, leases, owners and `max_age` (see
//! [`MemcachedStore`](crate::MemcachedStore)), in one of two layouts (`layout`), named by the
//! key format in the namespace `<prefix>:v<format>:<sets>x<ways>`:
//!
//! - **The compact layout** (key format 3, new tables'): Memcached's compact items
//!   ([`crate::dedup::compact`]) in Redis keys, `<namespace>g<sets a key>:<n>`, 64 slots a
//!   key (8 sets of 8 ways), 8-byte entries and a lease record only while an entry is in
//!   flight. Every operation is decided in the client and the key written back whole by a
//!   compare-and-set: `SET key new IFEQ old` where the servers have it (Valkey 8.1 or later),
//!   else an `EVALSHA` of a compare-and-set script (`cas.lua`), pipelined the same way
//!   (`ifeq`); a key the pipelines leave is read and written on its own through the script
//!   (`items`). A committed entry keeps no owner, so it is final (an erase answers `false`).
//! - **A key per set** (key format 2, which a table moves from: read and written as the
//!   previous generation until it retires, see [`crate::dedup::generational`]): a set is
//!   always `3 + 34 × ways` bytes, the entry of slot `i` at byte `3 + 34 i`, an empty slot all
//!   zeros and an erased one marked by a digest field of 0xFF bytes (`set.lua` has the
//!   layout), so that the script checks a stored set by its length and header alone and
//!   writes only the bytes an operation changes (`SETRANGE`), never a whole new value.
//!
//! Every key may live on any slot, so in a cluster the keys spread over all masters. The
//! rest of these docs, but where they name the compact layout, are about a key per set.
//!
//! A claim answers the slot of its digest's entry, and the store keeps it while the claim is
//! in flight (`hints`): the digest's erase or renew then reads only that entry (`GETRANGE` of
//! 34 bytes) instead of the whole set, and the script reads the whole set only when the entry
//! is no longer the digest's (pushed out, erased, a server restarted empty). Its commit reads
//! that entry and writes it whole with two plain commands, without the script (`commit`):
//! the entry written names only its own digest, delivered, so a claim that takes the slot in
//! between is forgotten (a possible duplicate), never made one.
//!
//! On a server with its own compare-and-set, `SET key new IFEQ old` (Valkey 8.1 or later),
//! none of that runs: the store reads the sets of a burst it does not keep, decides every
//! operation itself as the script would (`value`: the same bytes, so clients of both paths
//! share one table) and writes each set that changed whole, only if it still holds the value
//! decided on (`ifeq`). Whether the servers have it is found when the store connects
//! ([`RedisStore::uses_ifeq`]), never configured; Redis 7.0 and Valkey 8.0 keep the script.
//!
//! # Atomicity
//!
//! Each claim, erase and renew (and a commit without a hint, or whose entry the commit's
//! read did not find as its claim left it) runs in an `EVALSHA` of a Lua script
//! (`set.lua`) that reads the sets, decides and writes them back; Redis runs a script to its
//! end before any other command, so two claims of one digest can never both see it absent. One
//! run decides many digests of one operation in order (a digest given twice is `New` once,
//! then `InFlight`), and reads every set before it writes any other. A claim reads its set
//! with `SET … NX GET` (Redis 7.0 or later), which writes the set of its one new entry when the
//! key holds nothing: one call instead of a read and a write. A run that fails (a key that is
//! not a set, say) deletes the sets it so created before it answers, so it writes nothing. The
//! script is loaded on every node when the store connects, and loaded again by the client when
//! a node answers `NOSCRIPT` (a restarted server, a promoted replica that missed it). With
//! `IFEQ`, each set's decision takes effect with its conditional write, which the server makes
//! only where the key holds the very value decided on; a write that finds the set changed
//! writes nothing, and the set is read and decided again (see `ifeq`).
//!
//! # Round trips
//!
//! A burst ([`Store::claim_many`], `commit_many`, `erase_many`) on a standalone server is one
//! script run per 256 digests (`MAX_RUN`): one command for the client to write and parse, and
//! one for the server to dispatch, instead of one per digest. In a cluster, a run holds the
//! digests whose sets have one master in the slot map: it declares the first set's key alone,
//! which routes it, and reaches the others as a script without flags may, any key its node
//! serves (the keys declared by one command must share a slot, and the sets of a burst almost
//! never do). A run whose node refuses it (the slot map was out of date, or a slot is being
//! migrated) wrote nothing, and is sent again as one run per set, each following `MOVED` and
//! `ASK`. So a burst costs each master one script run, as on a standalone server, not one per
//! digest. While the table fills, a burst of claims is first one pipeline of `SET … NX GET`
//! per master (`create`), and only the claims of sets that exist go to a script run; a burst
//! of commits is, per master, a pipeline of reads and then one of writes (`commit`). With
//! `IFEQ`, a burst is per master one pipeline of reads (none for the sets this store wrote
//! last) and one of conditional writes. Connections are multiplexed (see `conn`):
//! concurrent runs are written together while earlier ones are on the wire, and their answers
//! read back in order, a pipeline per node without a queue of our own.
//!
//! # Errors, time limits and failover
//!
//! Each script run (connecting included) is bounded by [`RedisConfig::timeout`]. A refused
//! connection, a timeout, `CLUSTERDOWN` or any error reply is a [`StoreError`], never a
//! `Duplicate`, and the caller's `on_store_error` decides. An answer that means a setting is
//! wrong (a password refused or missing, a user without the rights, an address that is not
//! Redis's) is a [`StoreError::Refused`] naming the setting (see `refusal`): the sidecar does
//! not start with it, and logs it when it appears while running. After a master fails, its
//! slots are answered again once a replica is promoted; operations in between fail. Redis
//! replicates asynchronously, so writes acknowledged by a master just before it died may be
//! missing on the promoted replica: their digests are forgotten once (a redelivery passes
//! again), never a message lost. The same goes for a server restarted without persistence.
//!
//! # The fleet's rate
//!
//! Consumers of one table add their distinct counts to counters beside it (`fleet`, with
//! `fleet.lua`), as Memcached's do, so each reports the fleet's rate, not its own share.
//!
//! # Memory
//!
//! The keys have no expiry (the fleet's counters do): give Redis `maxmemory` with
//! `maxmemory-policy allkeys-lru` to let it remove the keys of namespaces nobody uses. An
//! expiry an operator gives a key is kept by every write of every path (`SETRANGE`, and
//! `SET … KEEPTTL` where a whole value is written, the compare-and-set script's included).
//! `nsq-dedupe size` reports the memory of a full table in the compact layout
//! ([`crate::sizing::redis_bytes_estimate`]).

mod commit;
mod config;
mod conn;
mod create;
mod entry;
mod fleet;
mod generation;
mod hints;
mod ifeq;
mod items;
mod layout;
mod recycle;
mod refusal;
mod resp;
mod script;
mod slots;
mod value;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use self::conn::Link;
use self::hints::Hints;
use self::layout::{Layout, ITEMS_FORMAT};
use self::script::Target;
use self::slots::key_slot;
use crate::dedup::shared::random_owner;
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;
pub use config::{RedisConfig, RedisPassword};

/// The script of every operation on a table of a key per set.
const SET_SCRIPT: &str = include_str!("set.lua");

/// The compare-and-set of the compact layout, for servers without `SET … IFEQ`.
const CAS_SCRIPT: &str = include_str!("cas.lua");

/// What one operation does to the entry of its digest, as the script's first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Claim,
    /// A claim whose new entry is written done (`Store::claim_done_many`).
    ClaimDone,
    Commit,
    Erase,
    Renew,
}

impl Op {
    /// The operation as the compact layout's model names it.
    fn compact(self) -> crate::dedup::compact::Op {
        use crate::dedup::compact::Op as Compact;
        match self {
            Op::Claim => Compact::Claim,
            Op::ClaimDone => Compact::ClaimDone,
            Op::Commit => Compact::Commit,
            Op::Erase => Compact::Erase,
            Op::Renew => Compact::Renew,
        }
    }

    fn code(self) -> &'static str {
        match self {
            Op::Claim => "c",
            Op::ClaimDone => "d",
            Op::Commit => "m",
            Op::Erase => "e",
            Op::Renew => "r",
        }
    }
}

/// A set-associative de-duplication table kept in Redis and shared by every process that uses
/// the same servers, namespace and geometry.
///
/// Cloning is cheap and shares the connection and the owner id: clones are one owner.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    geometry: Geometry,
    /// How the table's sets are kept in keys: its key format.
    layout: Layout,
    /// `<prefix>:v<format>:<sets>x<ways>`, and `g<sets a key>` in the compact layout.
    namespace: String,
    owner: u64,
    link: Link,
    /// The script of the layout: `set.lua` for a key per set, the compare-and-set `cas.lua`
    /// for the compact layout.
    script: redis::Script,
    /// The script of the fleet's counters (`fleet.rs`), loaded on its first use.
    fleet_script: redis::Script,
    /// Values that could not be decoded and were treated as empty.
    unreadable: AtomicU64,
    /// The slots of this store's in-flight claims, for their commits, erases and renews.
    hints: Hints,
    /// Whether claims go first as plain `SET … NX GET`s (`create`).
    filling: create::Filling,
    /// Whether the servers have `SET … IFEQ`, and the sets written that way (`ifeq`).
    ifeq: ifeq::Ifeq,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.inner.namespace)
            .field("servers", &self.inner.link.addr)
            .field("owner", &format_args!("{:016x}", self.inner.owner))
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds a store for a table of shape `geometry` in the compact layout (key format 3),
    /// connects, loads its script (on every node of a cluster), and asks whether the servers
    /// have `SET … IFEQ` (see [`RedisStore::uses_ifeq`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`; [`StoreError::Unavailable`] or
    /// [`StoreError::Timeout`] when the servers do not answer.
    pub async fn connect(config: RedisConfig, geometry: Geometry) -> Result<Self, StoreError> {
        let store = Self::new_lazy(config, geometry)?;
        store.load_script().await?;
        store.probe_ifeq().await;
        Ok(store)
    }

    /// Builds a store without contacting any server; the connection opens on first use.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`.
    pub fn new_lazy(config: RedisConfig, geometry: Geometry) -> Result<Self, StoreError> {
        Self::new_lazy_in(config, geometry, ITEMS_FORMAT)
    }

    /// [`RedisStore::connect`] for a table of key format `format`: 2, a key per set, or 3, the
    /// compact layout (see `layout`).
    ///
    /// # Errors
    ///
    /// As [`RedisStore::connect`], and [`StoreError::Protocol`] for a key format this
    /// version does not read.
    #[doc(hidden)]
    pub async fn connect_in(
        config: RedisConfig,
        geometry: Geometry,
        format: u8,
    ) -> Result<Self, StoreError> {
        let store = Self::new_lazy_in(config, geometry, format)?;
        store.load_script().await?;
        store.probe_ifeq().await;
        Ok(store)
    }

    /// [`RedisStore::new_lazy`] for a table of key format `format`.
    fn new_lazy_in(
        mut config: RedisConfig,
        geometry: Geometry,
        format: u8,
    ) -> Result<Self, StoreError> {
        config.take_url_passwords()?;
        config.validate()?;
        let layout = Layout::of(format, geometry.ways()).ok_or_else(|| {
            StoreError::Protocol(format!(
                "a Redis table of key format {format}, which this version does not read"
            ))
        })?;
        let (sets, ways) = (geometry.sets(), geometry.ways());
        let namespace = match layout {
            Layout::Sets => format!("{}:v{format}:{sets}x{ways}", config.namespace),
            Layout::Items { sets_per_key } => format!(
                "{}:v{format}:{sets}x{ways}g{sets_per_key}",
                config.namespace
            ),
        };
        let script = match layout {
            Layout::Sets => SET_SCRIPT,
            Layout::Items { .. } => CAS_SCRIPT,
        };
        let link = Link::new(&config)?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                config,
                geometry,
                layout,
                namespace,
                owner: random_owner(),
                link,
                script: redis::Script::new(script),
                fleet_script: redis::Script::new(fleet::FLEET_SCRIPT),
                unreadable: AtomicU64::new(0),
                hints: Hints::default(),
                filling: create::Filling::default(),
                ifeq: ifeq::Ifeq::default(),
            }),
        })
    }

    /// Loads the script (`SCRIPT LOAD`, on every node of a cluster): a check that the servers
    /// answer and run scripts.
    ///
    /// # Errors
    ///
    /// As [`RedisStore::connect`].
    pub async fn load_script(&self) -> Result<(), StoreError> {
        self.inner.link.load_script(&self.inner.script).await
    }

    /// Whether this store decides its claims, commits, erases and renews itself and writes
    /// each set back with `SET … IFEQ` (see the module docs), rather than through the set
    /// script: its servers answer `IFEQ` (Valkey 8.1 or later). Learnt when the store
    /// connects (a store opened lazily learns it before its first operation), never set.
    pub fn uses_ifeq(&self) -> bool {
        self.inner.ifeq.on()
    }

    /// How many of this store's `SET … IFEQ` writes found their set changed by another client
    /// since it was read, and read it again.
    pub fn ifeq_conflicts(&self) -> u64 {
        self.inner.ifeq.conflicts()
    }

    /// Sends every operation through the set script from now on, as on a server without
    /// `SET … IFEQ`: for benchmarks and tests that compare the two paths, or run a fleet of
    /// both on one table. Applies to every clone.
    #[doc(hidden)]
    pub fn force_script(&self) {
        self.inner.ifeq.force_off();
    }

    /// The settings this store was built with (any URL's password moved to `password`).
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// This store's owner id (random per instance, shared by clones).
    pub fn owner(&self) -> u64 {
        self.inner.owner
    }

    /// The namespace: `<prefix>:v<format>:<sets>x<ways>`.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The Redis key of the set that `digest` belongs to (in the compact layout, of the key
    /// that holds its set).
    pub fn set_key(&self, digest: Digest) -> String {
        let set = self.inner.geometry.set_of(digest);
        self.key_of_set(self.inner.layout.key_of(set))
    }

    /// The table's key format: 2, a key per set, or 3, the compact layout.
    #[doc(hidden)]
    pub fn key_format(&self) -> u8 {
        self.inner.layout.format()
    }

    /// The Redis Cluster slot of `key`, as the cluster computes it (CRC16 of the key, or of
    /// its `{hash tag}`, modulo 16,384) and as this store routes by.
    pub fn key_slot(key: &[u8]) -> u16 {
        key_slot(key)
    }

    /// How many stored values could not be decoded and were treated as empty sets.
    pub fn unreadable_values(&self) -> u64 {
        // A statistic: no other memory depends on it.
        self.inner.unreadable.load(Ordering::Relaxed)
    }

    /// How many `MOVED` and `ASK` answers of a Redis Cluster were followed: slots that moved
    /// (a reshard, a failover) since the slot map was read.
    pub fn redirects(&self) -> u64 {
        self.inner.link.redirects.load(Ordering::Relaxed)
    }

    /// How many operations on a Redis Cluster were tried again after a node failed (dead,
    /// or not answering in time) or the cluster answered that it was failing over; each
    /// retry follows a fresh read of the slot map.
    pub fn retries(&self) -> u64 {
        self.inner.link.retries.load(Ordering::Relaxed)
    }

    /// The key of number `set`: a set's, or in the compact layout an item's of several sets.
    fn key_of_set(&self, set: u64) -> String {
        // Room for the namespace, `:` and a number of up to 20 digits: written without growing.
        let mut key = String::with_capacity(self.inner.namespace.len() + 21);
        self.write_key(&mut key, set);
        key
    }

    /// Writes the key of `set` into `key` (emptied first), reusing its buffer.
    fn write_key(&self, key: &mut String, set: u64) {
        use std::fmt::Write as _;
        key.clear();
        key.push_str(&self.inner.namespace);
        // Writing to a String cannot fail.
        let _ = write!(key, ":{set}");
    }

    /// How long a claim's lease lasts, in milliseconds.
    fn lease_ms(&self) -> u64 {
        u64::try_from(self.inner.config.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// The time field of an entry committed at `now`: `now` with `max_age` (value format 2),
    /// else 0.
    fn done_time(&self, now: u64) -> u64 {
        if self.inner.config.max_age.is_some() {
            now
        } else {
            0
        }
    }

    /// Commits, erases or renews `digests`, each through the slot its claim answered when this
    /// store keeps it: a commit or an erase forgets it, a renew keeps it. A commit with a hint
    /// goes without the script where it can (`commit`); every other one through the script.
    async fn held_many(&self, op: Op, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        let hints = &self.inner.hints;
        let ifeq = self.ifeq_on().await;
        if self.inner.layout != Layout::Sets {
            let answers = self.compact_many(op, digests).await;
            return answers.into_iter().map(|a| held_answer(op, a)).collect();
        }
        let slots = match op {
            // Claims made with IFEQ keep no hint.
            _ if ifeq => vec![None; digests.len()],
            Op::Renew => hints.get(digests),
            _ => hints.take(digests),
        };
        let mut targets: Vec<Target> = digests.iter().copied().zip(slots).collect();
        let answers = if ifeq {
            self.ifeq_many(op, digests).await
        } else if op == Op::Commit {
            self.write_commits(&mut targets).await
        } else {
            vec![None; targets.len()]
        };
        self.script_the_rest(op, answers, |i| targets[i])
            .await
            .into_iter()
            .map(|answer| held_answer(op, answer))
            .collect()
    }

    /// Each of `answers`, the ones it lacks from the script: `op` on the digests without an
    /// answer (`target(i)` the `i`th digest and its hint), which a path without the script
    /// (`create`, `commit`) left to it.
    async fn script_the_rest(
        &self,
        op: Op,
        mut answers: Vec<Option<Result<i64, StoreError>>>,
        target: impl Fn(usize) -> Target,
    ) -> Vec<Result<i64, StoreError>> {
        let rest: Vec<usize> = (0..answers.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        if !rest.is_empty() {
            let run: Vec<Target> = rest.iter().map(|&i| target(i)).collect();
            let decided = self.update_many(op, &run).await;
            for (&i, answer) in rest.iter().zip(decided) {
                answers[i] = Some(answer);
            }
        }
        answered(answers)
    }

    async fn held(&self, op: Op, digest: Digest) -> Result<bool, StoreError> {
        self.held_many(op, &[digest])
            .await
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("no answer".into())))
    }
}

impl RedisStore {
    /// Runs the claim `op` on each digest: while the table fills, first as plain commands
    /// that create the sets that hold nothing (`create`), the others (all, otherwise)
    /// through the script. Each digest's claim.
    async fn claims(&self, op: Op, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let filling = &self.inner.filling;
        let ifeq = self.ifeq_on().await;
        if self.inner.layout != Layout::Sets {
            let answers = self.compact_many(op, digests).await;
            return answers.into_iter().map(|a| claim_answer(a?)).collect();
        }
        let creating = !ifeq && filling.get();
        let answers = if ifeq {
            self.ifeq_many(op, digests).await
        } else if creating {
            self.create_sets(op, digests).await
        } else {
            vec![None; digests.len()]
        };
        let before = filling.by_script();
        let answers = self
            .script_the_rest(op, answers, |i| (digests[i], None))
            .await;
        if !creating && !ifeq {
            // Every claim went to the script.
            filling.learn(filling.by_script().wrapping_sub(before), digests.len());
        }
        let mut claimed = Vec::new();
        let claims = answers
            .into_iter()
            .zip(digests)
            .map(|(answer, &digest)| {
                let answer = answer?;
                let claim = claim_answer(answer)?;
                // A claim's commit, erase or renew goes through its slot; an entry claimed
                // done has no commit to follow.
                match u8::try_from(answer >> 2) {
                    Ok(slot) if claim == Claim::New && op == Op::Claim && !ifeq => {
                        claimed.push((digest, slot));
                    }
                    _ => {}
                }
                Ok(claim)
            })
            .collect();
        self.inner.hints.remember(claimed);
        claims
    }
}

/// A claim as the set script answers it: the answer's low two bits, and the entry's slot
/// above them.
/// Each of `answers`; one that no path gave is a protocol error.
fn answered(answers: Vec<Option<Result<i64, StoreError>>>) -> Vec<Result<i64, StoreError>> {
    answers
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|| Err(StoreError::Protocol("no answer".into()))))
        .collect()
}

fn claim_answer(answer: i64) -> Result<Claim, StoreError> {
    match answer & 3 {
        0 => Ok(Claim::New),
        1 => Ok(Claim::InFlight),
        2 => Ok(Claim::Duplicate),
        _ => Err(StoreError::Protocol(format!(
            "the set script answered {answer} to a claim"
        ))),
    }
}

/// A commit, erase or renew as the set script answers it.
fn held_answer(op: Op, answer: Result<i64, StoreError>) -> Result<bool, StoreError> {
    match answer? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(StoreError::Protocol(format!(
            "the set script answered {other} to a {op:?}"
        ))),
    }
}

impl Store for RedisStore {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        self.claim_many(&[digest])
            .await
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("no answer to a claim".into())))
    }

    /// Claims many digests at once: one script run per node (per set in a cluster), see the
    /// module docs.
    ///
    /// A run that fails fails only its own digests (in a cluster, those of its set): the
    /// others are decided as usual.
    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        self.claims(Op::Claim, digests).await
    }

    /// Claims many digests as [`Store::claim_many`] does, each new entry written done in the
    /// same script run (op `d`): no commit follows.
    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        self.claims(Op::ClaimDone, digests).await
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Commit, digest).await
    }

    /// Commits many digests at once: with plain commands, a pipeline per master (see
    /// `commit`), and any left to the script in runs as [`Store::claim_many`] claims them.
    /// A commit is answered held when its entry was still its claim at the read before the
    /// write (a claim that takes the slot between the two loses its entry, see `commit`).
    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held_many(Op::Commit, digests).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Erase, digest).await
    }

    /// Erases many digests at once, as [`Store::commit_many`] commits them.
    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held_many(Op::Erase, digests).await
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Renew, digest).await
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.inner.geometry)
    }
}
