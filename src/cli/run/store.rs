//! `run` flags of the `[store]` section: where the table lives and how large it is.

use clap::Args;
use nsq_dedupe::config::{RawConfig, StoreKind};

use super::Overlay;
use crate::cli::parse::{named, parse_buckets, parse_ways};

/// Where the table lives and how large it is.
#[derive(Debug, Args)]
#[command(next_help_heading = "Store")]
pub(crate) struct StoreFlags {
    /// Where the table lives. `store.kind`.
    #[arg(long, value_name = "STORE", value_parser = named(&StoreKind::NAMES))]
    pub(crate) store: Option<StoreKind>,
    /// Memcached server host:port (repeatable). `store.memcached_addresses`.
    #[arg(long = "memcached-address", value_name = "ADDR")]
    pub(crate) memcached_addresses: Vec<String>,
    /// Table size in slots. `store.buckets`.
    #[arg(long, value_name = "N", value_parser = parse_buckets)]
    pub(crate) buckets: Option<u64>,
    /// Slots per set: 1, 2, 4 or 8. `store.ways`.
    #[arg(long, value_name = "W", value_parser = parse_ways)]
    pub(crate) ways: Option<u32>,
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
        if self.buckets.is_some() {
            // Flags win over the file: an explicit size replaces probability-based sizing.
            store.probability = None;
        }
        overlay.value(
            &mut store.buckets,
            self.buckets.as_ref(),
            "store.buckets",
            "--buckets",
        );
        overlay.value(&mut store.ways, self.ways.as_ref(), "store.ways", "--ways");
    }
}
