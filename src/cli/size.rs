//! Flags of `nsq-dedupe size`.

use std::time::Duration;

use clap::builder::{OsStringValueParser, TypedValueParser as _};
use clap::Args;

use super::parse::{
    parse_copies, parse_duration, parse_memory_text, parse_messages, parse_probability, parse_rate,
    parse_svg_file,
};
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
    /// Measure the rate instead: nsqd's HTTP address, host:port or http:// URL (repeatable, or
    /// comma-separated; port 4151 when none is given). The topic's message count is read from
    /// each nsqd's /stats at the start and the end of --sample. Each nsqd counts the copies it
    /// received: when producers publish every message to several of these nsqd, say to how
    /// many with --copies, and the total is divided by it.
    #[arg(
        long = "nsqd-http-address",
        value_name = "ADDR",
        value_delimiter = ',',
        env = "NSQ_DEDUPE_NSQD_HTTP_ADDRESS",
        help_heading = "Measured rate"
    )]
    pub(crate) nsqd_http_addresses: Vec<String>,
    /// The topic whose rate --nsqd-http-address measures.
    #[arg(
        long,
        value_name = "TOPIC",
        env = "NSQ_DEDUPE_TOPIC",
        help_heading = "Measured rate"
    )]
    pub(crate) topic: Option<String>,
    /// How long to sample the message counts for (default 10s).
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        env = "NSQ_DEDUPE_SAMPLE",
        help_heading = "Measured rate"
    )]
    pub(crate) sample: Option<Duration>,
    /// To how many of the nsqd given each message is published (default 1: each message to
    /// one of them). With 2 replicated nsqd that both receive every message, --copies 2.
    #[arg(
        long,
        value_name = "K",
        value_parser = parse_copies,
        env = "NSQ_DEDUPE_COPIES",
        help_heading = "Measured rate"
    )]
    pub(crate) copies: Option<u32>,
    /// How late a copy may arrive: 30s, 5m, 1h, 2d (with --rate; with --probability alone,
    /// the table that sizes itself is described).
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
    /// The ceiling of a table that sizes itself (--probability and --window without --rate or
    /// a size), as `run --max-memory`: such as 256MiB (default a quarter of this machine's
    /// memory, at most 1GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_text)]
    pub(crate) max_memory: Option<String>,
    /// Also draw the catch probability against the delay, for 1, 2, 4 and 8 ways in the same
    /// memory, as an SVG picture in this file (its name must end in .svg).
    #[arg(
        long,
        value_name = "FILE.svg",
        value_parser = OsStringValueParser::new().try_map(parse_svg_file)
    )]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}
