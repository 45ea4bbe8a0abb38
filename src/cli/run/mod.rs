//! Flags of `nsq-dedupe run`, grouped by the config section they override.
//!
//! Each group sits in its own module with the code that lays it over the file's
//! [`RawConfig`], recording which key each flag set so that errors name the flag.

mod dedupe;
mod service;
mod sink;
mod source;
mod store;

use std::path::PathBuf;

use clap::Args;
use nsq_dedupe::config::{FlagOrigins, RawConfig};

/// Flags of `nsq-dedupe run`. Each overrides the config file's key of the same name.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// TOML config file (see config/ for examples).
    #[arg(long, short = 'c', value_name = "FILE", env = "NSQ_DEDUPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) source: source::SourceFlags,
    #[command(flatten)]
    pub(crate) dedupe: dedupe::DedupeFlags,
    #[command(flatten)]
    pub(crate) store: store::StoreFlags,
    #[command(flatten)]
    pub(crate) sink: sink::SinkFlags,
    #[command(flatten)]
    pub(crate) service: service::ServiceFlags,
}

impl RunArgs {
    /// Lays the flags over the file's settings: a flag that was given wins.
    pub(crate) fn apply(&self, raw: &mut RawConfig) {
        let mut flags = std::mem::take(&mut raw.flags);
        let mut overlay = Overlay { flags: &mut flags };
        self.source.apply(raw, &mut overlay);
        self.dedupe.apply(raw, &mut overlay);
        self.store.apply(raw, &mut overlay);
        self.sink.apply(raw, &mut overlay);
        self.service.apply(raw, &mut overlay);
        raw.flags = flags;
    }
}

/// Sets config keys from flags and records which flag set which key.
pub(super) struct Overlay<'a> {
    flags: &'a mut FlagOrigins,
}

impl Overlay<'_> {
    /// Sets `target` to the flag's value, if the flag was given.
    pub(super) fn value<T: Clone>(
        &mut self,
        target: &mut Option<T>,
        value: Option<&T>,
        key: &'static str,
        flag: &'static str,
    ) {
        if let Some(value) = value {
            *target = Some(value.clone());
            self.flags.record(key, flag);
        }
    }

    /// Records that `flag` set `key` by a merge of its own.
    pub(super) fn record(&mut self, key: &'static str, flag: &'static str) {
        self.flags.record(key, flag);
    }

    /// Sets `target` to the values of a repeatable flag, if it was given at least once.
    pub(super) fn list(
        &mut self,
        target: &mut Option<Vec<String>>,
        values: &[String],
        key: &'static str,
        flag: &'static str,
    ) {
        if !values.is_empty() {
            *target = Some(values.to_vec());
            self.flags.record(key, flag);
        }
    }
}
