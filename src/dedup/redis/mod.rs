//! The Redis-backed table: one de-duplication memory shared by many consumers, on one Redis
//! (or Valkey) server or spread over a Redis Cluster.
//!
//! [`RedisStore`] keeps the Memcached store's table with the same layout: the same
//! [`Geometry`], the same digest-to-set mapping, one key per set named
//! `<prefix>:v<format>:<sets>x<ways>:<set>`, and the same binary value (see
//! [`MemcachedStore`](crate::MemcachedStore) for the format, the replacement order, leases,
//! owners and `max_age`). No operation touches two keys, so in a cluster every set may live on
//! any slot and the sets spread over all masters.
//!
//! # Atomicity
//!
//! Each operation (claim, commit, erase, renew) is one `EVALSHA` of a Lua script (`set.lua`)
//! that reads the set, decides and writes it back; Redis runs a script to its end before any
//! other command, so two claims of one digest can never both see it absent, and each
//! operation is one round trip. The script is loaded on every node when the store connects,
//! and loaded again by the client when a node answers `NOSCRIPT` (a restarted server, a
//! promoted replica that missed it).
//!
//! # Round trips
//!
//! Connections are multiplexed (see `conn`): the operations of concurrent callers, and the
//! claims of one [`Store::claim_many`], are written together while earlier ones are on the
//! wire, and their answers read back in order: a pipeline per node without a queue of our own.
//!
//! # Errors, time limits and failover
//!
//! Each operation (connecting included) is bounded by [`RedisConfig::timeout`]. A refused
//! connection, a timeout, `CLUSTERDOWN` or any error reply is a [`StoreError`], never a
//! `Duplicate`, and the caller's `on_store_error` decides. After a master fails, its slots are
//! answered again once a replica is promoted; operations in between fail. Redis replicates
//! asynchronously, so writes acknowledged by a master just before it died may be missing on
//! the promoted replica: their digests are forgotten once (a redelivery passes again), never
//! a message lost. The same goes for a server restarted without persistence.
//!
//! # Memory
//!
//! Keys have no expiry: give Redis `maxmemory` with `maxmemory-policy allkeys-lru` to let it
//! remove the sets of namespaces nobody uses. `nsq-dedupe size` reports the bytes per set
//! that `MEMORY USAGE` measures on a full set.

mod config;
mod conn;
mod slots;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::{join_all, try_join_all};

use self::conn::Link;
use crate::dedup::memcached::{
    now_ms, random_owner, FORMAT_VERSION, FORMAT_VERSION_TIMED, KEY_VERSION,
};
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;
pub use config::{RedisConfig, RedisPassword};

/// The script of every operation.
const SET_SCRIPT: &str = include_str!("set.lua");

/// What one operation does to the entry of its digest, as the script's first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Claim,
    Commit,
    Erase,
    Renew,
}

impl Op {
    fn code(self) -> &'static str {
        match self {
            Op::Claim => "c",
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
    /// `<prefix>:v<format>:<sets>x<ways>`.
    namespace: String,
    owner: u64,
    link: Link,
    script: redis::Script,
    /// Values that could not be decoded and were treated as empty.
    unreadable: AtomicU64,
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
    /// Builds a store for a table of shape `geometry`, connects, and loads the script (on
    /// every node of a cluster).
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`; [`StoreError::Unavailable`] or
    /// [`StoreError::Timeout`] when the servers do not answer.
    pub async fn connect(config: RedisConfig, geometry: Geometry) -> Result<Self, StoreError> {
        let store = Self::new_lazy(config, geometry)?;
        store.load_script().await?;
        Ok(store)
    }

    /// Builds a store without contacting any server; the connection opens on first use.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an invalid `config`.
    pub fn new_lazy(mut config: RedisConfig, geometry: Geometry) -> Result<Self, StoreError> {
        config.take_url_passwords()?;
        config.validate()?;
        let namespace = format!(
            "{}:v{KEY_VERSION}:{}x{}",
            config.namespace,
            geometry.sets(),
            geometry.ways()
        );
        let link = Link::new(&config)?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                config,
                geometry,
                namespace,
                owner: random_owner(),
                link,
                script: redis::Script::new(SET_SCRIPT),
                unreadable: AtomicU64::new(0),
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
        let inner = &*self.inner;
        let load = inner.link.load_script(&inner.script);
        match tokio::time::timeout(inner.config.timeout, load).await {
            Ok(result) => result,
            Err(_) => {
                inner.link.forget_after_timeout();
                Err(StoreError::Timeout(inner.config.timeout))
            }
        }
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

    /// The Redis key of the set that `digest` belongs to.
    pub fn set_key(&self, digest: Digest) -> String {
        self.key_of_set(self.inner.geometry.set_of(digest))
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

    fn key_of_set(&self, set: u64) -> String {
        format!("{}:{set}", self.inner.namespace)
    }

    /// Runs the script for `op` on the set of `digest`, within the time limit.
    async fn update(&self, op: Op, digest: Digest) -> Result<i64, StoreError> {
        let inner = &*self.inner;
        let now = now_ms();
        let lease_ms = u64::try_from(inner.config.lease.as_millis()).unwrap_or(u64::MAX);
        let max_age = inner
            .config
            .max_age
            .map(|age| {
                u64::try_from(age.as_millis())
                    .unwrap_or(u64::MAX)
                    .to_string()
            })
            .unwrap_or_default();
        let version = if inner.config.max_age.is_some() {
            FORMAT_VERSION_TIMED
        } else {
            FORMAT_VERSION
        };
        let args = [
            op.code().as_bytes().to_vec(),
            digest.to_bytes().to_vec(),
            inner.owner.to_be_bytes().to_vec(),
            now.to_string().into_bytes(),
            now.saturating_add(lease_ms).to_string().into_bytes(),
            max_age.into_bytes(),
            inner.geometry.ways().to_string().into_bytes(),
            version.to_string().into_bytes(),
        ];
        let key = self.set_key(digest);
        let run = inner.link.eval(&inner.script, &key, &args);
        let value = match tokio::time::timeout(inner.config.timeout, run).await {
            Ok(result) => result?,
            Err(_) => {
                inner.link.forget_after_timeout();
                return Err(StoreError::Timeout(inner.config.timeout));
            }
        };
        let (answer, unreadable): (i64, i64) =
            redis::from_redis_value(&value).map_err(|error| {
                StoreError::Protocol(format!("the set script answered {value:?}: {error}"))
            })?;
        if unreadable != 0 {
            inner.unreadable.fetch_add(1, Ordering::Relaxed);
        }
        Ok(answer)
    }

    async fn held(&self, op: Op, digest: Digest) -> Result<bool, StoreError> {
        match self.update(op, digest).await? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(StoreError::Protocol(format!(
                "the set script answered {other} to a {op:?}"
            ))),
        }
    }
}

impl Store for RedisStore {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        match self.update(Op::Claim, digest).await? {
            0 => Ok(Claim::New),
            1 => Ok(Claim::InFlight),
            2 => Ok(Claim::Duplicate),
            other => Err(StoreError::Protocol(format!(
                "the set script answered {other} to a claim"
            ))),
        }
    }

    /// Claims many digests at once: the claims go out together on the multiplexed
    /// connections (one write per node) and are answered in order.
    ///
    /// If any claim fails, the whole batch is an error, although other claims may already
    /// be written; those entries are in flight under this owner and expire with the lease.
    async fn claim_many(&self, digests: &[Digest]) -> Result<Vec<Claim>, StoreError> {
        try_join_all(digests.iter().map(|&digest| self.claim(digest))).await
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Commit, digest).await
    }

    /// Commits many digests at once, written together on the multiplexed connections.
    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        join_all(digests.iter().map(|&digest| self.held(Op::Commit, digest))).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Erase, digest).await
    }

    /// Erases many digests at once, as [`Store::commit_many`] commits them.
    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        join_all(digests.iter().map(|&digest| self.held(Op::Erase, digest))).await
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        self.held(Op::Renew, digest).await
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.inner.geometry)
    }
}
