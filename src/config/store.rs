//! `[store]`: where the table lives and how large it is, validated into [`StoreSettings`].
//!
//! The table's shape rules are [`Geometry`]'s, the sizing maths is [`crate::sizing`]'s and the
//! Memcached rules are [`MemcachedConfig`]'s; this module picks between explicit sizes and
//! probability-based sizing and names the key that is wrong.

use std::path::PathBuf;
use std::time::Duration;

use crate::dedup::table_file::OnMismatch;
use crate::setting::{names, section, DefaultValue, FlagValue, Only};

use super::{check_host_port, invalid, quote, ConfigError, Dur, Wording};
use crate::dedup::near::NearTable;
use crate::dedup::Geometry;
use crate::sizing::growth::{self, Growth};
use crate::{MemcachedConfig, RedisConfig, RedisPassword};

pub use crate::sizing::DEFAULT_WINDOW;

/// What `[store]` says for either shared store, checked; `None` where the store's default
/// applies.
struct SharedSettings {
    namespace: Option<String>,
    lease: Duration,
    timeout: Option<Duration>,
    fleet_interval: Option<Duration>,
}

impl SharedSettings {
    /// Writes what was set over a store's defaults.
    fn apply(
        self,
        namespace: &mut String,
        lease: &mut Duration,
        timeout: &mut Duration,
        fleet_interval: &mut Duration,
    ) {
        if let Some(ns) = self.namespace {
            *namespace = ns;
        }
        *lease = self.lease;
        if let Some(t) = self.timeout {
            *timeout = t;
        }
        if let Some(interval) = self.fleet_interval {
            *fleet_interval = interval;
        }
    }
}

/// Which store keeps the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The in-process table.
    Memory,
    /// A table shared through Memcached.
    Memcached,
    /// A table shared through Redis or a Redis Cluster.
    Redis,
    /// No de-duplication (a baseline).
    None,
}

impl crate::setting::Overlay for StoreKind {}
impl crate::setting::Overlay for OnMismatch {}

impl StoreKind {
    /// The kind's name in the config file and on the command line.
    pub fn name(self) -> &'static str {
        crate::setting::name_of(&Self::NAMES, self)
    }

    /// Whether the table lives in a store shared by many consumers (and has a near-table in
    /// front of it).
    pub fn is_shared(self) -> bool {
        matches!(self, StoreKind::Memcached | StoreKind::Redis)
    }

    /// Every kind with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, StoreKind); 4] = [
        ("memory", StoreKind::Memory),
        ("memcached", StoreKind::Memcached),
        ("redis", StoreKind::Redis),
        ("none", StoreKind::None),
    ];
}

const STORE_KINDS: [&str; 4] = names(&StoreKind::NAMES);
const ON_MISMATCH: [&str; 3] = names(&OnMismatch::NAMES);

/// Settings of a table, wherever it lives.
pub(super) const TABLE: Only =
    Only::any("store.kind", &["memory", "memcached", "redis"], "a table");

/// Settings of a table shared through Memcached or Redis.
const SHARED: Only = Only::any("store.kind", &["memcached", "redis"], "a shared table");

/// Settings of the in-process table.
const MEMORY: Only = Only::any("store.kind", &["memory"], "the in-process table");

/// Settings of Memcached.
const MEMCACHED: Only = Only::one("store.kind", &["memcached"]);

/// Settings of Redis.
const REDIS: Only = Only::one("store.kind", &["redis"]);

section! {
    /// `[store]`: where the table lives and how large it is.
    pub struct RawStore in "store", heading "Store" {
        /// Where the table lives.
        kind: StoreKind, flag("store", rank: 1, value_name: "STORE", value: FlagValue::Names(&STORE_KINDS));
        /// Table size in slots.
        buckets: u64, only(&TABLE),
            flag("buckets", rank: 7, value_name: "N", value: FlagValue::Buckets,
                 replaces: &["probability", "memory"]);
        /// Table size as the slots' memory, such as 64MiB or 1GiB (twice that with --max-age);
        /// rounded down to whole sets.
        memory: String, only(&TABLE),
            flag("memory", rank: 8, value_name: "SIZE", value: FlagValue::Memory,
                 conflicts: &["buckets", "probability"], replaces: &["probability", "buckets"]);
        /// Slots per set: 1, 2, 4 or 8.
        ways: u32, only(&TABLE), flag("ways", rank: 9, value_name: "W", value: FlagValue::Ways);
        /// Size the table for this catch probability a whole window late (with --rate and
        /// --window).
        probability: f64, only(&TABLE),
            flag("probability", rank: 10, value_name: "P", value: FlagValue::Probability,
                 conflicts: &["buckets"], replaces: &["buckets", "memory"]);
        /// Distinct messages per second, for sizing and the reported catch probability. Alone,
        /// it sizes the table for the default target probability, 0.99, over the window.
        /// Without it (and without --buckets or --memory), the table sizes itself for
        /// --probability at the rate it meets (a shared table, at the fleet's).
        rate: f64, only(&TABLE), flag("rate", rank: 11, value_name: "MSG/S", value: FlagValue::Rate);
        /// The most a table sizing itself (--probability without --rate) may take, all its
        /// generations together, such as 256MiB (default: a quarter of the machine's memory,
        /// at most 1GiB; a shared table counts as an in-process one of its buckets, once for
        /// the whole fleet).
        max_memory: String, only(&TABLE),
            flag("max-memory", rank: 12, value_name: "SIZE");
        /// How late a copy may arrive and still be caught (default {default}).
        window: Dur, default(DefaultValue::Duration(DEFAULT_WINDOW)), only(&TABLE),
            flag("window", rank: 13, value_name: "DURATION", value: FlagValue::Duration);
        /// Memcached server host:port (repeatable, or comma-separated).
        memcached_addresses: Vec<String>, only(&MEMCACHED),
            flag("memcached-address", rank: 2, value_name: "ADDR", value: FlagValue::List { delimiter: Some(',') });
        /// Prefix of the shared store's keys; consumers with the same one share a table (default: the stream's, `nsq-dedupe.<topic>.<channel>`).
        namespace: String, only(&SHARED), flag("namespace", rank: 14, value_name: "PREFIX");
        /// How long a shared store's claim stays in flight without renewal (default msg-timeout + 5s).
        lease: Dur, only(&SHARED),
            flag("lease", rank: 15, value_name: "DURATION", value: FlagValue::Duration);
        /// Bound on each Memcached network step or Redis operation (default {default}).
        timeout: Dur, default(DefaultValue::Duration(crate::dedup::shared::DEFAULT_TIMEOUT)), only(&SHARED),
            flag("store-timeout", rank: 16, value_name: "DURATION", value: FlagValue::Duration);
        /// Keep the in-process table in this file between runs (snapshots).
        table_file: PathBuf, only(&MEMORY),
            flag("table-file", rank: 20, value_name: "FILE", value: FlagValue::Path);
        /// How often the table file is written (default {default}): what a kill -9 can forget.
        snapshot_interval: Dur, default(DefaultValue::Duration(DEFAULT_SNAPSHOT_INTERVAL)),
            flag("snapshot-interval", rank: 21, value_name: "DURATION", value: FlagValue::Duration);
        /// A table file of another size: `resize` (kept as the previous generation), `error`,
        /// or `recreate` (moved aside, start empty; also for other mismatches and damage)
        /// (default {default}).
        table_file_on_mismatch: OnMismatch, default(DefaultValue::Text("resize")),
            flag("table-file-on-mismatch", rank: 22, value_name: "POLICY", value: FlagValue::Names(&ON_MISMATCH));
        /// Each commit waits until its journal record is on disk: a machine crash then loses
        /// nothing answered (a kill -9 loses nothing either way).
        journal_fsync: bool, flag("journal-fsync", rank: 23, value: FlagValue::Switch);
        /// With a shared store (Memcached, Redis): a local table of this size (such as 16MiB)
        /// holding the digests this process committed, answered without a round trip; `off` for
        /// none (default: a quarter of the table's slots, 1MiB to 64MiB).
        near_table: String, only(&SHARED), flag("near-table", rank: 17, value_name: "SIZE");
        /// With two Memcached servers or more: after one has failed this long, its sets go to the
        /// next server until it answers again; `off` never ejects (default {default}).
        eject_after: String, default(DefaultValue::Duration(crate::dedup::memcached::DEFAULT_EJECT_AFTER)), only(&MEMCACHED), flag("eject-after", rank: 18, value_name: "DURATION|off");
        /// Redis URL (repeatable): `redis://[user:password@]host:port[/db]`, or `rediss://` for
        /// TLS; several only with --redis-cluster.
        redis_urls: Vec<String>, only(&REDIS),
            flag("redis-url", rank: 3, value_name: "URL", value: FlagValue::List { delimiter: None });
        /// The Redis URLs are seed nodes of a Redis Cluster.
        redis_cluster: bool, only(&REDIS), flag("redis-cluster", rank: 4, value: FlagValue::Switch);
        /// PEM file of CA certificates trusted for rediss:// besides the system's roots.
        redis_tls_root_ca_file: PathBuf, only(&REDIS),
            flag("redis-tls-root-ca-file", rank: 6, value_name: "FILE", value: FlagValue::Path);
        /// File whose first line is the Redis password (else NSQ_DEDUPE_REDIS_PASSWORD, or the
        /// URL's).
        redis_password_file: PathBuf, only(&REDIS),
            flag("redis-password-file", rank: 5, value_name: "FILE", value: FlagValue::Path);
        /// With Memcached or Redis: how often this consumer adds its distinct count to the fleet's counters
        /// in the store (default {default}); the fleet's rate covers 6 of them and is reported after 7.
        /// The same in every consumer of the table.
        fleet_interval: Dur, default(DefaultValue::Duration(crate::dedup::fleet::DEFAULT_FLEET_INTERVAL)), only(&SHARED),
            flag("fleet-interval", rank: 19, value_name: "DURATION", value: FlagValue::Duration);
    }
    extra {
        /// The Redis password from the environment ([`RedisConfig::PASSWORD_ENV`]), set by the
        /// binary; never read from a file's text.
        #[serde(skip)]
        pub redis_password: Option<RedisPassword>,
    }
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
    /// Redis table of this shape.
    Redis(RedisConfig, Geometry),
    /// No de-duplication.
    None,
}

impl RawStore {
    /// `store.near_table`: the shape of the near-table in front of a shared store: by default
    /// [`NearTable::default_geometry`] of the shared table's, none with `"off"`.
    pub(super) fn near_table_geometry(
        &self,
        shared: Geometry,
    ) -> Result<Option<Geometry>, ConfigError> {
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
    pub(super) fn table_file_settings(&self) -> Result<Option<TableFileSettings>, ConfigError> {
        // Which store kinds use a table file is `unused`'s rule, checked before this.
        let Some(path) = &self.table_file else {
            return Ok(None);
        };
        super::output_name::check_uncompressed(
            "store.table_file",
            &path.to_string_lossy(),
            "the table file",
            "nsq-dedupe's own snapshot",
        )?;
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

    /// The store, the window, and how the in-process table sizes itself when it does;
    /// `timed`: whether `max_age` puts a time beside each slot.
    pub(super) fn validate(
        &self,
        msg_timeout: Duration,
        timed: bool,
    ) -> Result<(StoreSettings, Duration, Option<Growth>), ConfigError> {
        let window = self.window.map_or(DEFAULT_WINDOW, |d| d.0);
        if window.is_zero() {
            return Err(invalid("store.window", "\"0s\"", "must be more than 0"));
        }
        let growth = self.growth(window, timed)?;
        let geometry = match growth {
            Some(growth) => {
                let ways = self.ways.unwrap_or(8);
                growth.initial(ways).map_err(|reason| {
                    invalid(
                        "store.max_memory",
                        quote(self.max_memory.as_deref()),
                        reason,
                    )
                })?
            }
            None => self.geometry(window)?,
        };
        let store = match self.kind.unwrap_or(StoreKind::Memory) {
            StoreKind::Memory => StoreSettings::Memory(geometry),
            StoreKind::None => StoreSettings::None,
            StoreKind::Memcached => {
                StoreSettings::Memcached(self.memcached(msg_timeout)?, geometry)
            }
            StoreKind::Redis => StoreSettings::Redis(self.redis(msg_timeout)?, geometry),
        };
        Ok((store, window, growth))
    }

    /// How the table sizes itself (in process, or shared): with `store.probability` and no
    /// `store.rate` (nor `store.buckets` or `store.memory`), within `store.max_memory`.
    fn growth(&self, window: Duration, timed: bool) -> Result<Option<Growth>, ConfigError> {
        let table = !matches!(self.kind, Some(StoreKind::None));
        let (Some(probability), None, None, None, true) = (
            self.probability,
            self.rate,
            self.buckets,
            &self.memory,
            table,
        ) else {
            return Ok(None);
        };
        crate::sizing::check_probability(probability).map_err(|error| {
            invalid(
                "store.probability",
                probability.to_string(),
                error.to_string(),
            )
        })?;
        let max_bytes = match &self.max_memory {
            Some(text) => crate::units::parse_bytes(text)
                .map_err(|reason| invalid("store.max_memory", quote(Some(text)), reason))?,
            None => growth::default_max_bytes(crate::dedup::table::machine_memory_bytes()),
        };
        Ok(Some(Growth {
            probability,
            window,
            max_bytes,
            slot_bytes: Geometry::SLOT_BYTES * if timed { 2 } else { 1 },
        }))
    }

    /// Refuses an in-process table larger than this machine's memory, under the setting that
    /// sized it: every start would fail to allocate it (or be killed once it fills) the same
    /// way, so it is a setting to change. `near_table` is the near-table of a shared store,
    /// and `timed` whether `max_age` puts a time beside each slot. The default sizes (64 MiB,
    /// and at most 64 MiB for a near-table) are not checked here; their allocation still is.
    pub(super) fn check_fits(
        &self,
        store: &StoreSettings,
        near_table: Option<Geometry>,
        timed: bool,
    ) -> Result<(), ConfigError> {
        let (geometry, key, value, smaller) = match (store, near_table, &self.near_table) {
            (StoreSettings::Memory(geometry), ..) => {
                match (&self.memory, self.buckets, self.probability) {
                    (Some(text), ..) => (
                        *geometry,
                        "store.memory",
                        quote(Some(text)),
                        Wording::default().key("store.memory"),
                    ),
                    (None, Some(buckets), _) => (
                        *geometry,
                        "store.buckets",
                        buckets.to_string(),
                        Wording::default().key("store.buckets"),
                    ),
                    (None, None, Some(probability)) => (
                        *geometry,
                        "store.probability",
                        probability.to_string(),
                        Wording::default()
                            .key("store.probability")
                            .text(", ")
                            .key("store.rate")
                            .text(" or ")
                            .key("store.window"),
                    ),
                    (None, None, None) => match self.rate {
                        Some(rate) => (
                            *geometry,
                            "store.rate",
                            rate.to_string(),
                            Wording::default()
                                .key("store.rate")
                                .text(" or ")
                                .key("store.window"),
                        ),
                        None => return Ok(()),
                    },
                }
            }
            (
                StoreSettings::Memcached(..) | StoreSettings::Redis(..),
                Some(geometry),
                Some(text),
            ) => (
                geometry,
                "store.near_table",
                quote(Some(text)),
                Wording::default().key("store.near_table"),
            ),
            _ => return Ok(()),
        };
        crate::dedup::table::check_fits(geometry, timed).map_err(|error| {
            let reason = Wording::from(format!("{error}; choose a smaller ")).then(smaller);
            invalid(key, value, reason)
        })
    }

    fn geometry(&self, window: Duration) -> Result<Geometry, ConfigError> {
        let ways = self.ways.unwrap_or(8);
        crate::sizing::check_ways(ways)
            .map_err(|reason| invalid("store.ways", ways.to_string(), reason))?;
        if let Some(text) = &self.memory {
            let refuse = |reason: Wording| invalid("store.memory", quote(Some(text)), reason);
            if self.buckets.is_some() || self.probability.is_some() {
                return Err(refuse(
                    Wording::from("give one of ")
                        .key("store.buckets")
                        .text(", ")
                        .key("store.memory")
                        .text(" or ")
                        .key("store.probability")
                        .text(", not two"),
                ));
            }
            if matches!(self.kind, Some(StoreKind::Memcached | StoreKind::Redis)) {
                return Err(refuse(
                    Wording::from("sizes the in-process table; size a shared table with ")
                        .key("store.buckets")
                        .text(" or ")
                        .key("store.probability"),
                ));
            }
            let bytes = crate::units::parse_bytes(text).map_err(|reason| refuse(reason.into()))?;
            return Geometry::with_memory(bytes, ways).map_err(|e| refuse(e.to_string().into()));
        }
        match (self.buckets, self.probability) {
            (Some(_), Some(probability)) => Err(invalid(
                "store.probability",
                probability.to_string(),
                Wording::from("give either ")
                    .key("store.buckets")
                    .text(" or ")
                    .key("store.probability")
                    .text(" with ")
                    .key("store.rate")
                    .text(" and ")
                    .key("store.window")
                    .text(", not both"),
            )),
            (Some(buckets), None) => Geometry::new(buckets, ways)
                .map_err(|e| invalid("store.buckets", buckets.to_string(), e.to_string())),
            (None, given) if given.is_some() || self.rate.is_some() => {
                let rate = self.rate.ok_or(ConfigError::required(
                    "store.rate",
                    Wording::default().key("store.probability"),
                ))?;
                if !crate::sizing::is_rate(rate) {
                    return Err(invalid(
                        "store.rate",
                        rate.to_string(),
                        "must be more than 0 messages per second",
                    ));
                }
                // A rate alone sizes for the default target, as the "too small" warning
                // holds the table to it.
                let probability = given.unwrap_or(crate::sizing::DEFAULT_TARGET_PROBABILITY);
                let messages = rate * window.as_secs_f64();
                let geometry = crate::sizing::slots_for(probability, ways, messages).map_err(
                    |e| match given {
                        Some(_) => {
                            invalid("store.probability", probability.to_string(), e.to_string())
                        }
                        None => invalid("store.rate", rate.to_string(), e.to_string()),
                    },
                )?;
                tracing::info!(
                    probability,
                    probability_given = given.is_some(),
                    rate,
                    window = %crate::units::format_duration(window),
                    buckets = geometry.slots(),
                    ways,
                    memory = %crate::units::format_bytes(geometry.memory_bytes()),
                    "Sized the table from probability, rate and window."
                );
                Ok(geometry)
            }
            (None, _) => Ok(Geometry::new(Geometry::DEFAULT_SLOTS, ways)
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
        self.shared(msg_timeout)?.apply(
            &mut config.namespace,
            &mut config.lease,
            &mut config.timeout,
            &mut config.fleet_interval,
        );
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

    /// The settings both shared stores take (namespace, lease, time limit, fleet interval),
    /// checked.
    fn shared(&self, msg_timeout: Duration) -> Result<SharedSettings, ConfigError> {
        if let Some(ns) = &self.namespace {
            crate::dedup::shared::check_namespace(ns)
                .map_err(|reason| invalid("store.namespace", quote(Some(ns)), reason))?;
        }
        let lease = self
            .lease
            .map_or(msg_timeout + Duration::from_secs(5), |d| d.0);
        if lease < msg_timeout {
            return Err(invalid(
                "store.lease",
                format!("{lease:?}"),
                Wording::from("must be at least ")
                    .key("source.msg_timeout")
                    .text(format!(
                        " ({msg_timeout:?}), or another delivery may take over a claim whose \
                         handler is still running"
                    )),
            ));
        }
        let timeout = match self.timeout {
            Some(Dur(t)) if t.is_zero() => {
                return Err(invalid("store.timeout", "\"0s\"", "must be more than 0"))
            }
            other => other.map(|d| d.0),
        };
        if let Some(Dur(interval)) = self.fleet_interval {
            crate::dedup::fleet::check_fleet_interval(interval).map_err(|reason| {
                let shown = if interval.is_zero() {
                    "0s".to_owned()
                } else {
                    format!("{interval:?}")
                };
                invalid("store.fleet_interval", shown, reason)
            })?;
        }
        Ok(SharedSettings {
            namespace: self.namespace.clone(),
            lease,
            timeout,
            fleet_interval: self.fleet_interval.map(|d| d.0),
        })
    }

    fn redis(&self, msg_timeout: Duration) -> Result<RedisConfig, ConfigError> {
        let mut config = RedisConfig::default();
        if let Some(urls) = &self.redis_urls {
            if urls.is_empty() {
                return Err(invalid(
                    "store.redis_urls",
                    "[]",
                    "give at least one redis:// or rediss:// URL",
                ));
            }
            config.urls = urls.clone();
        }
        config.cluster = self.redis_cluster.unwrap_or(false);
        config.tls_root_ca_file = self.redis_tls_root_ca_file.clone();
        // A password in a URL wins over the file, which wins over the environment.
        config.take_url_passwords()?;
        if config.password.is_none() {
            if let Some(path) = &self.redis_password_file {
                let text = std::fs::read_to_string(path).map_err(|error| {
                    invalid(
                        "store.redis_password_file",
                        quote(Some(&path.display().to_string())),
                        format!("cannot be read: {error}"),
                    )
                })?;
                let password = text.trim_end_matches(['\r', '\n']);
                if password.is_empty() {
                    return Err(invalid(
                        "store.redis_password_file",
                        quote(Some(&path.display().to_string())),
                        "is empty; write the password on its first line",
                    ));
                }
                config.password = Some(RedisPassword::new(password));
                config.password_setting = Some("store.redis_password_file");
            } else if let Some(password) = &self.redis_password {
                config.password = Some(password.clone());
                config.password_setting = Some(RedisConfig::PASSWORD_ENV);
            }
        }
        self.shared(msg_timeout)?.apply(
            &mut config.namespace,
            &mut config.lease,
            &mut config.timeout,
            &mut config.fleet_interval,
        );
        config.validate()?;
        Ok(config)
    }
}
