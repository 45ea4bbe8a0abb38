//! `run` flags of the `[dedupe]` section: how bodies are keyed and what happens to each outcome.

use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{Dur, RawConfig};
use nsq_dedupe::pipeline::{InFlightPolicy, StoreErrorPolicy};

use super::Overlay;
use crate::cli::parse::{named, parse_duration};

/// How bodies are keyed and what happens to each outcome.
#[derive(Debug, Args)]
#[command(next_help_heading = "De-duplication")]
pub(crate) struct DedupeFlags {
    /// Key of a body: `body` or `json:<pointer>`. `dedupe.key`.
    #[arg(long, value_name = "KEY")]
    pub(crate) key: Option<String>,
    /// Digest of the key: `xxh3`, `xxh3:<seed>`, `md5`, or `blake3` with --digest-key-file.
    /// `dedupe.digest`.
    #[arg(long, value_name = "DIGEST")]
    pub(crate) digest: Option<String>,
    /// Copies arriving longer after their original than this (such as 10m) pass again:
    /// for bodies that repeat on purpose. Off by default. `dedupe.max_age`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) max_age: Option<Duration>,
    /// File with a 32-byte key (raw or 64 hex digits): digests become keyed BLAKE3, which
    /// nobody without the key can predict. Every consumer sharing a Memcached table needs the
    /// same key. `dedupe.digest_key_file`.
    #[arg(long, value_name = "FILE")]
    pub(crate) digest_key_file: Option<std::path::PathBuf>,
    /// A copy whose original is being handled: requeue it (default) or finish it.
    /// `dedupe.on_in_flight`.
    #[arg(long, value_name = "POLICY", value_parser = named(&InFlightPolicy::NAMES))]
    pub(crate) on_in_flight: Option<InFlightPolicy>,
    /// Requeue delay of such a copy (default 1s). `dedupe.in_flight_requeue_delay`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) in_flight_requeue_delay: Option<Duration>,
    /// When the store fails: requeue the message (default) or process it without
    /// de-duplication. `dedupe.on_store_error`.
    #[arg(long, value_name = "POLICY", value_parser = named(&StoreErrorPolicy::NAMES))]
    pub(crate) on_store_error: Option<StoreErrorPolicy>,
    /// Requeue delay after a store error (default 1s). `dedupe.store_error_requeue_delay`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) store_error_requeue_delay: Option<Duration>,
}

impl DedupeFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        let dedupe = &mut raw.dedupe;
        overlay.value(&mut dedupe.key, self.key.as_ref(), "dedupe.key", "--key");
        overlay.value(
            &mut dedupe.digest,
            self.digest.as_ref(),
            "dedupe.digest",
            "--digest",
        );
        overlay.value(
            &mut dedupe.max_age,
            self.max_age.map(Dur).as_ref(),
            "dedupe.max_age",
            "--max-age",
        );
        overlay.value(
            &mut dedupe.digest_key_file,
            self.digest_key_file.as_ref(),
            "dedupe.digest_key_file",
            "--digest-key-file",
        );
        overlay.value(
            &mut dedupe.on_in_flight,
            self.on_in_flight.as_ref(),
            "dedupe.on_in_flight",
            "--on-in-flight",
        );
        overlay.value(
            &mut dedupe.in_flight_requeue_delay,
            self.in_flight_requeue_delay.map(Dur).as_ref(),
            "dedupe.in_flight_requeue_delay",
            "--in-flight-requeue-delay",
        );
        overlay.value(
            &mut dedupe.on_store_error,
            self.on_store_error.as_ref(),
            "dedupe.on_store_error",
            "--on-store-error",
        );
        overlay.value(
            &mut dedupe.store_error_requeue_delay,
            self.store_error_requeue_delay.map(Dur).as_ref(),
            "dedupe.store_error_requeue_delay",
            "--store-error-requeue-delay",
        );
    }
}
