//! Flags of `nsq-dedupe size`.

use std::time::Duration;

use clap::Args;

use super::parse::{parse_duration, parse_messages, parse_probability, parse_rate};
use super::table::TableFlags;

/// Flags of `nsq-dedupe size`.
#[derive(Debug, Args)]
pub(crate) struct SizeArgs {
    /// Share of copies still caught when they arrive a whole window late (0 < p < 1).
    #[arg(
        long,
        short = 'p',
        value_name = "P",
        value_parser = parse_probability,
        allow_negative_numbers = true
    )]
    pub(crate) probability: Option<f64>,
    /// The table.
    #[command(flatten)]
    pub(crate) table: TableFlags,
    /// Distinct messages per second.
    #[arg(long, value_name = "MSG/S", value_parser = parse_rate, allow_negative_numbers = true)]
    pub(crate) rate: Option<f64>,
    /// Measure the rate instead, from this nsqd's `/stats` (HTTP host:port; repeatable: the
    /// counts are added, so copies published to several nsqd each count).
    #[arg(
        long = "nsqd-http-address",
        value_name = "ADDR",
        conflicts_with = "rate",
        requires = "topic"
    )]
    pub(crate) nsqd_http_addresses: Vec<String>,
    /// The topic whose rate `--nsqd-http-address` measures.
    #[arg(long, value_name = "TOPIC", requires = "nsqd_http_addresses")]
    pub(crate) topic: Option<String>,
    /// How long `--nsqd-http-address` samples the topic's message count (default 10s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s", requires = "nsqd_http_addresses")]
    pub(crate) sample: Duration,
    /// How late a copy may arrive: 30s, 5m, 1h, 2d (needs --rate).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "messages")]
    pub(crate) window: Option<Duration>,
    /// The window as a count of distinct messages.
    #[arg(long, value_name = "COUNT", value_parser = parse_messages)]
    pub(crate) messages: Option<f64>,
    /// Copies later than this pass whatever the table holds (`dedupe.max_age`; needs --rate):
    /// the delay table shows it, and the smallest table for which max_age is what forgets is
    /// suggested.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) max_age: Option<Duration>,
    /// Also draw the catch probability against the delay, for 1, 2, 4 and 8 ways in the same
    /// memory, as an SVG picture in this file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}
