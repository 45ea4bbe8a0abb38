//! Flags of `nsq-dedupe size`.

use std::time::Duration;

use clap::Args;

use super::parse::{
    parse_buckets, parse_duration, parse_memory, parse_messages, parse_probability, parse_rate,
    parse_ways,
};

/// Flags of `nsq-dedupe size`.
#[derive(Debug, Args)]
pub(crate) struct SizeArgs {
    /// Share of copies still caught when they arrive a whole window late (0 < p < 1).
    #[arg(long, short = 'p', value_name = "P", value_parser = parse_probability)]
    pub(crate) probability: Option<f64>,
    /// Table size in slots (buckets); rounded up to whole sets.
    #[arg(long, value_name = "N", value_parser = parse_buckets, conflicts_with = "memory")]
    pub(crate) buckets: Option<u64>,
    /// Table size as in-process memory, such as 64MiB or 1GiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub(crate) memory: Option<u64>,
    /// Distinct messages per second.
    #[arg(long, value_name = "MSG/S", value_parser = parse_rate)]
    pub(crate) rate: Option<f64>,
    /// How late a copy may arrive: 30s, 5m, 1h, 2d (needs --rate).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "messages")]
    pub(crate) window: Option<Duration>,
    /// The window as a count of distinct messages.
    #[arg(long, value_name = "COUNT", value_parser = parse_messages)]
    pub(crate) messages: Option<f64>,
    /// Slots per set: 1 (the classic one-bucket table), 2, 4 or 8.
    #[arg(long, value_name = "W", default_value_t = 8, value_parser = parse_ways)]
    pub(crate) ways: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}
