//! Command-line flags (clap derive) of the `nsq-dedupe` binary.
//!
//! The binary only parses these and calls [`run`](crate::cli::run); each subcommand lives in
//! its own module under `cmd`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::dedup::digest::{DigestAlgorithm, KeySpec};
use crate::sizing;

/// Removes duplicate messages from NSQ streams with bounded memory.
#[derive(Debug, Parser)]
#[command(name = "nsq-dedupe", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Turn a catch probability, a message rate and a window into a table size, or back.
    ///
    /// Give two of --probability, the table size (--buckets or --memory) and the window
    /// (--window with --rate, or --messages); the third is computed.
    Size(SizeArgs),
    /// Write each newline-delimited record whose key was not seen before; drop the copies.
    Filter(FilterArgs),
    /// Consume an NSQ topic, drop the copies, deliver the rest to a sink (the sidecar).
    ///
    /// Settings come from `--config FILE` (TOML) and these flags, which override the file.
    Run(Box<RunArgs>),
}

/// Flags of `nsq-dedupe run`. Each overrides the config file's key of the same name.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML config file (see config/ for examples).
    #[arg(long, short = 'c', value_name = "FILE", env = "NSQ_DEDUPE_CONFIG")]
    pub config: Option<PathBuf>,
    /// nsqd TCP address to consume from (repeatable). `source.nsqd_tcp_addresses`.
    #[arg(long = "nsqd-tcp-address", value_name = "ADDR")]
    pub nsqd_tcp_addresses: Vec<String>,
    /// nsqlookupd HTTP address, host:port or URL (repeatable). `source.lookupd_http_addresses`.
    #[arg(long = "lookupd-http-address", value_name = "ADDR")]
    pub lookupd_http_addresses: Vec<String>,
    /// Topic to consume. `source.topic`.
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
    /// Channel to consume (default nsq-dedupe). `source.channel`.
    #[arg(long, value_name = "CHANNEL")]
    pub channel: Option<String>,
    /// Messages in flight at once (default 200). `source.max_in_flight`.
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u32>,
    /// nsqd's redelivery timeout for this consumer, such as 60s. `source.msg_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub msg_timeout: Option<Duration>,
    /// Key of a body: `body` or `json:<pointer>`. `dedupe.key`.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Where the table lives. `store.kind`.
    #[arg(long, value_enum, value_name = "STORE")]
    pub store: Option<crate::config::StoreKind>,
    /// Memcached server host:port (repeatable). `store.memcached_addresses`.
    #[arg(long = "memcached-address", value_name = "ADDR")]
    pub memcached_addresses: Vec<String>,
    /// Table size in slots. `store.buckets`.
    #[arg(long, value_name = "N", value_parser = parse_buckets)]
    pub buckets: Option<u64>,
    /// Slots per set: 1, 2, 4 or 8. `store.ways`.
    #[arg(long, value_name = "W", value_parser = parse_ways)]
    pub ways: Option<u32>,
    /// Where unique messages go. `sink.kind`.
    #[arg(long, value_enum, value_name = "SINK")]
    pub sink: Option<crate::config::SinkKind>,
    /// nsqd TCP address to publish to (repeatable; nsq sink). `sink.destination_nsqd_tcp_addresses`.
    #[arg(long = "destination-nsqd-tcp-address", value_name = "ADDR")]
    pub destination_nsqd_tcp_addresses: Vec<String>,
    /// Topic to publish to (nsq sink). `sink.destination_topic`.
    #[arg(long, value_name = "TOPIC")]
    pub destination_topic: Option<String>,
    /// URL to POST each message to (http sink; http:// only). `sink.post`.
    #[arg(long, value_name = "URL")]
    pub post: Option<String>,
    /// Where to serve Prometheus metrics, ip:port or `off`. `metrics.address`.
    #[arg(long, value_name = "ADDR", env = "NSQ_DEDUPE_METRICS_ADDRESS")]
    pub metrics_address: Option<String>,
}

/// Flags of `nsq-dedupe size`.
#[derive(Debug, Args)]
pub struct SizeArgs {
    /// Share of copies still caught when they arrive a whole window late (0 < p < 1).
    #[arg(long, short = 'p', value_name = "P", value_parser = parse_probability)]
    pub probability: Option<f64>,
    /// Table size in slots (buckets); rounded up to whole sets.
    #[arg(long, value_name = "N", value_parser = parse_buckets, conflicts_with = "memory")]
    pub buckets: Option<u64>,
    /// Table size as in-process memory, such as 64MiB or 1GiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// Distinct messages per second.
    #[arg(long, value_name = "MSG/S", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// How late a copy may arrive: 30s, 5m, 1h, 2d (needs --rate).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "messages")]
    pub window: Option<Duration>,
    /// The window as a count of distinct messages.
    #[arg(long, value_name = "COUNT", value_parser = parse_messages)]
    pub messages: Option<f64>,
    /// Slots per set: 1 (the classic one-bucket table), 2, 4 or 8.
    #[arg(long, value_name = "W", default_value_t = 8, value_parser = parse_ways)]
    pub ways: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `nsq-dedupe filter`.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Table size in slots (buckets). Defaults to 8,388,608 slots (64 MiB).
    #[arg(long, value_name = "N", value_parser = parse_buckets, conflicts_with = "memory")]
    pub buckets: Option<u64>,
    /// Table size as memory, such as 64MiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// Slots per set: 1 (the classic one-bucket table), 2, 4 or 8.
    #[arg(long, value_name = "W", default_value_t = 8, value_parser = parse_ways)]
    pub ways: u32,
    /// The key of a record: `body` (the whole line) or `json:<pointer>`, such as `json:/id`.
    #[arg(long, value_name = "KEY", default_value = "body")]
    pub key: KeySpec,
    /// Digest of the key: `xxh3`, `xxh3:<seed>` or `md5`.
    #[arg(long, value_name = "DIGEST", default_value = "xxh3")]
    pub digest: DigestAlgorithm,
    /// What to do with a record that has no key: pass it on (and count it) or stop with an error.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = MissingKey::Pass)]
    pub on_missing_key: MissingKey,
    /// Print counts and the table's catch probability to stderr at the end.
    #[arg(long)]
    pub stats: bool,
    /// Files to read in order; none or `-` reads stdin.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// What happens to a record whose key cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MissingKey {
    /// Treat it as unique: write it and count it.
    Pass,
    /// Stop with an error naming the record.
    Error,
}

/// Runs the parsed command line.
///
/// # Errors
///
/// Whatever the subcommand reports; the binary prints the chain and exits non-zero.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Size(args) => crate::cmd::size::run(&args),
        Command::Filter(args) => crate::cmd::filter::run(&args),
        Command::Run(args) => crate::cmd::run::run(&args),
    }
}

fn parse_probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if p > 0.0 && p < 1.0 => Ok(p),
        _ => Err(format!(
            "expected a probability between 0 and 1 exclusive, such as 0.99, got `{text}`"
        )),
    }
}

fn parse_buckets(text: &str) -> Result<u64, String> {
    match text.replace(['_', ','], "").parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "expected a whole number of slots of at least 1, such as 1048576, got `{text}`"
        )),
    }
}

fn parse_memory(text: &str) -> Result<u64, String> {
    sizing::parse_bytes(text)
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate.is_finite() => Ok(rate),
        _ => Err(format!(
            "expected messages per second greater than 0, such as 1000, got `{text}`"
        )),
    }
}

fn parse_messages(text: &str) -> Result<f64, String> {
    match text.replace(['_', ','], "").parse::<f64>() {
        Ok(count) if count > 0.0 && count.is_finite() => Ok(count),
        _ => Err(format!(
            "expected a count of messages greater than 0, such as 3600000, got `{text}`"
        )),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    match sizing::parse_duration(text)? {
        d if d.is_zero() => Err(format!("expected a duration greater than 0, got `{text}`")),
        d => Ok(d),
    }
}

fn parse_ways(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(ways) if crate::Geometry::SUPPORTED_WAYS.contains(&ways) => Ok(ways),
        _ => Err(format!("expected 1, 2, 4 or 8, got `{text}`")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
