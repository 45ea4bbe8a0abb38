//! Value parsers shared by the subcommands' flags: each says what it expected and what it got.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};

/// A parser for a closed set of names, such as `--store memory|memcached|none`, from the
/// library's own table of names.
pub(crate) fn named<T: Copy + Send + Sync + 'static>(
    names: &'static [(&'static str, T)],
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(names.iter().map(|(name, _)| *name)).map(move |text: String| {
        names
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, value)| *value)
            .expect("clap accepts only the listed names")
    })
}

/// The largest window, in messages, that `size` computes for: a billion messages a second
/// for thirty years.
pub(crate) const MAX_WINDOW_MESSAGES: f64 = 1e18;

/// A probability, by the rule `store.probability` has in the file.
pub(crate) fn parse_probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if crate::sizing::check_probability(p).is_ok() => Ok(p),
        _ => Err("expected a probability between 0 and 1 exclusive, such as 0.99".to_owned()),
    }
}

pub(crate) fn parse_buckets(text: &str) -> Result<u64, String> {
    match text.replace(['_', ','], "").parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of slots of at least 1, such as 1048576".to_owned()),
    }
}

pub(crate) fn parse_memory(text: &str) -> Result<u64, String> {
    crate::units::parse_bytes(text)
}

/// A size as typed (checked, kept as text for the config's `store.memory`).
pub(crate) fn parse_memory_text(text: &str) -> Result<String, String> {
    parse_memory(text).map(|_| text.to_owned())
}

/// `--plot`'s file: a name that ends in `.svg`, in any case. The plot is SVG whatever the
/// file is called, and a `p.png` of SVG is a picture no viewer opens; the error names a file
/// that would do.
pub(crate) fn parse_svg_file(path: OsString) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= 4 && bytes[bytes.len() - 4..].eq_ignore_ascii_case(b".svg") {
        return Ok(path);
    }
    let instead = match path.file_name() {
        Some(_) => path.with_extension("svg"),
        None => path.join("plot.svg"),
    };
    Err(format!(
        "the plot is an SVG picture; give a file name ending in .svg, such as {}",
        instead.display()
    ))
}

/// Messages per second, by the rule `store.rate` has in the file.
pub(crate) fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if crate::sizing::is_rate(rate) => Ok(rate),
        _ => Err("expected messages per second greater than 0, such as 1000".to_owned()),
    }
}

pub(crate) fn parse_copies(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(copies) if copies > 0 => Ok(copies),
        _ => Err("expected a whole number of nsqd of at least 1, such as 2".to_owned()),
    }
}

pub(crate) fn parse_messages(text: &str) -> Result<f64, String> {
    match text.replace(['_', ','], "").parse::<f64>() {
        Ok(count) if (1.0..=MAX_WINDOW_MESSAGES).contains(&count) && count.fract() == 0.0 => {
            Ok(count)
        }
        _ => Err("expected a whole count of messages from 1 to 10^18, such as 3600000".to_owned()),
    }
}

/// A whole number from 1 to `max`, such as `--max-in-flight`.
fn parse_count(text: &str, max: u64) -> Result<u64, String> {
    match text.replace(['_', ','], "").parse::<u64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from 1 to {max}")),
    }
}

pub(crate) fn parse_in_flight(text: &str) -> Result<u32, String> {
    parse_count(text, u32::MAX.into()).map(|n| u32::try_from(n).expect("checked above"))
}

pub(crate) fn parse_attempts(text: &str) -> Result<u16, String> {
    parse_count(text, u16::MAX.into()).map(|n| u16::try_from(n).expect("checked above"))
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = crate::units::parse_duration(text)?;
    match duration {
        d if d.is_zero() => Err("expected a duration greater than 0".to_owned()),
        d => Ok(d),
    }
}

/// Slots per set, by the rule `store.ways` has in the file.
pub(crate) fn parse_ways(text: &str) -> Result<u32, String> {
    let ways = text
        .parse::<u32>()
        .map_err(|_| crate::sizing::WAYS_EXPECTED)?;
    crate::sizing::check_ways(ways)
        .map(|()| ways)
        .map_err(str::to_owned)
}
