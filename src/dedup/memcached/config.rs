//! Settings of the Memcached store ([`MemcachedConfig`]): defaults, and validation that names
//! the setting without building a store.

use std::time::Duration;

use crate::dedup::shared::{check_settings, DEFAULT_TIMEOUT};
use crate::error::StoreError;
use crate::wording::Wording;

/// How long a server may fail before its sets go to the next server, when not given.
pub(crate) const DEFAULT_EJECT_AFTER: Duration = Duration::from_secs(10);

/// Settings of a [`MemcachedStore`](super::MemcachedStore).
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
    /// Pipelined connections per server: at most this many batches or coalesced pipelines are
    /// on the wire to one server at once. Defaults to: 4.
    ///
    /// Coalesced pipelines grow while all are busy, so a few suffice even across a network;
    /// fewer, larger pipelines also cost memcached less CPU per operation. With 64 tasks on a
    /// two-core machine, 4 gave 69 k claims/s and 8 gave 50 to 60 k.
    pub pool_size: usize,
    /// How many times an operation reads and tries to write a set before giving up with
    /// [`StoreError::Contended`]. Defaults to: 16.
    pub max_cas_retries: u32,
    /// Whether concurrent single operations (`claim`, `commit`, `erase`, `renew`) are sent
    /// together in pipelines, which multiplies throughput under concurrency; when off, each is
    /// a pipeline of its own (two round trips: read, write). Defaults to: `true`.
    pub coalesce: bool,
    /// Done entries committed longer ago than this count as not seen (`dedupe.max_age`).
    /// Defaults to: `None` (entries are forgotten only by eviction).
    pub max_age: Option<Duration>,
    /// A server whose operations have failed this long, with no success in between, is
    /// ejected: its sets go to the next server in their rendezvous order until it answers
    /// again (see `health`). `None` never ejects. Only with two servers or more. Defaults to:
    /// 10 s, long enough for a restart to come back on its own, short enough that a dead
    /// server's messages are requeued only a few times.
    pub eject_after: Option<Duration>,
    /// How often this consumer adds its distinct count to the fleet's counters, and the
    /// length of one counter: the fleet's rate is measured over six of them and reported after
    /// seven (see [`fleet`](crate::dedup::fleet)). Every consumer of the table needs the
    /// same. Defaults to: 10 s.
    pub fleet_interval: Duration,
    /// Slots one memcached item holds in the compact layout (key format 2): whole sets of
    /// the table, as many as fit (one at least). More slots spread an item's own overhead
    /// (its header and key, about 80 bytes) over more entries, and make each claim and commit
    /// write a larger value; see the trade-off in docs/design.md. A part of the table's
    /// layout, as its geometry is: every consumer of a table needs the same (it is in the
    /// item keys, so consumers that differ share nothing). From 1 to 255. Defaults to: 64.
    pub slots_per_item: u32,
}

impl Default for MemcachedConfig {
    fn default() -> Self {
        MemcachedConfig {
            servers: vec!["127.0.0.1:11211".to_owned()],
            namespace: "nsq-dedupe".to_owned(),
            lease: Duration::from_secs(65),
            timeout: DEFAULT_TIMEOUT,
            pool_size: 4,
            max_cas_retries: 16,
            max_age: None,
            coalesce: true,
            eject_after: Some(DEFAULT_EJECT_AFTER),
            fleet_interval: crate::dedup::fleet::DEFAULT_FLEET_INTERVAL,
            slots_per_item: crate::dedup::MEMCACHED_SLOTS_PER_ITEM,
        }
    }
}

impl MemcachedConfig {
    /// Checks every setting without connecting or building anything.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] naming the first setting that is wrong.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |detail: Wording| Err(StoreError::Config(detail));
        if self.servers.is_empty() {
            return invalid(
                Wording::default()
                    .key("store.memcached_addresses")
                    .text(" is empty; give at least one host:port"),
            );
        }
        if let Some(bad) = self
            .servers
            .iter()
            .find(|s| s.is_empty() || s.chars().any(char::is_whitespace))
        {
            return invalid(
                Wording::default()
                    .key("store.memcached_addresses")
                    .text(format!(" entry {bad:?} is not a host:port")),
            );
        }
        check_settings(
            &self.namespace,
            self.lease,
            self.timeout,
            self.fleet_interval,
        )?;
        if self.pool_size == 0 {
            return invalid("`pool_size` (MemcachedConfig) must be at least 1".into());
        }
        if self.max_cas_retries == 0 {
            return invalid("`max_cas_retries` (MemcachedConfig) must be at least 1".into());
        }
        if !(1..=crate::dedup::compact::MAX_SLOTS as u32).contains(&self.slots_per_item) {
            return invalid(
                format!(
                    "`slots_per_item` (MemcachedConfig) must be from 1 to {}, got {}",
                    crate::dedup::compact::MAX_SLOTS,
                    self.slots_per_item
                )
                .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_validated() {
        let bad = |config: MemcachedConfig| config.validate().unwrap_err().to_string();
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
        assert_eq!(
            bad(MemcachedConfig {
                slots_per_item: 256,
                ..Default::default()
            }),
            "invalid store configuration: `slots_per_item` (MemcachedConfig) must be from 1 \
             to 255, got 256"
        );
    }
}
