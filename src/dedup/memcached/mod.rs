//! The Memcached-backed table: one de-duplication memory shared by many consumers.
//!
//! [`MemcachedStore`] keeps the same table as the in-process [`Table`](crate::Table), with the
//! same [`Geometry`] and the same digest-to-set mapping ([`Geometry::set_of`]), but each set is
//! one memcached item, so every consumer process that connects to the same servers with the
//! same namespace and geometry shares it.
//!
//! # Items
//!
//! The item of set `s` is `<namespace>:<s>`, where the namespace is
//! `<prefix>:v<format>:<sets>x<ways>`: tables of different shapes or formats never read each
//! other's items. Keys are routed to one of several servers by rendezvous hashing on xxh3 (see
//! [`MemcachedStore::server_of`]), which is stable across processes, runs and Rust releases and
//! moves only the keys of a server that is added or removed. Moved sets start empty on their
//! new server: their digests are forgotten once (as after a memcached restart), and their
//! in-flight claims with them, so change the server list when traffic is quiet.
//!
//! The value (format version 1) is compact binary, big-endian:
//!
//! ```text
//! offset 0   u8    format version (1)
//! offset 1   u8    cursor: the slot the next eviction replaces (below `ways`)
//! offset 2   u8    entry count n (at most `ways`)
//! offset 3   n entries of 34 bytes, one per occupied slot:
//!            u8    slot index (below `ways`, each at most once)
//!            u128  digest (all 128 bits, so a hit is exact)
//!            u8    state: 1 = in flight, 2 = done
//!            u64   lease expiry, milliseconds since the Unix epoch (0 once done)
//!            u64   owner: the random id of the store instance that claimed it
//! ```
//!
//! A set of 8 ways is at most 275 bytes. Replacement is the in-process table's, slot for slot:
//! a new digest takes the first empty slot, else the slot at the cursor, and the cursor moves
//! on by one; so slots fill in order and are replaced in the same order (FIFO), a duplicate hit
//! changes nothing, a lease takeover keeps the entry's slot, and a slot emptied by `erase` is
//! refilled first and keeps its place in the rotation. A value that cannot be decoded
//! (truncated, a foreign format version, a bad state, cursor or slot) is treated as an empty
//! set and counted ([`MemcachedStore::unreadable_values`]); the next write replaces it.
//!
//! # Atomicity
//!
//! The set model (`set`: entries, [`apply`], [`encode`], [`decode`]) is pure and tested
//! without I/O; settings are in `config`, connections in `conn` and `pool`, which server
//! takes a set (and around an ejected one) in `routing`.
//!
//! Every operation reads the item with its CAS token, decides, and writes with
//! compare-and-swap (`ms ... C<token>`), or add-if-absent (`ms ... ME`) when the item did not
//! exist. If another writer changed the item in between, the write fails, and we read again and
//! decide again, at most [`MemcachedConfig::max_cas_retries`] times, then
//! [`StoreError::Contended`]. A plain get-then-set would lose one of two concurrent claims to
//! the same set; the integration tests show both behaviours.
//!
//! # Leases and owners
//!
//! `claim` writes the entry in flight with a lease ([`MemcachedConfig::lease`], by default 65 s,
//! a little over NSQ's 60 s message timeout) and this store's owner id (random per
//! [`MemcachedStore`]). While the lease is live, other claims get [`Claim::InFlight`]; once it
//! has expired (its owner died or hung), the next claim takes the entry over as [`Claim::New`].
//! Then:
//! - `commit` turns this owner's in-flight entry into done and returns `true`. Committing an
//!   entry that is already done returns `true` without writing, whoever committed it (a
//!   repeated commit is harmless); an entry held by another owner, or absent, gives `false`.
//! - `erase` removes the entry only if this owner claimed (or committed) it.
//! - `renew` extends this owner's in-flight lease, even if it has lapsed, as long as nobody took
//!   it over; a done entry has no lease to renew, so `false`.
//!
//! Lease expiry compares wall clocks of different machines, so keep their clocks in sync
//! (NTP); a skew of a few seconds only shortens or lengthens a lease by as much.
//!
//! # Errors and time limits
//!
//! Every network step (connect, read, write) and every wait for a pooled connection is bounded
//! by [`MemcachedConfig::timeout`] (500 ms by default), and a single operation as a whole by
//! `(1 + 2 × max_cas_retries) × timeout`. A refused connection, a reset, a timeout or an
//! unparseable answer is a [`StoreError`], never a `Duplicate`: the caller decides what to do
//! with the message. A connection that saw an error is closed and the pool is emptied, so after
//! a server restart the next operations reconnect. A claim whose write reached the server before
//! the error leaves an in-flight entry of this owner; claims of it (by anyone, this store
//! included) answer `InFlight` until its lease expires, so a redelivery is processed at the
//! latest one lease later. [`MemcachedStore::connect`] tells an outage from a wrong address:
//! a server that answers `version` as memcached does not (an HTTP port, a memcached that
//! requires authentication) is a [`StoreError::Refused`] naming `store.memcached_addresses`.
//!
//! # Memory
//!
//! Items are stored without expiry; memcached's LRU is what eventually removes the items of a
//! namespace nobody uses any more. A set's item takes its value (3 + 34 × entries bytes), its
//! key and memcached's item header (about 50 bytes), so give memcached at least
//! `sets × (ways × 34 + 120)` bytes, with headroom for its slab rounding. If memcached evicts a
//! set's item anyway, that set is forgotten: its done entries as if pushed out, and its in-flight
//! claims too, so a redelivery of one of those may be processed twice.
//!
//! # Client and pipelining
//!
//! One engine does every operation: a small pipelined meta-protocol connection of our own
//! (`conn`). All reads of a batch (`mg <key> v c`) go in one round trip per server, all
//! compare-and-swaps (`ms <key> <len> C<token> c` / `ME c`) in the next, and sets that lost a
//! race are read and written again. Each write answers the item's new CAS token, and the store
//! keeps the value it wrote with it, for up to 16,384 sets (`KNOWN_SETS`, about 5 MB
//! at 8 ways): an operation on such a set (a commit after this store's own claim, most of all)
//! is decided on that value and written with that token at once, one command instead of a read
//! and a write. If another writer changed the set in between, the write fails and the set is
//! read and decided again; a decision that writes nothing (a duplicate, say) is not verified by
//! any write, so it is made again on a fresh read. While most sets it reads turn out absent (a
//! table that is still filling), a store writes a set it does not know as new (`ME`) without
//! reading it first; if the set exists after all, the add fails and the set is read. `async-memcached` cannot do this: its pipelined write applies
//! one flag list to every item, so it cannot carry a CAS token per item, and a `Client` runs one
//! command at a time, so concurrent operations cannot share a round trip.
//!
//! [`Store::claim_many`] sends its digests this way, and so do single operations: with
//! coalescing on (the default) a background task (`coalesce`, started on first use, ended when
//! the last handle to the store is dropped) collects the operations that arrive while earlier
//! pipelines are on the wire, up to [`MemcachedConfig::pool_size`] pipelines at once; with it
//! off, each single operation is a pipeline of its own. Operations on one set within one
//! pipeline are applied in arrival order and written once. The queue is unbounded, but each
//! caller waits for its answer, so it never holds more operations than there are callers
//! waiting. An operation whose caller stops waiting (its future dropped) may still be carried
//! out.
//!
//! In a batch, an error of one server fails the operations on that server only, claims
//! included: the digests of the other servers are decided as usual. A failed claim whose write
//! reached the server before the error stands as an in-flight entry that expires with its
//! lease.

mod coalesce;
mod config;
mod conn;
mod fleet;
mod health;
mod pool;
mod routing;
mod set;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};

use self::coalesce::{coalesce, coalescer_gone, Request};
use self::conn::{PipeConn, Write, Written};
use self::health::Health;
use self::pool::Pool;
use self::set::{apply, decode, encode, LeaseFacts, Op, Outcome, SetState};
use crate::dedup::shared::{
    now_ms, random_owner, FORMAT_VERSION, FORMAT_VERSION_TIMED, KEY_VERSION,
};
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;
pub use config::MemcachedConfig;

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

/// A set-associative de-duplication table kept in memcached and shared by every process that
/// uses the same servers, namespace and geometry.
///
/// Cloning is cheap and shares connections and the owner id: clones are one owner.
#[derive(Clone)]
pub struct MemcachedStore {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    config: MemcachedConfig,
    geometry: Geometry,
    /// `<prefix>:v<format>:<sets>x<ways>`.
    namespace: String,
    /// This instance's owner id, written into its claims.
    owner: u64,
    servers: Vec<Server>,
    /// Values that could not be decoded and were treated as empty.
    unreadable: AtomicU64,
    /// Writes that lost a compare-and-swap race and were decided again.
    cas_conflicts: AtomicU64,
    /// Servers ejected, and servers taken back, so far (see `health`).
    ejections: AtomicU64,
    returns: AtomicU64,
    /// The clock of the servers' failure times.
    started: std::time::Instant,
    /// Whether the sets this store does not know are mostly absent (a table that is still
    /// filling): above 0, such a set is written as new without a read (see `note_absent`).
    absent: std::sync::atomic::AtomicI64,
    /// The sets this store wrote last, as it wrote them, with their CAS tokens: at most
    /// [`KNOWN_SETS`] (see `remember`).
    known: std::sync::Mutex<HashMap<String, (Vec<u8>, u64)>>,
    /// The queue of the coalescing task (see [`coalesce`]), set on first use. The task ends
    /// when this sender (and the clones that callers hold briefly) is dropped.
    coalescer: std::sync::Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

struct Server {
    addr: String,
    /// xxh3 of `addr`: this server's seed in rendezvous hashing.
    route_seed: u64,
    pipes: Pool<PipeConn>,
    health: Health,
}

impl Inner {
    /// Forgets every set's last written value and token: none may be trusted once a server
    /// restarted or sets moved between servers (each numbers its CAS tokens on its own).
    fn forget_known(&self) {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl std::fmt::Debug for MemcachedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcachedStore")
            .field("namespace", &self.inner.namespace)
            .field("servers", &self.inner.config.servers)
            .field("owner", &format_args!("{:016x}", self.inner.owner))
            .finish_non_exhaustive()
    }
}

impl MemcachedStore {
    /// Builds a store for a table of shape `geometry` and checks that every server answers.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`; [`StoreError::Refused`] when a server
    /// answers `version` as memcached does not (another service at that address, or a
    /// memcached that requires authentication), naming `store.memcached_addresses`, even if
    /// another server is down; else [`StoreError::Unavailable`] or [`StoreError::Timeout`]
    /// for the first server that does not answer.
    pub async fn connect(config: MemcachedConfig, geometry: Geometry) -> Result<Self, StoreError> {
        let store = Self::new_lazy(config, geometry)?;
        let mut outage = None;
        for server in &store.inner.servers {
            match store.check(server).await {
                Ok(()) => {}
                Err(refused @ StoreError::Refused { .. }) => return Err(refused),
                Err(error) => {
                    outage.get_or_insert(error);
                }
            }
        }
        outage.map_or(Ok(store), Err)
    }

    /// Asks `server` for its `version`.
    async fn check(&self, server: &Server) -> Result<(), StoreError> {
        let mut conn = self.pipe(server).await?;
        let timeout = self.inner.config.timeout;
        match tokio::time::timeout(timeout, conn.version()).await {
            Ok(Ok(_)) => {
                conn.set_healthy(true);
                Ok(())
            }
            // It answered, but not as memcached does.
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::InvalidData => {
                Err(not_memcached(server, &conn.last_answer()))
            }
            Ok(Err(err)) => Err(unavailable(server, &err)),
            Err(_) => Err(StoreError::Timeout(timeout)),
        }
    }

    /// Builds a store without contacting any server; connections open on first use.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`.
    pub fn new_lazy(config: MemcachedConfig, geometry: Geometry) -> Result<Self, StoreError> {
        config.validate()?;
        let namespace = format!(
            "{}:v{KEY_VERSION}:{}x{}",
            config.namespace,
            geometry.sets(),
            geometry.ways()
        );
        let servers = config
            .servers
            .iter()
            .map(|addr| Server {
                addr: addr.clone(),
                route_seed: xxhash_rust::xxh3::xxh3_64(addr.as_bytes()),
                pipes: Pool::new(config.pool_size),
                health: Health::default(),
            })
            .collect();
        Ok(MemcachedStore {
            inner: std::sync::Arc::new(Inner {
                config,
                geometry,
                namespace,
                owner: random_owner(),
                servers,
                unreadable: AtomicU64::new(0),
                cas_conflicts: AtomicU64::new(0),
                ejections: AtomicU64::new(0),
                returns: AtomicU64::new(0),
                started: std::time::Instant::now(),
                coalescer: std::sync::Mutex::new(None),
                known: std::sync::Mutex::new(HashMap::new()),
                absent: std::sync::atomic::AtomicI64::new(0),
            }),
        })
    }

    /// The settings this store was built with.
    pub fn config(&self) -> &MemcachedConfig {
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

    /// The memcached key of the set that `digest` belongs to.
    pub fn item_key(&self, digest: Digest) -> String {
        self.key_of_set(self.inner.geometry.set_of(digest))
    }

    /// How many stored values could not be decoded and were treated as empty sets.
    pub fn unreadable_values(&self) -> u64 {
        // A statistic: no other memory depends on it, so `Relaxed` suffices.
        self.inner.unreadable.load(Ordering::Relaxed)
    }

    /// How many writes lost a compare-and-swap race to another writer of the same set and
    /// were read and decided again: a measure of contention.
    pub fn cas_conflicts(&self) -> u64 {
        // A statistic, as above.
        self.inner.cas_conflicts.load(Ordering::Relaxed)
    }

    fn key_of_set(&self, set: u64) -> String {
        format!("{}:{set}", self.inner.namespace)
    }

    async fn pipe<'a>(
        &'a self,
        server: &'a Server,
    ) -> Result<pool::Pooled<'a, PipeConn>, StoreError> {
        let timeout = self.inner.config.timeout;
        let connect = || async {
            match tokio::time::timeout(timeout, PipeConn::connect(&server.addr)).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(err)) => Err(unavailable(server, &err)),
                Err(_) => Err(StoreError::Timeout(timeout)),
            }
        };
        match tokio::time::timeout(timeout, server.pipes.get(connect)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(timeout)),
        }
    }

    /// Applies `op` to the set of `digest`: through the coalescer if it is on, else in a
    /// pipeline of its own.
    async fn update(&self, digest: Digest, op: Op) -> Result<Outcome, StoreError> {
        match self.coalescer() {
            Some(queue) => {
                let (reply, answer) = oneshot::channel();
                if queue.send(Request { op, digest, reply }).is_err() {
                    return Err(coalescer_gone());
                }
                // The batch's own steps are time-limited; this bounds the wait for a free
                // pipeline too.
                let limit = self.operation_limit();
                match tokio::time::timeout(limit, answer).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(coalescer_gone()),
                    Err(_) => Err(StoreError::Timeout(limit)),
                }
            }
            None => self
                .run_ops(&[(op, digest)])
                .await
                .pop()
                .unwrap_or_else(|| {
                    Err(StoreError::Protocol("an operation went unanswered".into()))
                }),
        }
    }

    /// The longest one operation may take: a connect plus a read and a write per attempt.
    fn operation_limit(&self) -> Duration {
        let config = &self.inner.config;
        let steps = config.max_cas_retries.saturating_mul(2).saturating_add(1);
        config.timeout.saturating_mul(steps)
    }

    /// The queue of the task that coalesces concurrent single operations into pipelines, or
    /// `None` if coalescing is off or we are not inside a tokio runtime.
    ///
    /// The task starts on first use, on the current runtime. If that runtime has shut down
    /// since (the task is gone), a new task starts on the current one.
    fn coalescer(&self) -> Option<mpsc::UnboundedSender<Request>> {
        if !self.inner.config.coalesce {
            return None;
        }
        // A `std` mutex: held only to clone or replace the sender, never across an `.await`;
        // a panic cannot leave the `Option` half-written, so a poisoned lock is still usable.
        let mut slot = self
            .inner
            .coalescer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match &*slot {
            Some(queue) if !queue.is_closed() => Some(queue.clone()),
            previous => {
                let handle = tokio::runtime::Handle::try_current().ok()?;
                if previous.is_some() {
                    // The old task's runtime is gone, and with it the I/O driver that idle
                    // connections were registered with: they would fail on first use.
                    for server in &self.inner.servers {
                        server.pipes.clear();
                    }
                }
                let (queue, requests) = mpsc::unbounded_channel();
                let inner = std::sync::Arc::downgrade(&self.inner);
                handle.spawn(coalesce(inner, requests, self.inner.config.pool_size));
                *slot = Some(queue.clone());
                Some(queue)
            }
        }
    }

    /// Applies `ops` in pipelines: grouped by server (all servers at once) and by set (a
    /// set's operations in their order, then one write). Returns each operation's outcome;
    /// an operation fails only with the server of its set.
    async fn run_ops(&self, ops: &[(Op, Digest)]) -> Vec<Result<Outcome, StoreError>> {
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
                // Sets this store wrote last are decided on the value it wrote, without a read:
                // the write's compare-and-swap with that value's token verifies it. Each set
                // gets that one chance; a set decided again is read.
                let mut known = Vec::with_capacity(pending.len());
                let mut to_read = Vec::with_capacity(pending.len());
                let guess_absent = inner.absent.load(Ordering::Relaxed) > 0;
                {
                    let sets = inner.known.lock().unwrap_or_else(|p| p.into_inner());
                    for &p in &pending {
                        match sets.get(&chunk[p].key).filter(|_| first_try[p]) {
                            Some((value, cas)) => known.push((p, Some((value.clone(), *cas)))),
                            // Written as new (`ME`), which fails if the set exists after all.
                            None if first_try[p] && guess_absent => known.push((p, None)),
                            None => to_read.push(p),
                        }
                    }
                }
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
                let facts = self.lease_facts();
                // For each pending set: its new value (if it changed), the CAS token of the
                // read, and the outcomes that the write would make true.
                let mut planned = Vec::with_capacity(pending.len());
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
                        planned.push((p, encode(&entries, self.value_version()), cas, outcomes));
                    } else if cached {
                        // Nothing to write, so nothing verifies the value it was decided on.
                        undecided.push(p);
                    } else {
                        answers.extend(outcomes);
                    }
                }
                let writes: Vec<Write<'_>> = planned
                    .iter()
                    .map(|(p, value, cas, _)| Write {
                        key: &chunk[*p].key,
                        value,
                        cas: *cas,
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
        for ((p, value, cas, outcomes), written) in planned.into_iter().zip(written) {
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

    fn lease_facts(&self) -> LeaseFacts {
        let now_ms = now_ms();
        let lease_ms = u64::try_from(self.inner.config.lease.as_millis()).unwrap_or(u64::MAX);
        LeaseFacts {
            now_ms,
            lease_until_ms: now_ms.saturating_add(lease_ms),
            owner: self.inner.owner,
            max_age_ms: self
                .inner
                .config
                .max_age
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// The value format this store writes: timed only when entries expire, so that a table
    /// without `max_age` stays readable by every version.
    fn value_version(&self) -> u8 {
        if self.inner.config.max_age.is_some() {
            FORMAT_VERSION_TIMED
        } else {
            FORMAT_VERSION
        }
    }

    fn ways(&self) -> usize {
        self.inner.geometry.ways() as usize
    }

    /// Decodes a set's value; one that cannot be decoded is counted and read as empty.
    fn decode_counted(&self, value: Option<&[u8]>) -> SetState {
        match decode(value.unwrap_or_default(), self.ways()) {
            Ok(set) => set,
            Err(_) => {
                self.inner.unreadable.fetch_add(1, Ordering::Relaxed);
                SetState::empty(self.ways())
            }
        }
    }
}

impl Store for MemcachedStore {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        match self.update(digest, Op::Claim).await? {
            Outcome::Claim(claim) => Ok(claim),
            Outcome::Held(_) => Err(StoreError::Protocol("claim gave no claim".into())),
        }
    }

    /// Claims many digests in pipelines: the sets of all digests are read in one round trip
    /// per server (and per 256 sets), then written with one compare-and-swap each in the
    /// next; sets that lost a race are read and written again.
    ///
    /// A server that fails fails the claims of its sets only; some of them may already be
    /// written, and those entries are in flight under this owner and expire with the lease.
    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let ops: Vec<(Op, Digest)> = digests.iter().map(|&d| (Op::Claim, d)).collect();
        self.run_ops(&ops)
            .await
            .into_iter()
            .map(|outcome| match outcome? {
                Outcome::Claim(claim) => Ok(claim),
                Outcome::Held(_) => Err(StoreError::Protocol("claim gave no claim".into())),
            })
            .collect()
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        held(self.update(digest, Op::Commit).await?)
    }

    /// Commits many digests in pipelines, as [`claim_many`](Store::claim_many) claims them;
    /// an error of one server fails the digests of that server only.
    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held_many(Op::Commit, digests).await
    }

    /// Erases many digests in pipelines; an error of one server fails the digests of that
    /// server only.
    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held_many(Op::Erase, digests).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        held(self.update(digest, Op::Erase).await?)
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        held(self.update(digest, Op::Renew).await?)
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.inner.geometry)
    }
}

impl MemcachedStore {
    /// Runs `op` on each digest in pipelines; whether each set still held its digest.
    async fn held_many(&self, op: Op, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        let ops: Vec<(Op, Digest)> = digests.iter().map(|&d| (op, d)).collect();
        self.run_ops(&ops)
            .await
            .into_iter()
            .map(|outcome| held(outcome?))
            .collect()
    }
}

fn held(outcome: Outcome) -> Result<bool, StoreError> {
    match outcome {
        Outcome::Held(held) => Ok(held),
        Outcome::Claim(_) => Err(StoreError::Protocol("operation gave a claim".into())),
    }
}

/// A set's planned write: its index in its chunk, its new value, the CAS token of the value
/// it was decided on (`None`: absent), and the outcomes the write makes true.
type Planned = (usize, Vec<u8>, Option<u64>, Vec<(usize, Outcome)>);

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

fn unavailable(server: &Server, err: &dyn std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        addr: server.addr.clone(),
        detail: err.to_string(),
    }
}

/// The refusal of a server that answered `version` with `answer`, which memcached does not
/// give: another service at that address, or a memcached that requires authentication
/// (`-Y`), which this client does not speak.
fn not_memcached(server: &Server, answer: &str) -> StoreError {
    let why = if answer == "CLIENT_ERROR unauthenticated" {
        ": it requires authentication (memcached -Y), which this client does not speak"
    } else {
        ", so it is not memcached"
    };
    // Enough to tell the service; a binary protocol's line may be long.
    let answer: String = answer.chars().take(64).collect();
    StoreError::Refused {
        addr: server.addr.clone(),
        detail: format!(
            "it answered `version` with {answer:?}{why}; give the TCP address of a memcached \
             without authentication (port 11211 unless it was started with another) in \
             `store.memcached_addresses`"
        ),
    }
}

/// Whether an error suggests that the server's other pooled connections are dead too.
fn is_connection_error(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable { .. } | StoreError::Timeout(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_value_counts_and_reads_as_empty() {
        let geometry = Geometry::new(8, 2).unwrap();
        let store = MemcachedStore::new_lazy(MemcachedConfig::default(), geometry).unwrap();
        assert_eq!(
            store.decode_counted(Some(b"\x01\x00\x05garbage")),
            SetState::empty(2)
        );
        assert_eq!(
            store.decode_counted(Some(&encode(&SetState::empty(2), FORMAT_VERSION))),
            SetState::empty(2)
        );
        assert_eq!(store.unreadable_values(), 1);
    }
}
