//! `[store]`: where the table lives and how large it is, validated into [`StoreSettings`].
//!
//! The table's shape rules are [`Geometry`]'s, the sizing maths is [`crate::sizing`]'s and the
//! Memcached rules are [`MemcachedConfig`]'s; this module picks between explicit sizes and
//! probability-based sizing and names the key that is wrong.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::dedup::table_file::OnMismatch;

use super::{check_host_port, invalid, quote, ConfigError, Dur};
use crate::dedup::near::NearTable;
use crate::dedup::Geometry;
use crate::MemcachedConfig;

/// The window the catch probability is reported for when none is configured.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// Which store keeps the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The in-process table.
    Memory,
    /// A table shared through Memcached.
    Memcached,
    /// No de-duplication (a baseline).
    None,
}

impl StoreKind {
    /// Whether the table lives in a store shared by many consumers (and has a near-table in
    /// front of it).
    pub fn is_shared(self) -> bool {
        matches!(self, StoreKind::Memcached)
    }

    /// Every kind with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, StoreKind); 3] = [
        ("memory", StoreKind::Memory),
        ("memcached", StoreKind::Memcached),
        ("none", StoreKind::None),
    ];
}

/// `[store]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub kind: Option<StoreKind>,
    pub buckets: Option<u64>,
    pub memory: Option<String>,
    pub ways: Option<u32>,
    pub probability: Option<f64>,
    pub rate: Option<f64>,
    pub window: Option<Dur>,
    pub memcached_addresses: Option<Vec<String>>,
    pub namespace: Option<String>,
    pub lease: Option<Dur>,
    pub timeout: Option<Dur>,
    pub table_file: Option<PathBuf>,
    pub snapshot_interval: Option<Dur>,
    pub table_file_on_mismatch: Option<OnMismatch>,
    pub journal_fsync: Option<bool>,
    pub near_table: Option<String>,
    pub eject_after: Option<String>,
}

/// How often the in-process table is written to its file when no interval is given: after a
/// kill -9, at most this much (plus one snapshot's writing time) is forgotten.
pub(crate) const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(10);

/// Where the in-process table is kept between runs (`store.table_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFileSettings {
    /// The file.
    pub path: PathBuf,
    /// How often a snapshot is written.
    pub snapshot_interval: Duration,
    /// What a file that does not match or is damaged does.
    pub on_mismatch: OnMismatch,
    /// Commits wait until their journal record is on disk (`store.journal_fsync`), so a
    /// machine crash loses nothing FINished. Defaults to: `false` (a process crash loses
    /// nothing either way).
    pub journal_fsync: bool,
}

/// The validated store choice.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreSettings {
    /// In-process table of this shape.
    Memory(Geometry),
    /// Memcached table of this shape.
    Memcached(MemcachedConfig, Geometry),
    /// No de-duplication.
    None,
}

impl RawStore {
    /// `store.near_table`: the shape of the near-table in front of a shared store: by default
    /// [`NearTable::default_geometry`] of the shared table's, none with `"off"`.
    pub(super) fn near_table(&self, shared: Geometry) -> Result<Option<Geometry>, ConfigError> {
        let shared_store = self.kind.is_some_and(StoreKind::is_shared);
        let Some(text) = &self.near_table else {
            return Ok(shared_store.then(|| NearTable::default_geometry(shared)));
        };
        if text == "off" {
            return Ok(None);
        }
        let bytes = crate::units::parse_bytes(text)
            .map_err(|reason| invalid("store.near_table", quote(Some(text)), reason))?;
        Geometry::with_memory(bytes, 8)
            .map(Some)
            .map_err(|e| invalid("store.near_table", quote(Some(text)), e.to_string()))
    }

    /// `store.table_file` and its settings (`unused` checks that the store is in-process).
    pub(super) fn table_file(&self) -> Result<Option<TableFileSettings>, ConfigError> {
        // Which store kinds use a table file is `unused`'s rule, checked before this.
        let Some(path) = &self.table_file else {
            return Ok(None);
        };
        let snapshot_interval = self
            .snapshot_interval
            .map_or(DEFAULT_SNAPSHOT_INTERVAL, |d| d.0);
        if snapshot_interval < Duration::from_millis(100) {
            return Err(invalid(
                "store.snapshot_interval",
                format!("{snapshot_interval:?}"),
                "must be at least 100ms",
            ));
        }
        Ok(Some(TableFileSettings {
            path: path.clone(),
            snapshot_interval,
            on_mismatch: self.table_file_on_mismatch.unwrap_or_default(),
            journal_fsync: self.journal_fsync.unwrap_or(false),
        }))
    }

    pub(super) fn validate(
        &self,
        msg_timeout: Duration,
    ) -> Result<(StoreSettings, Duration), ConfigError> {
        let window = self.window.map_or(DEFAULT_WINDOW, |d| d.0);
        if window.is_zero() {
            return Err(invalid("store.window", "\"0s\"", "must be more than 0"));
        }
        let geometry = self.geometry(window)?;
        let store = match self.kind.unwrap_or(StoreKind::Memory) {
            StoreKind::Memory => StoreSettings::Memory(geometry),
            StoreKind::None => StoreSettings::None,
            StoreKind::Memcached => {
                StoreSettings::Memcached(self.memcached(msg_timeout)?, geometry)
            }
        };
        Ok((store, window))
    }

    fn geometry(&self, window: Duration) -> Result<Geometry, ConfigError> {
        let ways = self.ways.unwrap_or(8);
        if !Geometry::SUPPORTED_WAYS.contains(&ways) {
            return Err(invalid(
                "store.ways",
                ways.to_string(),
                "expected 1, 2, 4 or 8",
            ));
        }
        if let Some(text) = &self.memory {
            let refuse = |reason: &str| invalid("store.memory", quote(Some(text)), reason);
            if self.buckets.is_some() || self.probability.is_some() {
                return Err(refuse(
                    "give one of `store.buckets`, `store.memory` or `store.probability`, not two",
                ));
            }
            if self.kind == Some(StoreKind::Memcached) {
                return Err(refuse(
                    "sizes the in-process table; size a Memcached table with `store.buckets` or `store.probability`",
                ));
            }
            let bytes = crate::units::parse_bytes(text).map_err(|reason| refuse(&reason))?;
            return Geometry::with_memory(bytes, ways).map_err(|e| refuse(&e.to_string()));
        }
        match (self.buckets, self.probability) {
            (Some(_), Some(probability)) => Err(invalid(
                "store.probability",
                probability.to_string(),
                "give either `store.buckets` or `store.probability` with `store.rate` and `store.window`, not both",
            )),
            (Some(buckets), None) => Geometry::new(buckets, ways)
                .map_err(|e| invalid("store.buckets", buckets.to_string(), e.to_string())),
            (None, Some(probability)) => {
                let rate = self.rate.ok_or(ConfigError::required("store.rate", "`store.probability`"))?;
                if !(rate > 0.0 && rate.is_finite()) {
                    return Err(invalid(
                        "store.rate",
                        rate.to_string(),
                        "must be more than 0 messages per second",
                    ));
                }
                let messages = rate * window.as_secs_f64();
                let geometry = crate::sizing::slots_for(probability, ways, messages).map_err(
                    |e| invalid("store.probability", probability.to_string(), e.to_string()),
                )?;
                tracing::info!(
                    probability,
                    rate,
                    window = %crate::units::format_duration(window),
                    buckets = geometry.slots(),
                    ways,
                    memory = %crate::units::format_bytes(geometry.memory_bytes()),
                    "Sized the table from probability, rate and window."
                );
                Ok(geometry)
            }
            (None, None) => Ok(Geometry::new(Geometry::DEFAULT_SLOTS, ways)
                .expect("the default size is valid for every supported way count")),
        }
    }

    fn memcached(&self, msg_timeout: Duration) -> Result<MemcachedConfig, ConfigError> {
        let mut config = MemcachedConfig::default();
        if let Some(servers) = &self.memcached_addresses {
            if servers.is_empty() {
                return Err(invalid(
                    "store.memcached_addresses",
                    "[]",
                    "give at least one host:port",
                ));
            }
            for s in servers {
                check_host_port("store.memcached_addresses", s)?;
            }
            config.servers = servers.clone();
        }
        if let Some(ns) = &self.namespace {
            crate::dedup::memcached::check_namespace(ns)
                .map_err(|reason| invalid("store.namespace", quote(Some(ns)), reason))?;
            config.namespace = ns.clone();
        }
        config.lease = self
            .lease
            .map_or(msg_timeout + Duration::from_secs(5), |d| d.0);
        if config.lease < msg_timeout {
            return Err(invalid(
                "store.lease",
                format!("{:?}", config.lease),
                format!("must be at least `source.msg_timeout` ({msg_timeout:?}), or another delivery may take over a claim whose handler is still running"),
            ));
        }
        if let Some(Dur(t)) = self.timeout {
            if t.is_zero() {
                return Err(invalid("store.timeout", "\"0s\"", "must be more than 0"));
            }
            config.timeout = t;
        }
        if let Some(text) = &self.eject_after {
            config.eject_after = if text == "off" {
                None
            } else {
                match crate::units::parse_duration(text) {
                    Ok(d) if !d.is_zero() => Some(d),
                    Ok(_) => {
                        return Err(invalid(
                            "store.eject_after",
                            quote(Some(text)),
                            "must be more than 0, or \"off\" to never eject a server",
                        ))
                    }
                    Err(reason) => {
                        return Err(invalid("store.eject_after", quote(Some(text)), reason))
                    }
                }
            };
        }
        // The store's own rules (the namespace's syntax among them), without building a store.
        config.validate()?;
        Ok(config)
    }
}
