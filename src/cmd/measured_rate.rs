//! `size --nsqd-http-address`: a topic's distinct message rate, measured from the message
//! counts nsqd reports at the start and the end of a sample.
//!
//! Each nsqd counts the messages published to it. When producers publish every message to K
//! of the nsqd given (replicated nsqd), their sum is K times the distinct rate, so the sum is
//! divided by `--copies K`. An nsqd that receives only part of the topic (nsqd behind a
//! load balancer) adds its share: `--copies 1`, the default.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use serde_json::json;

use super::nsqd_stats::{read_count, NsqdAddress, TopicCount};
use crate::cli::SizeArgs;
use crate::http::{HttpClient, HttpClientConfig};
use crate::units::{format_count, format_duration};

/// How long the counts are sampled for without `--sample`.
const DEFAULT_SAMPLE: Duration = Duration::from_secs(10);

/// What the sample measured.
#[derive(Debug)]
pub(crate) struct Measurement {
    topic: String,
    sample: Duration,
    copies: u32,
    /// Each nsqd as typed, with its counts at the start and the end.
    nsqd: Vec<(String, u64, u64)>,
}

impl Measurement {
    fn rate(&self, messages: u64) -> f64 {
        messages as f64 / self.sample.as_secs_f64()
    }

    fn total_messages(&self) -> u64 {
        self.nsqd.iter().map(|(_, start, end)| end - start).sum()
    }

    /// The distinct messages per second the table is sized for: the total over `--copies`,
    /// to a tenth of a message per second, as printed.
    pub(crate) fn distinct_rate(&self) -> f64 {
        let rate = self.rate(self.total_messages()) / f64::from(self.copies);
        (rate * 10.0).round() / 10.0
    }

    /// The figures, one line per nsqd, then the total and the distinct rate.
    pub(crate) fn to_text(&self) -> String {
        let width = self
            .nsqd
            .iter()
            .map(|(typed, ..)| typed.len())
            .chain([8])
            .max()
            .unwrap_or(8);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Measured:     topic {} over {}, from each nsqd's /stats",
            self.topic,
            format_duration(self.sample)
        );
        let mut line = |name: &str, messages: Option<u64>, rate: f64| {
            let messages =
                messages.map_or_else(String::new, |m| format!("{} messages", format_count(m)));
            let _ = writeln!(out, "  {name:<width$}  {messages:>20}  {rate:>10.1} msg/s");
        };
        for (typed, start, end) in &self.nsqd {
            line(typed, Some(end - start), self.rate(end - start));
        }
        let total = self.total_messages();
        line("total", Some(total), self.rate(total));
        let copies = match self.copies {
            1 => "the total: --copies 1, each message is published to one of these nsqd".to_owned(),
            k => format!(
                "the total / {k}: --copies {k}, each message is published to {k} of these nsqd"
            ),
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {:>20}  {:>10.1} msg/s ({copies})",
            "distinct",
            "",
            self.distinct_rate()
        );
        let _ = writeln!(out);
        out
    }

    /// The figures as the `measured` object of `size --json`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let nsqd: Vec<_> = self
            .nsqd
            .iter()
            .map(|(typed, start, end)| {
                json!({
                    "address": typed,
                    "message_count_start": start,
                    "message_count_end": end,
                    "messages": end - start,
                    "rate": self.rate(end - start),
                })
            })
            .collect();
        json!({
            "topic": self.topic,
            "sample_seconds": self.sample.as_secs_f64(),
            "nsqd": nsqd,
            "total_rate": self.rate(self.total_messages()),
            "copies": self.copies,
            "distinct_rate": self.distinct_rate(),
        })
    }
}

/// Whether `args` ask for a measured rate; refuses flags that contradict it.
///
/// # Errors
///
/// `--rate` with `--nsqd-http-address`; `--sample` or `--copies` without it.
pub(crate) fn wanted(args: &SizeArgs) -> Result<bool> {
    let measure = !args.nsqd_http_addresses.is_empty();
    if measure && args.rate.is_some() {
        bail!(
            "`--rate` and `--nsqd-http-address` (or NSQ_DEDUPE_NSQD_HTTP_ADDRESS) both give the \
             rate: give `--rate` alone to size for a rate you know, or `--nsqd-http-address` \
             with `--topic` alone to measure it"
        );
    }
    if !measure {
        for (given, flag) in [
            (args.sample.is_some(), "--sample"),
            (args.copies.is_some(), "--copies"),
        ] {
            if given {
                bail!(
                    "`{flag}` applies to a measured rate: give `--nsqd-http-address` and \
                     `--topic` too, or leave `{flag}` out"
                );
            }
        }
    }
    Ok(measure)
}

/// Reads `--topic`'s message count from every `--nsqd-http-address` at the start and the end
/// of `--sample` and returns the figures.
///
/// # Errors
///
/// A missing topic, a bad address or copy count, an nsqd that cannot be read or restarted,
/// and a sample in which no message was published.
pub(crate) fn measure(args: &SizeArgs) -> Result<Measurement> {
    let Some(topic) = args.topic.clone() else {
        bail!(
            "`--nsqd-http-address` measures the rate of a topic: name it with `--topic`, such \
             as `--topic events`"
        );
    };
    let mut addresses: Vec<NsqdAddress> = Vec::new();
    for typed in &args.nsqd_http_addresses {
        let address = NsqdAddress::parse(typed)?;
        if let Some(same) = addresses.iter().find(|a| a.same_as(&address)) {
            bail!(
                "`--nsqd-http-address` gives the same nsqd twice (`{}` and `{typed}`): its \
                 messages would count twice; give each nsqd once",
                same.typed
            );
        }
        addresses.push(address);
    }
    let copies = args.copies.unwrap_or(1);
    if copies as usize > addresses.len() {
        bail!(
            "`--copies {copies}` with {} nsqd given: a message can be on at most as many of \
             them as are given; give every nsqd that receives the topic, or a smaller \
             `--copies`",
            addresses.len()
        );
    }
    let sample = args.sample.unwrap_or(DEFAULT_SAMPLE);
    if std::io::stderr().is_terminal() {
        eprintln!(
            "Sampling topic {topic} on {} nsqd for {}...",
            addresses.len(),
            format_duration(sample)
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let nsqd = runtime.block_on(sample_counts(&addresses, &topic, sample))?;
    let measurement = Measurement {
        topic,
        sample,
        copies,
        nsqd,
    };
    if measurement.total_messages() == 0 {
        bail!(
            "no message was published to topic `{}` on {} during the {} sample: sample for \
             longer with `--sample`, at a busier time, or give the rate with `--rate`",
            measurement.topic,
            match addresses.len() {
                1 => format!("`{}`", addresses[0].typed),
                n => format!("any of the {n} nsqd"),
            },
            format_duration(sample)
        );
    }
    if measurement.distinct_rate() == 0.0 {
        bail!(
            "topic `{}` had {} messages in {}: under 0.05 a second, too few to size a table \
             for; sample for longer with `--sample`, or give the rate with `--rate`",
            measurement.topic,
            measurement.total_messages(),
            format_duration(sample)
        );
    }
    Ok(measurement)
}

/// Every nsqd's count at the start and `sample` later: each read of a round goes to all nsqd
/// at once, so a bad address fails before the wait.
async fn sample_counts(
    addresses: &[NsqdAddress],
    topic: &str,
    sample: Duration,
) -> Result<Vec<(String, u64, u64)>> {
    let client = HttpClient::new(&HttpClientConfig::default())?;
    let read_all = || {
        futures::future::try_join_all(
            addresses
                .iter()
                .map(|address| read_count(&client, address, topic)),
        )
    };
    let started = tokio::time::Instant::now();
    let first = read_all().await?;
    tokio::time::sleep_until(started + sample).await;
    let last = read_all().await?;
    addresses
        .iter()
        .zip(first.iter().zip(&last))
        .map(|(address, (first, last))| {
            check_no_restart(address, topic, *first, *last)?;
            Ok((address.typed.clone(), first.messages, last.messages))
        })
        .collect()
}

fn check_no_restart(
    address: &NsqdAddress,
    topic: &str,
    first: TopicCount,
    last: TopicCount,
) -> Result<()> {
    if first.start_time != last.start_time || last.messages < first.messages {
        bail!(
            "nsqd at `{}` restarted during the sample, or its topic `{topic}` was deleted and \
             created again (its message count went from {} to {}): run `size` again",
            address.typed,
            first.messages,
            last.messages
        );
    }
    Ok(())
}
