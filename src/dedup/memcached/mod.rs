//! The Memcached-backed table: one de-duplication memory shared by many consumers.
//!
//! [`MemcachedStore`] keeps the same table as the in-process [`Table`](crate::Table), with the
//! same [`Geometry`] and the same digest-to-set mapping ([`Geometry::set_of`]), but its sets are
//! memcached items, several sets an item, so every consumer process that connects to the same
//! servers with the same namespace and geometry shares it.
//!
//! # Items
//!
//! The table's sets are kept in items, several consecutive sets an item (the layout, key
//! format 2, [`crate::dedup::compact`]): item `i` holds sets `i × g` to `i × g + g - 1`, where `g` is as many
//! whole sets as fit [`MemcachedConfig::slots_per_item`] slots (64 by default: 8 sets of 8
//! ways). Its key is `<namespace>:<i>`, where the namespace is
//! `<prefix>:v<format>:<sets>x<ways>g<g>`: tables of different shapes or layouts never read
//! each other's items. Keys are routed to one of several servers by rendezvous hashing on xxh3 (see
//! [`MemcachedStore::server_of`]), which is stable across processes, runs and Rust releases and
//! moves only the keys of a server that is added or removed. Moved sets start empty on their
//! new server: their digests are forgotten once (as after a memcached restart), and their
//! in-flight claims with them, so change the server list when traffic is quiet.
//!
//! An entry is the digest's low half (its set is picked by the high half), 8 bytes, and with
//! `max_age` the second of its commit, 4 more; an entry in flight has a record of its lease's
//! expiry and owner (17 bytes) while it is in flight, and none once committed. So a committed
//! entry is final: nobody may erase it, not even its claimer (erase is for a claim whose
//! processing failed). An entry claimed done at once keeps its record until its lease ends, so
//! that its claimer can still erase it for a handler that failed all the same. The value's
//! bytes are in [`crate::dedup::compact`]. An item that is still filling holds each set's slots only up to its
//! last occupied one (its short form), so that a table that is filling costs memcached the
//! slots it uses, not whole items.
//!
//! The earlier layout (key format 1, `set.rs`: an item per set, `<prefix>:v1:<sets>x<ways>:<set>`,
//! 3 + 34 × entries bytes with the whole digest, state, time and owner of each entry) is
//! still read and written where a table's descriptor names it (see `layout` and
//! [`generational`](crate::dedup::generational)): a fleet on it follows it, and
//! `nsq-dedupe resize` moves the fleet to format 2 with the earlier table read as the previous
//! generation, so nothing is forgotten.
//!
//! Replacement is the in-process table's in each set, slot for slot: a new digest takes the
//! first empty slot, else the slot at the cursor, and the cursor moves on by one; so slots
//! fill in order and are replaced in the same order (FIFO), a duplicate hit changes nothing, a
//! lease takeover keeps the entry's slot, and a slot emptied by `erase` is refilled first and
//! keeps its place in the rotation. A value that cannot be decoded (truncated, a foreign
//! format, another shape, a bad cursor or record) is treated as an empty item and counted
//! ([`MemcachedStore::unreadable_values`]); the next write replaces it.
//!
//! # Atomicity
//!
//! The item model (`compact`, changed in its value's bytes, and `set` for the earlier layout:
//! entries, `apply`, `encode_into`, `decode`) is pure and tested without I/O; settings are in
//! `config`, connections in `conn` and `pool`, which server takes an item (and around an
//! ejected one) in `routing`.
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
//! - [`Store::claim_done_many`] writes a new entry done (with this owner id) in the claim's
//!   own write, for a handler whose accepted message is final: no lease, no commit.
//! - `commit` turns this owner's in-flight entry into done and returns `true`. Committing an
//!   entry that is already done returns `true` without writing, whoever committed it (a
//!   repeated commit is harmless); an entry held by another owner, or absent, gives `false`.
//! - `erase` removes the entry only if this owner claimed it and it is still in flight, or
//!   claimed it done at once and its lease has not ended: a committed entry is final.
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
//! a server that answers `version` as memcached does not (an HTTP port, whether it answers a
//! line or a page and closes, a TLS port, a memcached that requires authentication) is a
//! [`StoreError::Refused`] naming `store.memcached_addresses`; a memcached at its `-c` limit
//! of connections, which answers `ERROR Too many open connections` and closes, is an outage.
//!
//! # Memory
//!
//! Items are stored without expiry; memcached's LRU is what eventually removes the items of a
//! namespace nobody uses any more. A full item of `g` sets of `w` ways takes its value
//! (4 + g + 8 × g × w bytes, 12 per entry with `max_age`, and 17 per entry in flight; an item
//! not yet full takes g bytes more and 8 or 12 less per slot it does not hold), its key
//! and memcached's item header (about 90 bytes with the key): at 64 slots an item, about
//! 9.5 bytes a slot, which [`sizing::memcached_bytes_estimate`](crate::sizing::memcached_bytes_estimate)
//! estimates for `size`. Give memcached that, with headroom for its slab rounding. If
//! memcached evicts an item anyway, its sets are forgotten: their done entries as if pushed
//! out, and their in-flight claims too, so a redelivery of one of those may be processed twice.
//!
//! # Client and pipelining
//!
//! One engine does every operation: a small pipelined meta-protocol connection of our own
//! (`conn`). All reads of a batch (`mg <key> v c`) go in one round trip per server, all
//! compare-and-swaps (`ms <key> <len> C<token> c` / `ME c`, or quiet, below) in the next, and
//! sets that lost a race are read and written again. Each write answers the item's new CAS
//! token (but a quiet one, below), and the store keeps the value it wrote with it, for up to
//! 16,384 items (`KNOWN_SETS`, about 9 MB at 64 slots): an operation on such an item (a commit after this store's own claim, most of all)
//! is decided on that value and written with that token at once, one command instead of a read
//! and a write. If another writer changed the set in between, the write fails and the set is
//! read and decided again; a decision that writes nothing (a duplicate, say) is not verified by
//! any write, so it is made again on a fresh read. While most sets it reads turn out absent (a
//! table that is still filling), a store writes a set it does not know as new (`ME`) without
//! reading it first; if the set exists after all, the add fails and the set is read. On such a
//! table a set is seldom met again while the store still knows it, so a write whose new token
//! no operation of ours waits for (a commit, an erase, a claim done at once; not a claim, whose
//! commit follows) is sent quiet (`q`): memcached answers it only if it fails, naming it by its
//! opaque token (`O<n>`), and `mn` closes the pipeline. That spares the server an answer per
//! write; the set is then not known, and is read when met again. On a full table (most sets
//! read exist) every write asks for its token, so that the next claim of a set needs no read.
//! `async-memcached` cannot do this: its pipelined write applies one flag list to every item,
//! so it cannot carry a CAS token per item, and a `Client` runs one command at a time, so
//! concurrent operations cannot share a round trip.
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
//!
//! Files: `dedup/compact.rs` is the pure model of an item's value, `set.rs` that of the earlier
//! layout's, `layout.rs` picks one by the key format, `batch.rs` runs a batch's pipelines,
//! `coalesce.rs` gathers single operations into batches, `conn.rs` and `pool.rs` are the
//! connections, `routing.rs` and `health.rs` pick a set's server and eject a failing one,
//! `fleet.rs` shares the fleet's counts, and `config.rs` holds the settings.

mod batch;
mod coalesce;
mod config;
mod conn;
mod fleet;
mod generation;
mod health;
mod layout;
mod pool;
mod routing;
mod set;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use self::coalesce::Request;
use self::conn::PipeConn;
use self::health::Health;
use self::layout::{Layout, Unit, COMPACT_FORMAT};
use self::pool::Pool;
use self::set::{LeaseFacts, Op, Outcome};
use crate::decimal::put_decimal;
use crate::dedup::shared::{now_ms, random_owner};
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;
use crate::wording::Wording;
pub use config::MemcachedConfig;
#[cfg(feature = "sidecar")]
pub(crate) use config::DEFAULT_EJECT_AFTER;

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
    /// How the sets are kept in items: the key format's.
    layout: Layout,
    /// `<prefix>:v<format>:<sets>x<ways>`, and in format 2 `g<sets per item>` after it.
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
    /// `KNOWN_SETS` (see `batch::remember`).
    known: std::sync::Mutex<batch::KnownSets>,
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
                let (answer, cut) = conn.last_answer();
                Err(not_memcached(server, &answer, cut))
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
        Self::new_lazy_in(config, geometry, COMPACT_FORMAT)
    }

    /// [`MemcachedStore::new_lazy`] for a table of key format `format` (see `layout`).
    fn new_lazy_in(
        config: MemcachedConfig,
        geometry: Geometry,
        format: u8,
    ) -> Result<Self, StoreError> {
        config.validate()?;
        let layout =
            Layout::of(format, geometry.ways(), config.slots_per_item).ok_or_else(|| {
                StoreError::Protocol(format!(
                    "a Memcached table of key format {format}, which this version does not read"
                ))
            })?;
        let namespace = match layout {
            Layout::Sets => format!(
                "{}:v{format}:{}x{}",
                config.namespace,
                geometry.sets(),
                geometry.ways()
            ),
            Layout::Items { sets_per_item } => format!(
                "{}:v{format}:{}x{}g{sets_per_item}",
                config.namespace,
                geometry.sets(),
                geometry.ways()
            ),
        };
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
                layout,
                namespace,
                owner: random_owner(),
                servers,
                unreadable: AtomicU64::new(0),
                cas_conflicts: AtomicU64::new(0),
                ejections: AtomicU64::new(0),
                returns: AtomicU64::new(0),
                started: std::time::Instant::now(),
                coalescer: std::sync::Mutex::new(None),
                known: std::sync::Mutex::new(batch::KnownSets::default()),
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

    /// The namespace: `<prefix>:v<format>:<sets>x<ways>`, then `g<sets per item>` in the
    /// compact layout (key format 2).
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The memcached key of the item that holds the set `digest` belongs to.
    pub fn item_key(&self, digest: Digest) -> String {
        self.key_of_set(self.item_of(digest))
    }

    /// The number of the item that holds the set of `digest`.
    fn item_of(&self, digest: Digest) -> u64 {
        self.inner
            .layout
            .item_of(self.inner.geometry.set_of(digest))
    }

    /// Bytes of one full item's value, no entry in flight (for the memory a table takes).
    pub fn full_item_value_bytes(&self) -> u64 {
        self.inner
            .layout
            .full_value_bytes(self.inner.geometry.ways(), self.inner.config.max_age)
    }

    /// How many items the table has.
    pub fn items(&self) -> u64 {
        self.inner
            .geometry
            .sets()
            .div_ceil(self.inner.layout.sets_per_item())
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
        let mut key = String::with_capacity(self.inner.namespace.len() + 12);
        self.push_key_of_set(&mut key, set);
        key
    }

    /// Appends the memcached key of set number `set` to `out`: `<namespace>:<set>`.
    fn push_key_of_set(&self, out: &mut String, set: u64) {
        out.push_str(&self.inner.namespace);
        out.push(':');
        let mut digits = [0u8; 20];
        let mut free = &mut digits[..];
        put_decimal(&mut free, set);
        let len = 20 - free.len();
        // Digits only: ASCII.
        out.extend(digits[..len].iter().map(|&b| char::from(b)));
    }

    /// Whether the sets this store does not know are mostly absent: a table that is still
    /// filling (see `Inner::absent`).
    fn filling(&self) -> bool {
        // Relaxed: a hint, never a decision.
        self.inner.absent.load(Ordering::Relaxed) > 0
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

    /// Item `item`'s value, decoded; absent, it is empty, and one that cannot be decoded is
    /// counted and read as empty.
    fn decode_counted(&self, value: Option<Vec<u8>>, item: u64) -> Unit {
        let layout = self.inner.layout;
        let geometry = self.inner.geometry;
        let max_age = self.inner.config.max_age;
        let Some(value) = value else {
            return layout.empty(item, geometry, max_age);
        };
        layout
            .decode(value, item, geometry, max_age)
            .unwrap_or_else(|| {
                self.inner.unreadable.fetch_add(1, Ordering::Relaxed);
                layout.empty(item, geometry, max_age)
            })
    }

    /// Item `item`'s value as this store wrote it (`None`: absent), taken without a check.
    fn decode_written(&self, value: Option<Vec<u8>>, item: u64) -> Unit {
        let (layout, geometry) = (self.inner.layout, self.inner.geometry);
        let max_age = self.inner.config.max_age;
        match value {
            Some(value) => layout.written(value, item, geometry, max_age),
            None => layout.empty(item, geometry, max_age),
        }
    }

    /// Applies `op` for `digest` to the value of its item.
    fn apply(&self, unit: &mut Unit, op: Op, digest: Digest, facts: LeaseFacts) -> (Outcome, bool) {
        let set = self.inner.geometry.set_of(digest);
        unit.apply(self.inner.layout, set, op, digest, facts)
    }

    /// An item's value as this store writes it.
    fn encode(&self, unit: Unit) -> Vec<u8> {
        unit.into_value(self.inner.config.max_age)
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
        self.claims(Op::Claim, digests).await
    }

    /// Claims many digests as [`claim_many`](Store::claim_many) does, each new entry written
    /// done in the claim's own compare-and-swap: no commit follows.
    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        self.claims(Op::ClaimDone, digests).await
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
    /// Runs the claim `op` on each digest in pipelines; each digest's claim.
    async fn claims(&self, op: Op, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let ops: Vec<(Op, Digest)> = digests.iter().map(|&d| (op, d)).collect();
        self.run_ops(&ops)
            .await
            .into_iter()
            .map(|outcome| match outcome? {
                Outcome::Claim(claim) => Ok(claim),
                Outcome::Held(_) => Err(StoreError::Protocol("claim gave no claim".into())),
            })
            .collect()
    }

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

fn unavailable(server: &Server, err: &dyn std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        addr: server.addr.clone(),
        detail: err.to_string(),
    }
}

/// The refusal of a server that answered `version` with `answer` (the start of its answer,
/// `cut` when there was more), which memcached does not give: another service at that
/// address, or a memcached that requires authentication (`-Y`), which this client does not
/// speak. The answer is quoted with its control characters escaped, so that a binary answer
/// stays one printable line.
fn not_memcached(server: &Server, answer: &str, cut: bool) -> StoreError {
    let why = if answer == "CLIENT_ERROR unauthenticated" {
        ": it requires authentication (memcached -Y), which this client does not speak"
    } else {
        ", so it is not memcached"
    };
    let more = if cut { "…" } else { "" };
    StoreError::Refused {
        addr: server.addr.clone(),
        detail: Wording::from(format!(
            "it answered `version` with {answer:?}{more}{why}; give the TCP address of a \
             memcached without authentication (port 11211 unless it was started with another) \
             in "
        ))
        .key("store.memcached_addresses"),
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
        let empty = store.decode_counted(None, 0);
        assert_eq!(
            store.decode_counted(Some(b"\x03\x00\x05garbage".to_vec()), 0),
            empty
        );
        let bytes = store.encode(empty.clone());
        assert_eq!(store.decode_counted(Some(bytes), 0), empty);
        assert_eq!(store.unreadable_values(), 1);
    }

    #[test]
    fn items_hold_the_slots_asked_for() {
        let geometry = Geometry::new(1_000 * 8, 8).unwrap();
        let store = MemcachedStore::new_lazy(MemcachedConfig::default(), geometry).unwrap();
        assert_eq!(store.namespace(), "nsq-dedupe:v2:1000x8g8");
        assert_eq!(store.items(), 125);
        assert_eq!(store.full_item_value_bytes(), 4 + 8 + 64 * 8);
        let legacy = MemcachedStore::new_lazy_in(MemcachedConfig::default(), geometry, 1).unwrap();
        assert_eq!(legacy.namespace(), "nsq-dedupe:v1:1000x8");
        assert_eq!(legacy.items(), 1_000);
    }
}
