//! `run` flags of the `[source]` section: what to consume.

use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{Dur, RawConfig};

use super::Overlay;
use crate::cli::parse::{parse_attempts, parse_duration, parse_in_flight};

/// What to consume.
#[derive(Debug, Args)]
#[command(next_help_heading = "Source")]
pub(crate) struct SourceFlags {
    /// nsqd TCP address to consume from (repeatable, or comma-separated).
    /// `source.nsqd_tcp_addresses`.
    #[arg(long = "nsqd-tcp-address", value_name = "ADDR", value_delimiter = ',')]
    pub(crate) nsqd_tcp_addresses: Vec<String>,
    /// nsqlookupd HTTP address, host:port or http:// URL (repeatable, or comma-separated).
    /// `source.lookupd_http_addresses`.
    #[arg(
        long = "lookupd-http-address",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub(crate) lookupd_http_addresses: Vec<String>,
    /// Topic to consume. `source.topic`.
    #[arg(long, value_name = "TOPIC")]
    pub(crate) topic: Option<String>,
    /// Channel to consume (default nsq-dedupe). `source.channel`.
    #[arg(long, value_name = "CHANNEL")]
    pub(crate) channel: Option<String>,
    /// Messages in flight at once (default 200). `source.max_in_flight`.
    #[arg(long, value_name = "N", value_parser = parse_in_flight)]
    pub(crate) max_in_flight: Option<u32>,
    /// nsqd's redelivery timeout for this consumer, such as 60s. `source.msg_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) msg_timeout: Option<Duration>,
    /// Deliveries before a failing message goes to the dead-letter (default 5). `source.max_attempts`.
    #[arg(long, value_name = "N", value_parser = parse_attempts)]
    pub(crate) max_attempts: Option<u16>,
    /// First requeue delay and consumer pause after a handler failure, doubling (default 1s).
    /// `source.backoff`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) backoff: Option<Duration>,
    /// Longest requeue delay and pause (default 2m). `source.max_backoff`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) max_backoff: Option<Duration>,
    /// Heartbeat interval asked of nsqd, 1s to 60s (default 30s). `source.heartbeat_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) heartbeat_interval: Option<Duration>,
    /// How often nsqlookupd is polled (default 60s). `source.lookupd_poll_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lookupd_poll_interval: Option<Duration>,
}

impl SourceFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        let source = &mut raw.source;
        overlay.list(
            &mut source.nsqd_tcp_addresses,
            &self.nsqd_tcp_addresses,
            "source.nsqd_tcp_addresses",
            "--nsqd-tcp-address",
        );
        overlay.list(
            &mut source.lookupd_http_addresses,
            &self.lookupd_http_addresses,
            "source.lookupd_http_addresses",
            "--lookupd-http-address",
        );
        overlay.value(
            &mut source.topic,
            self.topic.as_ref(),
            "source.topic",
            "--topic",
        );
        overlay.value(
            &mut source.channel,
            self.channel.as_ref(),
            "source.channel",
            "--channel",
        );
        overlay.value(
            &mut source.max_in_flight,
            self.max_in_flight.as_ref(),
            "source.max_in_flight",
            "--max-in-flight",
        );
        overlay.value(
            &mut source.msg_timeout,
            self.msg_timeout.map(Dur).as_ref(),
            "source.msg_timeout",
            "--msg-timeout",
        );
        overlay.value(
            &mut source.max_attempts,
            self.max_attempts.as_ref(),
            "source.max_attempts",
            "--max-attempts",
        );
        let durations = [
            (
                &mut source.backoff,
                self.backoff,
                "source.backoff",
                "--backoff",
            ),
            (
                &mut source.max_backoff,
                self.max_backoff,
                "source.max_backoff",
                "--max-backoff",
            ),
            (
                &mut source.heartbeat_interval,
                self.heartbeat_interval,
                "source.heartbeat_interval",
                "--heartbeat-interval",
            ),
            (
                &mut source.lookupd_poll_interval,
                self.lookupd_poll_interval,
                "source.lookupd_poll_interval",
                "--lookupd-poll-interval",
            ),
        ];
        for (target, value, key, flag) in durations {
            overlay.value(target, value.map(Dur).as_ref(), key, flag);
        }
    }
}
