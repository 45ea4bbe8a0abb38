//! `run` flags of the `[store]` section: where the table lives and how large it is.

use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{Dur, RawConfig, StoreKind};
use nsq_dedupe::dedup::table_file::OnMismatch;

use super::Overlay;
use crate::cli::parse::{
    named, parse_buckets, parse_duration, parse_memory_text, parse_probability, parse_rate,
    parse_ways,
};

/// The environment variable that may hold the Redis password.
pub(crate) const REDIS_PASSWORD_ENV: &str = nsq_dedupe::RedisConfig::PASSWORD_ENV;

/// Where the table lives and how large it is.
#[derive(Debug, Args)]
#[command(next_help_heading = "Store")]
pub(crate) struct StoreFlags {
    /// Where the table lives. `store.kind`.
    #[arg(long, value_name = "STORE", value_parser = named(&StoreKind::NAMES))]
    pub(crate) store: Option<StoreKind>,
    /// Memcached server host:port (repeatable, or comma-separated). `store.memcached_addresses`.
    #[arg(long = "memcached-address", value_name = "ADDR", value_delimiter = ',')]
    pub(crate) memcached_addresses: Vec<String>,
    /// Redis URL (repeatable): `redis://[user:password@]host:port[/db]`, or `rediss://` for
    /// TLS; several only with --redis-cluster. `store.redis_urls`.
    #[arg(long = "redis-url", value_name = "URL")]
    pub(crate) redis_urls: Vec<String>,
    /// The Redis URLs are seed nodes of a Redis Cluster. `store.redis_cluster`.
    #[arg(long)]
    pub(crate) redis_cluster: bool,
    /// File whose first line is the Redis password (else NSQ_DEDUPE_REDIS_PASSWORD, or the
    /// URL's). `store.redis_password_file`.
    #[arg(long, value_name = "FILE")]
    pub(crate) redis_password_file: Option<std::path::PathBuf>,
    /// PEM file of CA certificates trusted for rediss:// besides the system's roots.
    /// `store.redis_tls_root_ca_file`.
    #[arg(long, value_name = "FILE")]
    pub(crate) redis_tls_root_ca_file: Option<std::path::PathBuf>,
    /// Table size in slots. `store.buckets`.
    #[arg(long, value_name = "N", value_parser = parse_buckets)]
    pub(crate) buckets: Option<u64>,
    /// Table size as the slots' memory, such as 64MiB or 1GiB (twice that with --max-age);
    /// rounded down to whole sets. `store.memory`.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_text, conflicts_with_all = ["buckets", "probability"])]
    pub(crate) memory: Option<String>,
    /// Slots per set: 1, 2, 4 or 8. `store.ways`.
    #[arg(long, value_name = "W", value_parser = parse_ways)]
    pub(crate) ways: Option<u32>,
    /// Size the table for this catch probability a whole window late (with --rate and
    /// --window). `store.probability`.
    #[arg(
        long,
        value_name = "P",
        value_parser = parse_probability,
        conflicts_with = "buckets",
        allow_negative_numbers = true
    )]
    pub(crate) probability: Option<f64>,
    /// Distinct messages per second, for sizing and the reported catch probability. `store.rate`.
    #[arg(long, value_name = "MSG/S", value_parser = parse_rate, allow_negative_numbers = true)]
    pub(crate) rate: Option<f64>,
    /// How late a copy may arrive and still be caught (default 1h). `store.window`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) window: Option<Duration>,
    /// Prefix of the shared store's keys; consumers with the same one share a table.
    /// `store.namespace`.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) namespace: Option<String>,
    /// How long a shared store's claim stays in flight without renewal (default msg-timeout + 5s).
    /// `store.lease`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lease: Option<Duration>,
    /// Bound on each Memcached network step or Redis operation (default 500ms). `store.timeout`.
    #[arg(long = "store-timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,
    /// With a shared store (Memcached, Redis): a local table of this size (such as 16MiB)
    /// holding the digests this process committed, answered without a round trip; `off` for
    /// none (default: a quarter of the table's slots, 1MiB to 64MiB). `store.near_table`.
    #[arg(long, value_name = "SIZE")]
    pub(crate) near_table: Option<String>,
    /// With two Memcached servers or more: after one has failed this long, its sets go to the
    /// next server until it answers again; `off` never ejects (default 10s).
    /// `store.eject_after`.
    #[arg(long, value_name = "DURATION|off")]
    pub(crate) eject_after: Option<String>,
    /// With Memcached or Redis: how often this consumer adds its distinct count to the fleet's counters
    /// in the store (default 10s); the fleet's rate covers 6 of them and is reported after 7.
    /// The same in every consumer of the table. `store.fleet_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) fleet_interval: Option<Duration>,
    /// Keep the in-process table in this file between runs (snapshots). `store.table_file`.
    #[arg(long, value_name = "FILE")]
    pub(crate) table_file: Option<std::path::PathBuf>,
    /// How often the table file is written (default 10s): what a kill -9 can forget.
    /// `store.snapshot_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) snapshot_interval: Option<Duration>,
    /// A table file that does not match or is damaged: `error` (default) or `recreate` (moved
    /// aside, start empty). `store.table_file_on_mismatch`.
    #[arg(long, value_name = "POLICY", value_parser = named(&OnMismatch::NAMES))]
    pub(crate) table_file_on_mismatch: Option<OnMismatch>,
    /// Each commit waits until its journal record is on disk: a machine crash then loses
    /// nothing answered (a kill -9 loses nothing either way). `store.journal_fsync`.
    #[arg(long)]
    pub(crate) journal_fsync: bool,
}

impl StoreFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        let store = &mut raw.store;
        overlay.value(
            &mut store.kind,
            self.store.as_ref(),
            "store.kind",
            "--store",
        );
        overlay.list(
            &mut store.memcached_addresses,
            &self.memcached_addresses,
            "store.memcached_addresses",
            "--memcached-address",
        );
        overlay.list(
            &mut store.redis_urls,
            &self.redis_urls,
            "store.redis_urls",
            "--redis-url",
        );
        overlay.value(
            &mut store.redis_cluster,
            self.redis_cluster.then_some(true).as_ref(),
            "store.redis_cluster",
            "--redis-cluster",
        );
        overlay.value(
            &mut store.redis_password_file,
            self.redis_password_file.as_ref(),
            "store.redis_password_file",
            "--redis-password-file",
        );
        overlay.value(
            &mut store.redis_tls_root_ca_file,
            self.redis_tls_root_ca_file.as_ref(),
            "store.redis_tls_root_ca_file",
            "--redis-tls-root-ca-file",
        );
        // The password itself is never a flag (a command line is visible to every user of
        // the machine); the environment may carry it.
        if let Ok(password) = std::env::var(REDIS_PASSWORD_ENV) {
            if !password.is_empty() {
                store.redis_password = Some(nsq_dedupe::RedisPassword::new(password));
            }
        }
        if self.buckets.is_some() || self.memory.is_some() {
            // Flags win over the file: an explicit size replaces the file's other sizing.
            store.probability = None;
            store.memory = None;
            store.buckets = None;
        }
        overlay.value(
            &mut store.memory,
            self.memory.as_ref(),
            "store.memory",
            "--memory",
        );
        overlay.value(
            &mut store.buckets,
            self.buckets.as_ref(),
            "store.buckets",
            "--buckets",
        );
        overlay.value(&mut store.ways, self.ways.as_ref(), "store.ways", "--ways");
        if self.probability.is_some() {
            // Flags win over the file: probability-based sizing replaces an explicit size.
            store.buckets = None;
            store.memory = None;
        }
        overlay.value(
            &mut store.probability,
            self.probability.as_ref(),
            "store.probability",
            "--probability",
        );
        overlay.value(&mut store.rate, self.rate.as_ref(), "store.rate", "--rate");
        overlay.value(
            &mut store.window,
            self.window.map(Dur).as_ref(),
            "store.window",
            "--window",
        );
        overlay.value(
            &mut store.namespace,
            self.namespace.as_ref(),
            "store.namespace",
            "--namespace",
        );
        overlay.value(
            &mut store.lease,
            self.lease.map(Dur).as_ref(),
            "store.lease",
            "--lease",
        );
        overlay.value(
            &mut store.timeout,
            self.timeout.map(Dur).as_ref(),
            "store.timeout",
            "--store-timeout",
        );
        overlay.value(
            &mut store.near_table,
            self.near_table.as_ref(),
            "store.near_table",
            "--near-table",
        );
        overlay.value(
            &mut store.eject_after,
            self.eject_after.as_ref(),
            "store.eject_after",
            "--eject-after",
        );
        overlay.value(
            &mut store.fleet_interval,
            self.fleet_interval.map(Dur).as_ref(),
            "store.fleet_interval",
            "--fleet-interval",
        );
        overlay.value(
            &mut store.table_file,
            self.table_file.as_ref(),
            "store.table_file",
            "--table-file",
        );
        overlay.value(
            &mut store.snapshot_interval,
            self.snapshot_interval.map(Dur).as_ref(),
            "store.snapshot_interval",
            "--snapshot-interval",
        );
        overlay.value(
            &mut store.table_file_on_mismatch,
            self.table_file_on_mismatch.as_ref(),
            "store.table_file_on_mismatch",
            "--table-file-on-mismatch",
        );
        overlay.value(
            &mut store.journal_fsync,
            self.journal_fsync.then_some(true).as_ref(),
            "store.journal_fsync",
            "--journal-fsync",
        );
    }
}
