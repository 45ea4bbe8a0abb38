//! `run` flags of the `[dead_letter]` section: where undeliverable messages go. Which kind of
//! dead-letter the flags make depends on which of them are given, so they are laid over the
//! file here rather than from a section's table.

use std::path::PathBuf;

use clap::Args;
use nsq_dedupe::config::{DeadLetterKind, RawConfig, RawDeadLetter};

use super::Overlay;

/// Where undeliverable messages go.
#[derive(Debug, Args)]
#[command(next_help_heading = "Service")]
pub(crate) struct DeadLetterFlags {
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

impl DeadLetterFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
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
