//! `run` flags of the `[metrics]`, `[shutdown]` and `[dead_letter]` sections: how the service
//! reports, stops, and where undeliverable messages go.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{DeadLetterKind, Dur, RawConfig, RawDeadLetter};

use super::Overlay;
use crate::cli::parse::parse_duration;

/// How the service reports and stops, and where undeliverable messages go.
#[derive(Debug, Args)]
#[command(next_help_heading = "Service")]
pub(crate) struct ServiceFlags {
    /// Where to serve Prometheus metrics: host:port, :port (every IPv4 interface) or `off`.
    /// `metrics.address`.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_address: Option<String>,
    /// How often the one-line status is logged (default 10s). `metrics.status_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) status_interval: Option<Duration>,
    /// How long running handlers may finish at shutdown (default 10s). `shutdown.grace`.
    #[arg(long = "shutdown-grace", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) grace: Option<Duration>,
    /// Append undeliverable messages to this file (JSON lines). `dead_letter.path` with
    /// `dead_letter.kind = "file"`.
    #[arg(long, value_name = "FILE", conflicts_with = "dead_letter_topic")]
    pub(crate) dead_letter_file: Option<PathBuf>,
    /// Publish undeliverable messages to this topic (on the source nsqd unless
    /// --dead-letter-nsqd-tcp-address). `dead_letter.topic` with `dead_letter.kind = "nsq"`.
    #[arg(long, value_name = "TOPIC")]
    pub(crate) dead_letter_topic: Option<String>,
    /// nsqd TCP address of the dead-letter topic (repeatable, or comma-separated).
    /// `dead_letter.nsqd_tcp_addresses`.
    #[arg(
        long = "dead-letter-nsqd-tcp-address",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub(crate) dead_letter_nsqd_tcp_addresses: Vec<String>,
}

impl ServiceFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        overlay.value(
            &mut raw.metrics.address,
            self.metrics_address.as_ref(),
            "metrics.address",
            "--metrics-address",
        );
        overlay.value(
            &mut raw.metrics.status_interval,
            self.status_interval.map(Dur).as_ref(),
            "metrics.status_interval",
            "--status-interval",
        );
        overlay.value(
            &mut raw.shutdown.grace,
            self.grace.map(Dur).as_ref(),
            "shutdown.grace",
            "--shutdown-grace",
        );
        // The dead-letter's flags set keys only when there is a dead-letter; they name them
        // always.
        for (key, flag) in [
            ("dead_letter.path", "--dead-letter-file"),
            ("dead_letter.topic", "--dead-letter-topic"),
            (
                "dead_letter.nsqd_tcp_addresses",
                "--dead-letter-nsqd-tcp-address",
            ),
        ] {
            overlay.record(key, flag, false);
        }
        // An nsqd address alone means an nsq dead-letter, whose topic the validation then asks
        // for, rather than an address that silently does nothing.
        let kind = match (
            &self.dead_letter_file,
            &self.dead_letter_topic,
            raw.dead_letter.is_none() && !self.dead_letter_nsqd_tcp_addresses.is_empty(),
        ) {
            (Some(_), _, _) => Some(DeadLetterKind::File),
            (None, Some(_), _) | (None, None, true) => Some(DeadLetterKind::Nsq),
            (None, None, false) => None,
        };
        if let Some(kind) = kind {
            // A dead-letter given by flags replaces the file's.
            let dead_letter = raw.dead_letter.insert(RawDeadLetter {
                kind,
                path: None,
                nsqd_tcp_addresses: None,
                topic: None,
            });
            overlay.value(
                &mut dead_letter.path,
                self.dead_letter_file.as_ref(),
                "dead_letter.path",
                "--dead-letter-file",
            );
            overlay.value(
                &mut dead_letter.topic,
                self.dead_letter_topic.as_ref(),
                "dead_letter.topic",
                "--dead-letter-topic",
            );
        }
        if let Some(dead_letter) = raw.dead_letter.as_mut() {
            overlay.list(
                &mut dead_letter.nsqd_tcp_addresses,
                &self.dead_letter_nsqd_tcp_addresses,
                "dead_letter.nsqd_tcp_addresses",
                "--dead-letter-nsqd-tcp-address",
            );
        }
    }
}
