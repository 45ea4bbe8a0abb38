//! `nsq-dedupe size`: the sizing calculator. The maths is in `crate::sizing`; this module
//! checks which two quantities were given, solves the third and formats the answer.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::json;

use super::format_probability;
use super::size_cost::{Resize, SelfSizing, TableBytes};
use crate::cli::{SizeArgs, MAX_WINDOW_MESSAGES};
use crate::sizing;
use crate::units::{format_bytes, format_count, format_duration};
use crate::Geometry;

/// A solved sizing question: the table, the window and the probability at the window.
#[derive(Debug)]
struct Answer {
    geometry: Geometry,
    /// The probability the table achieves for a copy a whole window late: at least the target,
    /// and more when the smallest table that reaches the target overshoots it.
    probability: f64,
    /// The probability asked for, when one was.
    target: Option<f64>,
    window_messages: f64,
    rate: Option<f64>,
    /// `--max-age` in whole seconds (at least 1), with the rate it needs.
    max_age: Option<MaxAge>,
}

impl Answer {
    /// The table's memory in each store, with a time beside each entry under `--max-age`.
    fn bytes(&self) -> TableBytes {
        TableBytes::of(self.geometry, self.max_age.is_some())
    }

    /// What growing this table to twice its size costs.
    fn resize(&self) -> Option<Resize> {
        Resize::doubling(self.geometry, self.max_age.is_some(), self.rate)
    }

    /// The probability that a copy a whole window late is caught: the table's, or 0 when the
    /// window is longer than `max_age`.
    fn window_probability(&self) -> f64 {
        self.catch_probability(self.window_seconds(), self.window_messages)
    }
}

/// What `--max-age` changes: copies later than it pass, and the table it suggests.
#[derive(Debug)]
struct MaxAge {
    seconds: f64,
    /// The smallest table of the same ways that catches a copy `max_age` late with the target
    /// probability (0.99 without one): past it, `max_age`, not the table's size, forgets.
    suggested: Geometry,
    suggested_probability: f64,
}

impl Answer {
    /// The catch probability of a copy `messages` later (`seconds` later, when known): the
    /// table's, and 0 beyond `max_age`.
    fn catch_probability(&self, seconds: Option<f64>, messages: f64) -> f64 {
        if self.later_than_max_age(seconds) {
            0.0
        } else {
            sizing::catch_probability(self.geometry, messages)
        }
    }

    /// Whether a copy `seconds` late is past `max_age`, and so passes whatever the table holds.
    fn later_than_max_age(&self, seconds: Option<f64>) -> bool {
        matches!((&self.max_age, seconds), (Some(max_age), Some(s)) if s > max_age.seconds)
    }
}

impl Answer {
    fn window_seconds(&self) -> Option<f64> {
        self.rate.map(|rate| self.window_messages / rate)
    }
}

pub(crate) fn run(args: &SizeArgs) -> Result<()> {
    let measure = super::measured_rate::wanted(args)?;
    if let Some(sizing) = self_sizing(args, measure)? {
        let out = if args.json {
            serde_json::to_string_pretty(&self_sizing_json(args, &sizing))? + "\n"
        } else {
            self_sizing_text(args, &sizing)
        };
        return Ok(super::output::write_stdout(out.as_bytes())?);
    }
    let measured = if measure {
        // The other flags are checked first, so that a mistake in them costs no sample.
        solve(args, Some(1.0))?;
        Some(super::measured_rate::measure(args)?)
    } else {
        None
    };
    let rate = measured
        .as_ref()
        .map_or(args.rate, |m| Some(m.distinct_rate()));
    let answer = solve(args, rate)?;
    if let Some(path) = &args.plot {
        super::catch_plot::CatchPlot {
            geometry: answer.geometry,
            window_messages: answer.window_messages,
            rate: answer.rate,
            max_age_seconds: answer.max_age.as_ref().map(|m| m.seconds),
        }
        .write_svg(path)?;
    }
    let out = if args.json {
        let mut value = to_json(&answer);
        if let Some(measured) = &measured {
            value["measured"] = measured.to_json();
        }
        serde_json::to_string_pretty(&value)? + "\n"
    } else {
        measured.as_ref().map_or_else(String::new, |m| m.to_text()) + &to_text(&answer)
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// The table that sizes itself which `args` describe: `--probability` and `--window` without
/// a rate (given or measured), a size or a message count; `None` for any other question.
fn self_sizing(args: &SizeArgs, measure: bool) -> Result<Option<SelfSizing>> {
    let geometry = args.table.geometry()?;
    let (Some(probability), Some(window), None, None, false) =
        (args.probability, args.window, args.rate, geometry, measure)
    else {
        if let Some(text) = &args.max_memory {
            bail!(
                "`--max-memory {text}` is the ceiling of a table that sizes itself: give it with \
                 `--probability` and `--window` alone (no `--rate`, `--buckets` or `--memory`), \
                 or leave it out"
            );
        }
        return Ok(None);
    };
    if args.plot.is_some() {
        bail!(
            "`--plot` draws a table for a known rate, and a table that sizes itself (`--probability` \
             and `--window` without `--rate`) has none: give `--rate` to draw the table for it"
        );
    }
    let max_bytes = args
        .max_memory
        .as_deref()
        .map(crate::units::parse_bytes)
        .transpose()
        .map_err(|reason| anyhow!(reason))?;
    SelfSizing::new(
        probability,
        window,
        args.table.ways,
        max_bytes,
        args.max_age.is_some(),
    )
    .map(Some)
    .map_err(|reason| match &args.max_memory {
        Some(text) => anyhow!("`--max-memory {text}` {reason}: give a larger ceiling"),
        None => anyhow!(
            "the default ceiling of a table that sizes itself {reason}: give `--max-memory`"
        ),
    })
}

fn self_sizing_text(args: &SizeArgs, sizing: &SelfSizing) -> String {
    let (start, growth) = (sizing.start, sizing.growth);
    let target = format_probability(growth.probability);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Table:        sizes itself (no rate and no size given): starts at {} ({}), {}",
        plural(start.slots(), "bucket", "buckets"),
        shape(start),
        match sizing.wanted_start {
            Some(wanted) if wanted.slots() > start.slots() => format!(
                "all the ceiling holds ({} distinct messages a window would need {})",
                format_count(sizing.start_messages() as u64),
                plural(wanted.slots(), "bucket", "buckets"),
            ),
            _ => format!(
                "room for {} distinct messages a window",
                format_count(sizing.start_messages() as u64)
            ),
        },
    );
    let _ = writeln!(
        out,
        "Memory:       at the start, {}",
        memory_text(sizing.start_bytes)
    );
    let _ = writeln!(
        out,
        "Window:       {} at the rate the table meets",
        format_duration(growth.window)
    );
    let _ = writeln!(
        out,
        "Probability:  {target} that a copy arriving a whole window late is caught, the target \
         it grows for"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Growing:      every {}, the distinct rate of the last {} (for a shared table, the \
         larger of the fleet's and this consumer's over {} divided by its share of the fleet) is checked \
         against the table; when a copy one window late would be caught with less than {target}, a new \
         generation takes the new messages, sized for {} times that rate.",
        format_duration(crate::sizing::growth::CHECK_EVERY),
        format_duration(crate::sizing::growth::RATE_SPAN),
        format_duration(crate::sizing::growth::SHARED_RATE_SPAN),
        sizing.headroom(),
    );
    let _ = writeln!(out, "              {}", PREVIOUS_READ);
    let default = if sizing.default_ceiling {
        "the default: a quarter of this machine's memory, at most 1 GiB; `--max-memory` sets it"
    } else {
        "`--max-memory`"
    };
    let _ = writeln!(
        out,
        "Ceiling:      {} in-process for every generation held at once ({default}).",
        format_bytes(growth.max_bytes)
    );
    if let (Some(table), Some(rate)) = (sizing.ceiling_table, sizing.ceiling_rate) {
        let _ = writeln!(
            out,
            "              A table of all of it, {}, catches a copy one window late with \
             probability {target} up to {} distinct messages a second; the largest one reached \
             is smaller, at least half of it, as the generations before it are held beside it \
             until they retire.",
            plural(table.slots(), "bucket", "buckets"),
            format_count(rate.floor() as u64),
        );
    }
    if let Some(max_age) = args.max_age {
        let _ = writeln!(
            out,
            "Max age:      {}: the memory above counts a time beside every entry.",
            format_duration(max_age)
        );
    }
    out
}

fn self_sizing_json(args: &SizeArgs, sizing: &SelfSizing) -> serde_json::Value {
    let mut value = json!({
        "sizes_itself": true,
        "buckets": sizing.start.slots(),
        "ways": sizing.start.ways(),
        "sets": sizing.start.sets(),
        "target_probability": sizing.growth.probability,
        "window_seconds": sizing.growth.window.as_secs_f64(),
        "self_sizing": sizing.to_json(),
    });
    sizing.start_bytes.write_json(&mut value, "");
    if let Some(max_age) = args.max_age {
        value["max_age_seconds"] = json!(max_age.as_secs().max(1) as f64);
    }
    value
}

/// What a claim costs while a previous generation is read, and how long it is read.
const PREVIOUS_READ: &str = "The previous generation stays, read-only, until the new one has \
    taken as many new messages as it has buckets (or max age has passed): memory peaks at both \
    generations, and each claim reads the previous one too, one look-up more (one set in \
    process; one key, in the same round trip, in a shared store).";

/// A table's memory in each store, as the Memory line says it.
fn memory_text(bytes: TableBytes) -> String {
    format!(
        "{} in-process; about {} in Memcached, {} in Redis or Valkey",
        format_bytes(bytes.in_process),
        format_bytes(bytes.memcached),
        format_bytes(bytes.redis)
    )
}

/// Solves the question `args` ask at `rate` distinct messages per second (`--rate`, or the
/// measured rate).
fn solve(args: &SizeArgs, rate: Option<f64>) -> Result<Answer> {
    let window_messages = match (args.window, args.messages, rate) {
        (Some(window), _, Some(rate)) => Some(window.as_secs_f64() * rate),
        (Some(window), _, None) => bail!(
            "`--window {}` needs `--rate` (distinct messages per second) to count the messages \
             in the window; or give the count itself with `--messages`",
            format_duration(window)
        ),
        (None, Some(messages), _) => Some(messages),
        (None, None, _) => None,
    };
    if let Some(messages) = window_messages.filter(|m| *m > MAX_WINDOW_MESSAGES) {
        bail!(
            "`--window` at `--rate` holds {messages:.3e} messages; `size` computes windows of at \
             most 10^18 messages: shorten the window or lower the rate"
        );
    }
    let geometry = args.table.geometry()?;
    let mut answer = match (args.probability, geometry, window_messages) {
        (Some(target), None, Some(window_messages)) => {
            let geometry = sizing::slots_for(target, args.table.ways, window_messages)?;
            Answer {
                geometry,
                probability: sizing::catch_probability(geometry, window_messages),
                target: Some(target),
                window_messages,
                rate,
                max_age: None,
            }
        }
        (Some(target), Some(geometry), None) => Answer {
            geometry,
            probability: target,
            target: Some(target),
            window_messages: sizing::window_for(geometry, target)?,
            rate,
            max_age: None,
        },
        (None, Some(geometry), Some(window_messages)) => Answer {
            geometry,
            probability: sizing::catch_probability(geometry, window_messages),
            target: None,
            window_messages,
            rate,
            max_age: None,
        },
        _ => bail!(
            "give exactly two of `--probability`, the table size (`--buckets` or `--memory`) \
             and the window (`--window` with `--rate`, or `--messages`); the third is computed"
        ),
    };
    if let Some(max_age) = args.max_age {
        let Some(rate) = rate else {
            bail!(
                "`--max-age {}` needs `--rate` (distinct messages per second) to tell how many \
                 messages arrive within it",
                format_duration(max_age)
            );
        };
        // Entries carry whole seconds: a copy is caught up to max_age, and passes a second
        // later.
        let seconds = max_age.as_secs().max(1) as f64;
        let target = answer.target.unwrap_or(0.99);
        let messages = (seconds * rate).clamp(1.0, MAX_WINDOW_MESSAGES);
        let suggested = sizing::slots_for(target, answer.geometry.ways(), messages)?;
        answer.max_age = Some(MaxAge {
            seconds,
            suggested,
            suggested_probability: sizing::catch_probability(suggested, messages),
        });
    }
    Ok(answer)
}

/// Delays at which to show the catch probability: round values up to twice the window, plus
/// the window itself and twice it.
fn delays(answer: &Answer) -> Vec<(Option<f64>, f64)> {
    let end = 2.0 * answer.window_messages;
    let mut rows: Vec<(Option<f64>, f64)> = match answer.rate {
        Some(rate) => [
            1.0,
            60.0,
            600.0,
            3600.0,
            6.0 * 3600.0,
            86_400.0,
            7.0 * 86_400.0,
        ]
        .into_iter()
        .map(|seconds| (Some(seconds), seconds * rate))
        .collect(),
        None => [1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]
            .into_iter()
            .map(|messages| (None, messages))
            .collect(),
    };
    rows.retain(|&(_, messages)| messages < end * 0.999);
    if let (Some(max_age), Some(rate)) = (&answer.max_age, answer.rate) {
        for seconds in [max_age.seconds, max_age.seconds + 1.0] {
            rows.push((Some(seconds), seconds * rate));
        }
    }
    for messages in [answer.window_messages, end] {
        rows.push((
            answer
                .window_seconds()
                .map(|s| s * messages / answer.window_messages),
            messages,
        ));
    }
    rows.sort_by(|a, b| a.1.total_cmp(&b.1));
    rows.dedup_by(|a, b| (a.1 - b.1).abs() <= 1e-9 * b.1.max(1.0));
    rows
}

fn to_text(answer: &Answer) -> String {
    let g = answer.geometry;
    let mut out = String::new();
    let sets = shape(g);
    let _ = writeln!(
        out,
        "Table:        {} ({sets})",
        plural(g.slots(), "bucket", "buckets")
    );
    let _ = writeln!(out, "Memory:       {}", memory_text(answer.bytes()));
    let window = match (answer.window_seconds(), answer.rate) {
        (Some(seconds), Some(rate)) => format!(
            "{} at {rate} msg/s = {} distinct messages",
            describe_seconds(seconds),
            format_count(answer.window_messages.round() as u64)
        ),
        _ => format!(
            "{} distinct messages",
            format_count(answer.window_messages.round() as u64)
        ),
    };
    let _ = writeln!(out, "Window:       {window}");
    let target = match answer.target {
        Some(target) if format_probability(target) != format_probability(answer.probability) => {
            format!(" (the target was {})", format_probability(target))
        }
        _ => String::new(),
    };
    // A copy a whole window late is past a shorter max age: its probability is 0, and the
    // table's own is said beside it.
    match (&answer.max_age, answer.window_seconds()) {
        (Some(max_age), Some(window)) if max_age.seconds < window => {
            let _ = writeln!(
                out,
                "Probability:  0 that a copy arriving a whole window late is caught: max age {} \
                 is shorter than the window, and such a copy passes whatever the table holds \
                 (the table alone would catch it with probability {}){target}",
                describe_seconds(max_age.seconds),
                format_probability(answer.probability)
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "Probability:  {} that a copy arriving a whole window late is caught{target}",
                format_probability(answer.probability)
            );
        }
    }
    let _ = writeln!(out);
    write_delays(&mut out, answer);
    if let Some(max_age) = &answer.max_age {
        let s = max_age.suggested;
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Max age:      {}: a copy arriving later passes, whatever the table holds.",
            describe_seconds(max_age.seconds)
        );
        let _ = writeln!(
            out,
            "              From {} ({} in-process) up, max age is what forgets: that table \
             catches a copy {} late with probability {}.",
            plural(s.slots(), "bucket", "buckets"),
            format_bytes(TableBytes::of(s, true).in_process),
            describe_seconds(max_age.seconds),
            format_probability(max_age.suggested_probability)
        );
        let _ = writeln!(
            out,
            "              With max age every entry carries a time, counted in the memory \
             above: 16 bytes a bucket in process instead of 8, 12 an entry in Memcached \
             instead of 8."
        );
    }
    if let Some(resize) = answer.resize() {
        write_resize(&mut out, answer, &resize);
    }
    out
}

/// What growing the table to twice its size costs.
fn write_resize(out: &mut String, answer: &Answer, resize: &Resize) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Resizing:     to twice this size ({}, by `nsq-dedupe resize` or a table file of \
         another size), this table stays, read-only, beside the new one: memory peaks at {}.",
        plural(resize.to.slots(), "bucket", "buckets"),
        memory_text(resize.peak)
    );
    let when = match (resize.retire_seconds, answer.rate) {
        (Some(seconds), Some(rate)) => {
            format!(
                " ({} at {rate} msg/s)",
                describe_seconds(seconds.round().max(1.0))
            )
        }
        _ => String::new(),
    };
    let max_age = if answer.max_age.is_some() {
        ", or max age has passed"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "              It is read until the new table has taken {} new messages{when}{max_age}; \
         each claim meanwhile reads it too, one look-up more (one set in process; one key, in \
         the same round trip, in a shared store).",
        format_count(resize.retire_messages)
    );
}

/// The table of catch probabilities by delay, its columns as wide as their widest figure.
fn write_delays(out: &mut String, answer: &Answer) {
    let rows: Vec<(String, String, String)> = delays(answer)
        .into_iter()
        .map(|(seconds, messages)| {
            let probability = if answer.later_than_max_age(seconds) {
                "0 (later than max age)".to_owned()
            } else {
                format_probability(answer.catch_probability(seconds, messages))
            };
            (
                seconds.map_or_else(|| "-".to_owned(), describe_seconds),
                format_count(messages.round() as u64),
                probability,
            )
        })
        .collect();
    let delay_width = rows.iter().map(|r| r.0.len() + 2).fold(12, usize::max);
    let count_width = rows.iter().map(|r| r.1.len() + 2).fold(18, usize::max);
    let _ = writeln!(
        out,
        "{:<delay_width$}{:>count_width$}  Catch probability",
        "Delay", "Messages later"
    );
    for (delay, count, probability) in rows {
        let _ = writeln!(
            out,
            "{delay:<delay_width$}{count:>count_width$}  {probability}"
        );
    }
}

/// How a table's slots are grouped: "1,238,771 sets of 8 ways", or the classic table.
fn shape(g: Geometry) -> String {
    if g.ways() == 1 {
        "one bucket per set, the classic table".to_owned()
    } else {
        format!("{} of {} ways", plural(g.sets(), "set", "sets"), g.ways())
    }
}

/// `count` with the singular or the plural noun: "1 set", "2 sets".
fn plural(count: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        format_count(count),
        if count == 1 { one } else { many }
    )
}

fn describe_seconds(seconds: f64) -> String {
    const DAY: f64 = 86_400.0;
    // A day or more reads in whole seconds, a year or more in whole days: tenths of a second
    // on a window of years say nothing.
    let seconds = match seconds {
        s if s >= 365.0 * DAY => (s / DAY).round() * DAY,
        s if s >= DAY => s.round(),
        s => s,
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if d >= Duration::from_secs(1) && d.subsec_nanos() == 0 => format_duration(d),
        Ok(d) if d >= Duration::from_secs(1) => format!("{seconds:.1}s"),
        _ => format!("{:.0}ms", seconds * 1000.0),
    }
}

fn to_json(answer: &Answer) -> serde_json::Value {
    let g = answer.geometry;
    let delays: Vec<_> = delays(answer)
        .into_iter()
        .map(|(seconds, messages)| {
            json!({
                "delay_seconds": seconds,
                "messages": messages,
                "probability": answer.catch_probability(seconds, messages),
            })
        })
        .collect();
    let mut value = json!({
        "buckets": g.slots(),
        "ways": g.ways(),
        "sets": g.sets(),
        "probability": answer.window_probability(),
        "table_probability": answer.probability,
        "target_probability": answer.target,
        "window_messages": answer.window_messages,
        "delays": delays,
    });
    answer.bytes().write_json(&mut value, "");
    if let Some(resize) = answer.resize() {
        value["resize"] = resize.to_json();
    }
    // Keys that need a rate are present only when one was given.
    if let (Some(rate), Some(seconds)) = (answer.rate, answer.window_seconds()) {
        value["rate"] = json!(rate);
        value["window_seconds"] = json!(seconds);
    }
    if let Some(max_age) = &answer.max_age {
        value["max_age_seconds"] = json!(max_age.seconds);
        value["max_age_table"] = json!({
            "buckets": max_age.suggested.slots(),
            "memory_bytes": TableBytes::of(max_age.suggested, true).in_process,
            "probability": max_age.suggested_probability,
        });
    }
    value
}
