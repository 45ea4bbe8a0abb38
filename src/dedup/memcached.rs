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
//! latest one lease later.
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
//! `async-memcached` 0.9 speaks the meta protocol: `meta_get` with `v c` returns a value and
//! its CAS token, and `meta_set` with `C<token>` (compare-and-swap) or `ME` (add) writes
//! atomically; it closes a connection whose exchange was cut short, which our pool relies on.
//! We use it for single operations when coalescing is off ([`MemcachedConfig::coalesce`] set
//! to `false`): each then takes a pooled connection for two round trips (read, write).
//!
//! It cannot do two things we need for throughput. Its pipelined write, `meta_set_multi`,
//! applies one flag list to every item, so it cannot carry a CAS token per item; and a
//! `Client` runs one command at a time, so concurrent operations cannot share a round trip.
//! So batches use a small pipelined meta-protocol connection of our own (`pipeline.rs`): all
//! reads of a batch (`mg <key> v c`) go in one round trip per server, all compare-and-swaps
//! (`ms <key> <len> C<token>` / `ME`) in the next, and sets that lost a race are read and
//! written again. [`Store::claim_many`] sends its digests this way, and, with coalescing on
//! (the default), so do single operations: a background task (started on first use, ended
//! when the last handle to the store is dropped) collects the operations that arrive while
//! earlier pipelines are on the wire, up to [`MemcachedConfig::pool_size`] pipelines at once.
//! Operations on one set within one pipeline are applied in arrival order and written once.
//! The queue is unbounded, but each caller waits for its answer, so it never holds more
//! operations than there are callers waiting. An operation whose caller stops waiting (its
//! future dropped) may still be carried out.
//!
//! In a batch, an error of one server fails the operations on that server only; for
//! `claim_many` it fails the whole call, although claims on other servers (or written before
//! the error) may stand as in-flight entries that expire with their lease.

mod pipeline;
mod pool;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_memcached::{Client, MetaProtocol, Status};
use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};

use self::pipeline::{PipeConn, Write, Written};
use self::pool::Pool;
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;

/// The value format version written by this code; part of the namespace and of every value.
pub(crate) const FORMAT_VERSION: u8 = 1;

/// Bytes of one entry in a value: slot index, digest, state, lease expiry, owner.
const ENTRY_BYTES: usize = 34;

/// Bytes before the first entry: version, cursor, count.
const HEADER_BYTES: usize = 3;

/// Sets per pipeline round trip in a batch. Bounded so that a huge batch never fills both
/// directions' socket buffers while we are still writing.
const MAX_PIPELINE_SETS: usize = 256;

/// Settings of a [`MemcachedStore`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use nsq_dedupe::MemcachedConfig;
///
/// let config = MemcachedConfig {
///     servers: vec!["10.0.0.5:11211".into(), "10.0.0.6:11211".into()],
///     namespace: "orders".into(),
///     ..MemcachedConfig::default()
/// };
/// assert_eq!(config.lease, Duration::from_secs(65));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcachedConfig {
    /// Servers as `host:port`. Keys are routed by these exact strings, so every consumer must
    /// spell them the same way. Defaults to: `["127.0.0.1:11211"]`.
    pub servers: Vec<String>,
    /// The user's part of the namespace: consumers with the same prefix (and geometry) share a
    /// table. Printable ASCII without spaces, at most 160 bytes. Defaults to: `nsq-dedupe`.
    pub namespace: String,
    /// How long a claim stays in flight without `commit` or `renew` before another delivery may
    /// take it over. Defaults to: 65 s (NSQ's default message timeout is 60 s).
    pub lease: Duration,
    /// Time limit of each network step: connect, read, write. Defaults to: 500 ms.
    pub timeout: Duration,
    /// Connections per server, of each of two kinds: pipelined connections (at most this many
    /// batches or coalesced pipelines at once) and, with coalescing off, connections for single
    /// operations. Defaults to: 4.
    ///
    /// Coalesced pipelines grow while all are busy, so a few suffice even across a network;
    /// fewer, larger pipelines also cost memcached less CPU per operation. With 64 tasks on a
    /// two-core machine, 4 gave 69 k claims/s and 8 gave 50 to 60 k.
    pub pool_size: usize,
    /// How many times an operation reads and tries to write a set before giving up with
    /// [`StoreError::Contended`]. Defaults to: 16.
    pub max_cas_retries: u32,
    /// Whether concurrent single operations (`claim`, `commit`, `erase`, `renew`) are sent
    /// together in pipelines, which multiplies throughput under concurrency; when off, each
    /// takes a pooled connection for its own round trips. Defaults to: `true`.
    pub coalesce: bool,
}

impl Default for MemcachedConfig {
    fn default() -> Self {
        MemcachedConfig {
            servers: vec!["127.0.0.1:11211".to_owned()],
            namespace: "nsq-dedupe".to_owned(),
            lease: Duration::from_secs(65),
            timeout: Duration::from_millis(500),
            pool_size: 4,
            max_cas_retries: 16,
            coalesce: true,
        }
    }
}

/// The rule for a namespace: it becomes part of every key, and Memcached keys are printable
/// ASCII without spaces, at most 250 bytes with the rest of the key.
///
/// # Errors
///
/// What is wrong, for an error message that names the setting.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), &'static str> {
    if namespace.is_empty()
        || namespace.len() > 160
        || !namespace.bytes().all(|b| b.is_ascii_graphic())
    {
        Err("must be 1 to 160 printable ASCII characters without spaces")
    } else {
        Ok(())
    }
}

impl MemcachedConfig {
    /// Checks every setting without connecting or building anything.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] naming the first setting that is wrong.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |detail: String| Err(StoreError::Config(detail));
        if self.servers.is_empty() {
            return invalid(
                "`store.memcached_addresses` is empty; give at least one host:port".into(),
            );
        }
        if let Some(bad) = self
            .servers
            .iter()
            .find(|s| s.is_empty() || s.chars().any(char::is_whitespace))
        {
            return invalid(format!(
                "`store.memcached_addresses` entry {bad:?} is not a host:port"
            ));
        }
        let ns = &self.namespace;
        if let Err(reason) = check_namespace(ns) {
            return invalid(format!("`store.namespace` = {ns:?}: {reason}"));
        }
        if self.lease.as_millis() == 0 {
            return invalid("`store.lease` must be at least 1 ms".into());
        }
        if self.timeout.is_zero() {
            return invalid("`store.timeout` must be more than 0".into());
        }
        if self.pool_size == 0 {
            return invalid("`pool_size` (MemcachedConfig) must be at least 1".into());
        }
        if self.max_cas_retries == 0 {
            return invalid("`max_cas_retries` (MemcachedConfig) must be at least 1".into());
        }
        Ok(())
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
    /// The queue of the coalescing task (see [`coalesce`]), set on first use. The task ends
    /// when this sender (and the clones that callers hold briefly) is dropped.
    coalescer: std::sync::Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

struct Server {
    addr: String,
    /// `tcp://<addr>`: async-memcached reads a bare `1.2.3.4:11211` as a URL and fails.
    dsn: String,
    /// xxh3 of `addr`: this server's seed in rendezvous hashing.
    route_seed: u64,
    clients: Pool<Client>,
    pipes: Pool<PipeConn>,
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

/// What one operation does to the entry of its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Claim,
    Commit,
    Erase,
    Renew,
}

/// The answer of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Claim(Claim),
    Held(bool),
}

impl MemcachedStore {
    /// Builds a store for a table of shape `geometry` and checks that every server answers.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`; [`StoreError::Unavailable`] or
    /// [`StoreError::Timeout`] when a server does not answer `version`.
    pub async fn connect(config: MemcachedConfig, geometry: Geometry) -> Result<Self, StoreError> {
        let store = Self::new_lazy(config, geometry)?;
        for server in &store.inner.servers {
            let mut client = store.client(server).await?;
            let timeout = store.inner.config.timeout;
            match tokio::time::timeout(timeout, client.version()).await {
                // With coalescing on, operations use pipelined connections only, so this one
                // is closed rather than left idle in the pool.
                Ok(Ok(_)) => client.set_healthy(!store.inner.config.coalesce),
                Ok(Err(err)) => return Err(unavailable(server, &err)),
                Err(_) => return Err(StoreError::Timeout(timeout)),
            }
        }
        Ok(store)
    }

    /// Builds a store without contacting any server; connections open on first use.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`.
    pub fn new_lazy(config: MemcachedConfig, geometry: Geometry) -> Result<Self, StoreError> {
        config.validate()?;
        let namespace = format!(
            "{}:v{FORMAT_VERSION}:{}x{}",
            config.namespace,
            geometry.sets(),
            geometry.ways()
        );
        let servers = config
            .servers
            .iter()
            .map(|addr| Server {
                addr: addr.clone(),
                dsn: format!("tcp://{addr}"),
                route_seed: xxhash_rust::xxh3::xxh3_64(addr.as_bytes()),
                clients: Pool::new(config.pool_size),
                pipes: Pool::new(config.pool_size),
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
                coalescer: std::sync::Mutex::new(None),
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

    /// The index in [`MemcachedConfig::servers`] of the server that holds `key`.
    ///
    /// Rendezvous hashing: the server with the highest `xxh3_64(key, seed = xxh3_64(addr))`
    /// wins. It depends only on the key and the server strings.
    pub fn server_of(&self, key: &str) -> usize {
        if self.inner.servers.len() == 1 {
            return 0;
        }
        let mut best = (0, 0);
        for (index, server) in self.inner.servers.iter().enumerate() {
            let score = xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), server.route_seed);
            if index == 0 || score > best.1 {
                best = (index, score);
            }
        }
        best.0
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

    async fn client<'a>(
        &'a self,
        server: &'a Server,
    ) -> Result<pool::Pooled<'a, Client>, StoreError> {
        let timeout = self.inner.config.timeout;
        let connect = || async {
            match tokio::time::timeout(timeout, Client::new(&server.dsn)).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(err)) => Err(unavailable(server, &err)),
                Err(_) => Err(StoreError::Timeout(timeout)),
            }
        };
        match tokio::time::timeout(timeout, server.clients.get(connect)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(timeout)),
        }
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

    /// Applies `op` to the set of `digest`: through the coalescer if it is on, else on a
    /// connection of its own.
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
            None => self.update_alone(digest, op).await,
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
                        server.clients.clear();
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

    /// Reads, decides and compare-and-swaps the set of `digest` until the write wins.
    async fn update_alone(&self, digest: Digest, op: Op) -> Result<Outcome, StoreError> {
        let inner = &*self.inner;
        let key = self.item_key(digest);
        let server = &inner.servers[self.server_of(&key)];
        let result = self.update_on(server, &key, digest, op).await;
        if result.as_ref().is_err_and(is_connection_error) {
            server.clients.clear();
        }
        result
    }

    async fn update_on(
        &self,
        server: &Server,
        key: &str,
        digest: Digest,
        op: Op,
    ) -> Result<Outcome, StoreError> {
        let inner = &*self.inner;
        let timeout = inner.config.timeout;
        let mut client = self.client(server).await?;
        for _ in 0..inner.config.max_cas_retries {
            let read = tokio::time::timeout(
                timeout,
                client.meta_get(key, false, None, Some(&["v", "c"])),
            )
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
            .map_err(|err| classify(server, err))?;
            let (mut entries, cas) = match read {
                Some(value) => {
                    // memcached always sends the token we asked for; without it we could not
                    // write safely.
                    let Some(cas) = value.cas else {
                        return Err(StoreError::Protocol(format!(
                            "{} answered `mg {key} v c` without a CAS token",
                            server.addr
                        )));
                    };
                    (self.decode_counted(value.data.as_deref()), Some(cas))
                }
                None => (SetState::empty(self.ways()), None),
            };
            let (outcome, changed) = apply(&mut entries, op, digest, self.lease_facts());
            if !changed {
                client.set_healthy(true);
                return Ok(outcome);
            }
            let value = encode(&entries);
            let flag = match cas {
                Some(cas) => format!("C{cas}"),
                None => "ME".to_owned(),
            };
            let written = tokio::time::timeout(
                timeout,
                client.meta_set(key, value.as_slice(), false, None, Some(&[flag.as_str()])),
            )
            .await
            .map_err(|_| StoreError::Timeout(timeout))?;
            match written {
                Ok(_) => {
                    client.set_healthy(true);
                    return Ok(outcome);
                }
                Err(async_memcached::Error::Protocol(
                    Status::Exists | Status::NotStored | Status::NotFound,
                )) => {
                    inner.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
                Err(err) => return Err(classify(server, err)),
            }
        }
        client.set_healthy(true);
        Err(StoreError::Contended {
            attempts: inner.config.max_cas_retries,
        })
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
                let server = self.server_of(&key);
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
    /// server's pool.
    async fn run_sets_on(
        &self,
        server: &Server,
        sets: &[SetOps],
        ops: &[(Op, Digest)],
    ) -> Result<Vec<(usize, Outcome)>, StoreError> {
        let result = self.run_sets_pipelined(server, sets, ops).await;
        if result.as_ref().is_err_and(is_connection_error) {
            server.pipes.clear();
        }
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
            let mut rounds = 0;
            while !pending.is_empty() {
                if rounds == inner.config.max_cas_retries {
                    conn.set_healthy(true);
                    return Err(StoreError::Contended { attempts: rounds });
                }
                rounds += 1;
                let pending_keys: Vec<&str> =
                    pending.iter().map(|&p| chunk[p].key.as_str()).collect();
                let reads = tokio::time::timeout(timeout, conn.get_many(&pending_keys))
                    .await
                    .map_err(|_| StoreError::Timeout(timeout))?
                    .map_err(io_error)?;
                let facts = self.lease_facts();
                // For each pending set: its new value (if it changed), the CAS token of the
                // read, and the outcomes that the write would make true.
                let mut planned = Vec::with_capacity(pending.len());
                for (&p, read) in pending.iter().zip(reads) {
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
                        planned.push((p, encode(&entries), cas, outcomes));
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
                    tokio::time::timeout(timeout, conn.set_many(&writes))
                        .await
                        .map_err(|_| StoreError::Timeout(timeout))?
                        .map_err(io_error)?
                };
                pending.clear();
                for ((p, _, _, outcomes), written) in planned.into_iter().zip(written) {
                    match written {
                        Written::Stored => answers.extend(outcomes),
                        Written::Conflict => {
                            inner.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                            pending.push(p);
                        }
                    }
                }
                if !pending.is_empty() {
                    tokio::task::yield_now().await;
                }
            }
        }
        conn.set_healthy(true);
        Ok(answers)
    }

    fn lease_facts(&self) -> LeaseFacts {
        let now_ms = now_ms();
        let lease_ms = u64::try_from(self.inner.config.lease.as_millis()).unwrap_or(u64::MAX);
        LeaseFacts {
            now_ms,
            lease_until_ms: now_ms.saturating_add(lease_ms),
            owner: self.inner.owner,
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
    /// If any server fails, the whole batch is an error, although some of its claims may
    /// already be written; those entries are in flight under this owner and expire with the
    /// lease.
    async fn claim_many(&self, digests: &[Digest]) -> Result<Vec<Claim>, StoreError> {
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

fn held(outcome: Outcome) -> Result<bool, StoreError> {
    match outcome {
        Outcome::Held(held) => Ok(held),
        Outcome::Claim(_) => Err(StoreError::Protocol("operation gave a claim".into())),
    }
}

/// The operations of one batch that fall in one set.
#[derive(Clone)]
struct SetOps {
    /// The set's item key.
    key: String,
    /// Indices into the batch's operations, in order.
    ops: Vec<usize>,
}

/// One single operation waiting for the coalescer.
struct Request {
    op: Op,
    digest: Digest,
    /// The caller waits on the other end; if it gave up, the answer is dropped.
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

/// The most operations one coalesced pipeline carries.
const MAX_COALESCED: usize = 512;

/// Collects single operations that arrive while earlier pipelines are on the wire and sends
/// them together: up to `slots` pipelines at once, each with whatever queued up meanwhile.
///
/// Holds only a weak reference to the store, so it ends when the last handle is dropped
/// (the queue's sender lives in the store).
async fn coalesce(
    inner: std::sync::Weak<Inner>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    slots: usize,
) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(slots));
    loop {
        // Wait for a free pipeline first, so that requests queue up into bigger batches while
        // all pipelines are busy.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = requests.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_COALESCED {
            match requests.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let store = MemcachedStore { inner };
        tokio::spawn(async move {
            let ops: Vec<(Op, Digest)> = batch.iter().map(|r| (r.op, r.digest)).collect();
            let outcomes = store.run_ops(&ops).await;
            for (request, outcome) in batch.into_iter().zip(outcomes) {
                let _ = request.reply.send(outcome);
            }
            drop(slot);
        });
    }
}

fn coalescer_gone() -> StoreError {
    StoreError::Unavailable {
        addr: "(coalescer)".into(),
        detail: "the task that batches operations stopped before answering, most likely because \
                 the tokio runtime it ran on shut down; the next operation starts a new one"
            .into(),
    }
}

fn unavailable(server: &Server, err: &dyn std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        addr: server.addr.clone(),
        detail: err.to_string(),
    }
}

/// Maps a client error: server error lines are protocol errors, the rest mean the connection
/// is unusable.
fn classify(server: &Server, err: async_memcached::Error) -> StoreError {
    match err {
        async_memcached::Error::Protocol(status) => {
            StoreError::Protocol(format!("{} answered {status}", server.addr))
        }
        async_memcached::Error::ParseError(kind) => {
            StoreError::Protocol(format!("unreadable answer from {}: {kind:?}", server.addr))
        }
        other => unavailable(server, &other),
    }
}

/// Whether an error suggests that the server's other pooled connections are dead too.
fn is_connection_error(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable { .. } | StoreError::Timeout(_))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random owner id: xxh3 of the process id, the time, a per-process counter and a stack
/// address, so two stores (in one process or in two) practically never share one.
fn random_owner() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let local = 0u8;
    let mut seed = Vec::with_capacity(40);
    seed.extend_from_slice(&u64::from(std::process::id()).to_le_bytes());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    seed.extend_from_slice(&nanos.to_le_bytes());
    // Relaxed: only uniqueness of the returned number matters.
    seed.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    seed.extend_from_slice(&(std::ptr::addr_of!(local) as usize as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed)
}

/// The state of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight = 1,
    Done = 2,
}

/// One way of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    digest: Digest,
    state: State,
    /// Milliseconds since the Unix epoch; 0 once done.
    lease_until_ms: u64,
    owner: u64,
}

/// What a decision needs to know besides the set: the time, the lease, who we are.
#[derive(Debug, Clone, Copy)]
struct LeaseFacts {
    now_ms: u64,
    lease_until_ms: u64,
    owner: u64,
}

/// One set: `ways` slots and the cursor of the next eviction, as in the in-process table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SetState {
    /// The slot a new digest replaces when no slot is empty.
    cursor: usize,
    /// Exactly `ways` slots.
    slots: Vec<Option<Entry>>,
}

impl SetState {
    fn empty(ways: usize) -> Self {
        SetState {
            cursor: 0,
            slots: vec![None; ways],
        }
    }
}

/// Applies `op` for `digest` to a set. Returns the answer and whether the set changed (and
/// must be written).
///
/// Replacement is the in-process table's: a new digest takes the first empty slot, else the
/// slot at the cursor, and the cursor moves on by one. Slots fill in order and are replaced in
/// the same order (FIFO); a duplicate hit changes nothing; a slot emptied by `erase` is refilled
/// first and keeps its place in the rotation.
fn apply(set: &mut SetState, op: Op, digest: Digest, facts: LeaseFacts) -> (Outcome, bool) {
    let found = set
        .slots
        .iter()
        .position(|slot| slot.is_some_and(|entry| entry.digest == digest));
    let Some(i) = found else {
        return match op {
            Op::Claim => {
                let ways = set.slots.len();
                let victim = match set.slots.iter().position(Option::is_none) {
                    Some(empty) => empty,
                    None => {
                        let victim = set.cursor % ways;
                        set.cursor = (victim + 1) % ways;
                        victim
                    }
                };
                set.slots[victim] = Some(Entry {
                    digest,
                    state: State::InFlight,
                    lease_until_ms: facts.lease_until_ms,
                    owner: facts.owner,
                });
                (Outcome::Claim(Claim::New), true)
            }
            Op::Commit | Op::Erase | Op::Renew => (Outcome::Held(false), false),
        };
    };
    let slot = &mut set.slots[i];
    let Some(entry) = slot.as_mut() else {
        // `found` only points at occupied slots.
        return (Outcome::Held(false), false);
    };
    let mine = entry.owner == facts.owner;
    match (op, entry.state) {
        (Op::Claim, State::Done) => (Outcome::Claim(Claim::Duplicate), false),
        (Op::Claim, State::InFlight) if entry.lease_until_ms > facts.now_ms => {
            (Outcome::Claim(Claim::InFlight), false)
        }
        (Op::Claim, State::InFlight) => {
            // The owner let the lease lapse: take the entry over, in its slot.
            entry.owner = facts.owner;
            entry.lease_until_ms = facts.lease_until_ms;
            (Outcome::Claim(Claim::New), true)
        }
        (Op::Commit, State::Done) => (Outcome::Held(true), false),
        (Op::Commit, State::InFlight) if mine => {
            entry.state = State::Done;
            entry.lease_until_ms = 0;
            (Outcome::Held(true), true)
        }
        (Op::Erase, _) if mine => {
            *slot = None;
            (Outcome::Held(true), true)
        }
        (Op::Renew, State::InFlight) if mine => {
            entry.lease_until_ms = facts.lease_until_ms;
            (Outcome::Held(true), true)
        }
        (Op::Commit | Op::Erase | Op::Renew, _) => (Outcome::Held(false), false),
    }
}

/// Encodes a set (see the module docs for the layout).
fn encode(set: &SetState) -> Vec<u8> {
    let count = set.slots.iter().flatten().count();
    let mut out = Vec::with_capacity(HEADER_BYTES + count * ENTRY_BYTES);
    out.push(FORMAT_VERSION);
    // At most 8 ways, so the cursor, the count and a slot index each fit in a byte.
    out.push(set.cursor as u8);
    out.push(count as u8);
    for (index, slot) in set.slots.iter().enumerate() {
        if let Some(entry) = slot {
            out.push(index as u8);
            out.extend_from_slice(&entry.digest.to_bytes());
            out.push(entry.state as u8);
            out.extend_from_slice(&entry.lease_until_ms.to_be_bytes());
            out.extend_from_slice(&entry.owner.to_be_bytes());
        }
    }
    out
}

/// Why a value could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeError {
    /// Empty, or shorter or longer than its entry count says.
    Length,
    /// Written by another format version.
    Version(u8),
    /// More entries than the set has ways.
    Count(u8),
    /// A cursor or slot index outside the set, or two entries in one slot.
    Slot(u8),
    /// An unknown state byte.
    State(u8),
}

/// Decodes a set of `ways` ways.
fn decode(value: &[u8], ways: usize) -> Result<SetState, DecodeError> {
    let [version, cursor, count, rest @ ..] = value else {
        return Err(DecodeError::Length);
    };
    if *version != FORMAT_VERSION {
        return Err(DecodeError::Version(*version));
    }
    if usize::from(*cursor) >= ways {
        return Err(DecodeError::Slot(*cursor));
    }
    if usize::from(*count) > ways {
        return Err(DecodeError::Count(*count));
    }
    if rest.len() != usize::from(*count) * ENTRY_BYTES {
        return Err(DecodeError::Length);
    }
    let mut set = SetState {
        cursor: usize::from(*cursor),
        slots: vec![None; ways],
    };
    for raw in rest.chunks_exact(ENTRY_BYTES) {
        let index = raw[0];
        let slot = set
            .slots
            .get_mut(usize::from(index))
            .filter(|slot| slot.is_none())
            .ok_or(DecodeError::Slot(index))?;
        let state = match raw[17] {
            1 => State::InFlight,
            2 => State::Done,
            other => return Err(DecodeError::State(other)),
        };
        let array = |at: usize| -> Result<[u8; 8], DecodeError> {
            raw[at..at + 8].try_into().map_err(|_| DecodeError::Length)
        };
        let digest: [u8; 16] = raw[1..17].try_into().map_err(|_| DecodeError::Length)?;
        *slot = Some(Entry {
            digest: Digest::from_bytes(digest),
            state,
            lease_until_ms: u64::from_be_bytes(array(18)?),
            owner: u64::from_be_bytes(array(26)?),
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u128, state: State, owner: u64) -> Entry {
        Entry {
            digest: Digest::from_u128(n),
            state,
            lease_until_ms: if state == State::Done {
                0
            } else {
                1_000 + n as u64 % 1_000
            },
            owner,
        }
    }

    fn facts(now_ms: u64, owner: u64) -> LeaseFacts {
        LeaseFacts {
            now_ms,
            lease_until_ms: now_ms + 100,
            owner,
        }
    }

    fn set_of(cursor: usize, slots: Vec<Option<Entry>>) -> SetState {
        SetState { cursor, slots }
    }

    fn digests(set: &SetState) -> Vec<Option<u128>> {
        set.slots
            .iter()
            .map(|slot| slot.map(|e| e.digest.as_u128()))
            .collect()
    }

    #[test]
    fn value_round_trips() {
        let set = set_of(
            2,
            vec![
                Some(entry(u128::MAX - 3, State::InFlight, 7)),
                None,
                Some(entry(42, State::Done, u64::MAX)),
                None,
            ],
        );
        let bytes = encode(&set);
        assert_eq!(bytes.len(), HEADER_BYTES + 2 * ENTRY_BYTES);
        assert_eq!(bytes[..4], [FORMAT_VERSION, 2, 2, 0]);
        assert_eq!(decode(&bytes, 4), Ok(set));
        assert_eq!(
            decode(&encode(&SetState::empty(1)), 1),
            Ok(SetState::empty(1))
        );
    }

    #[test]
    fn unreadable_bytes_are_rejected() {
        let good = encode(&set_of(0, vec![None, Some(entry(1, State::InFlight, 1))]));
        assert_eq!(
            decode(&good, 2).map(|s| digests(&s)),
            Ok(vec![None, Some(1)])
        );
        assert_eq!(decode(&[], 4), Err(DecodeError::Length));
        assert_eq!(decode(&good[..good.len() - 1], 2), Err(DecodeError::Length));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long, 2), Err(DecodeError::Length));
        let mut bad_state = good.clone();
        bad_state[HEADER_BYTES + 17] = 9;
        assert_eq!(decode(&bad_state, 2), Err(DecodeError::State(9)));
        // Slot 1 does not exist in a 1-way set, nor cursor 1.
        assert_eq!(decode(&good, 1), Err(DecodeError::Slot(1)));
        let mut bad_cursor = good.clone();
        bad_cursor[1] = 2;
        assert_eq!(decode(&bad_cursor, 2), Err(DecodeError::Slot(2)));
        // Two entries in one slot.
        let two = encode(&set_of(
            0,
            vec![
                Some(entry(1, State::Done, 1)),
                Some(entry(2, State::Done, 1)),
            ],
        ));
        let mut same_slot = two.clone();
        same_slot[HEADER_BYTES + ENTRY_BYTES] = 0;
        assert_eq!(decode(&same_slot, 2), Err(DecodeError::Slot(0)));
        assert_eq!(decode(&two, 1), Err(DecodeError::Count(2)));
        assert_eq!(decode(b"hello world", 8), Err(DecodeError::Version(b'h')));
    }

    #[test]
    fn other_format_version_is_rejected() {
        let mut bytes = encode(&set_of(0, vec![Some(entry(5, State::Done, 3)); 1]));
        bytes[0] = FORMAT_VERSION + 1;
        assert_eq!(
            decode(&bytes, 1),
            Err(DecodeError::Version(FORMAT_VERSION + 1))
        );
    }

    #[test]
    fn unreadable_value_counts_and_reads_as_empty() {
        let geometry = Geometry::new(8, 2).unwrap();
        let store = MemcachedStore::new_lazy(MemcachedConfig::default(), geometry).unwrap();
        assert_eq!(
            store.decode_counted(Some(b"\x01\x00\x05garbage")),
            SetState::empty(2)
        );
        assert_eq!(
            store.decode_counted(Some(&encode(&SetState::empty(2)))),
            SetState::empty(2)
        );
        assert_eq!(store.unreadable_values(), 1);
    }

    #[test]
    fn claims_follow_leases_and_owners() {
        let (me, other) = (1, 2);
        let mut set = SetState::empty(2);
        let d = Digest::from_u128;
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(0, me)),
            (Outcome::Claim(Claim::New), true)
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(50, other)),
            (Outcome::Claim(Claim::InFlight), false)
        );
        // After the lease (until 100), another owner takes over in place.
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(100, other)),
            (Outcome::Claim(Claim::New), true)
        );
        assert_eq!(set.slots[0].unwrap().owner, other);
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, me)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, other)),
            (Outcome::Held(true), true)
        );
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, me)),
            (Outcome::Held(true), false),
            "committing a done entry is a no-op that reports it held"
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(10_000, me)),
            (Outcome::Claim(Claim::Duplicate), false)
        );
        // Erase and renew by a non-owner do nothing; renew extends the owner's lease.
        apply(&mut set, Op::Claim, d(12), facts(200, me));
        assert_eq!(
            apply(&mut set, Op::Erase, d(12), facts(200, other)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Renew, d(12), facts(250, other)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Renew, d(12), facts(250, me)),
            (Outcome::Held(true), true)
        );
        assert_eq!(set.slots[1].unwrap().lease_until_ms, 350);
        assert_eq!(
            apply(&mut set, Op::Renew, d(10), facts(250, other)),
            (Outcome::Held(false), false),
            "a done entry has no lease to renew"
        );
        assert_eq!(
            apply(&mut set, Op::Erase, d(12), facts(300, me)),
            (Outcome::Held(true), true)
        );
        assert_eq!(digests(&set), [Some(10), None]);
    }

    #[test]
    fn replacement_matches_the_in_process_cursor() {
        let me = 1;
        let mut set = SetState::empty(4);
        let claim = |set: &mut SetState, n: u128| {
            apply(set, Op::Claim, Digest::from_u128(n), facts(0, me)).0
        };
        for n in 1..=4 {
            assert_eq!(claim(&mut set, n), Outcome::Claim(Claim::New));
        }
        // Full: the cursor (slot 0) is replaced, then slot 1; a hit changes nothing.
        claim(&mut set, 5);
        assert_eq!(claim(&mut set, 3), Outcome::Claim(Claim::InFlight));
        claim(&mut set, 6);
        assert_eq!(digests(&set), [Some(5), Some(6), Some(3), Some(4)]);
        assert_eq!(set.cursor, 2);
        // An erased slot is refilled first and keeps its place in the rotation: 7 goes into
        // slot 0, and the next eviction still takes slot 2 (digest 3).
        apply(&mut set, Op::Erase, Digest::from_u128(5), facts(0, me));
        claim(&mut set, 7);
        assert_eq!(digests(&set), [Some(7), Some(6), Some(3), Some(4)]);
        claim(&mut set, 8);
        assert_eq!(digests(&set), [Some(7), Some(6), Some(8), Some(4)]);
        assert_eq!(set.cursor, 3);
    }

    #[test]
    fn routing_is_pinned() {
        // Routing must never change between releases: these values were computed once with
        // xxh3 and must stay as they are.
        let config = MemcachedConfig {
            servers: vec![
                "10.0.0.1:11211".into(),
                "10.0.0.2:11211".into(),
                "10.0.0.3:11211".into(),
            ],
            ..MemcachedConfig::default()
        };
        let store = MemcachedStore::new_lazy(config, Geometry::new(1024, 8).unwrap()).unwrap();
        let routes: Vec<usize> = (0..12)
            .map(|set| store.server_of(&store.key_of_set(set)))
            .collect();
        assert_eq!(routes, PINNED_ROUTES);
        assert_eq!(store.namespace(), "nsq-dedupe:v1:128x8");
    }

    const PINNED_ROUTES: [usize; 12] = [1, 0, 2, 2, 0, 2, 2, 2, 2, 1, 0, 2];

    #[test]
    fn config_is_validated() {
        let geometry = Geometry::new(8, 2).unwrap();
        let bad = |config: MemcachedConfig| {
            MemcachedStore::new_lazy(config, geometry)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(MemcachedConfig {
            servers: vec![],
            ..Default::default()
        })
        .contains("store.memcached_addresses"));
        assert!(bad(MemcachedConfig {
            namespace: "a b".into(),
            ..Default::default()
        })
        .contains("store.namespace"));
        assert!(bad(MemcachedConfig {
            pool_size: 0,
            ..Default::default()
        })
        .contains("`pool_size`"));
        assert!(bad(MemcachedConfig {
            max_cas_retries: 0,
            ..Default::default()
        })
        .contains("`max_cas_retries`"));
    }
}
