//! Sizes, durations and counts as people write and read them: `64MiB`, `1h30m`, `34,168,399`.

// The lower layers print sizes only (`format_bytes`), the sidecar reads and prints sizes and
// durations, and the binary also prints counts (`format_count`).
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::time::Duration;

/// Parses a duration such as `500ms`, `30s`, `5m`, `1h`, `2d`, `1w` or `1h30m`.
///
/// # Errors
///
/// A message stating the accepted form (the caller names the value, once).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let error =
        || "expected a duration such as 30s, 5m, 1h or 2d (units ms, s, m, h, d, w)".to_owned();
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(error());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(error)?;
        let number: f64 = rest[..digits].parse().map_err(|_| error())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "w" => 604_800.0,
            _ => return Err(error()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| error())
}

/// Parses a byte size such as `64MiB`, `1GiB`, `100MB`, `512k`, `4096`, or as
/// [`format_bytes`] prints one, `47.4 MiB`: every size it prints parses back.
///
/// `K`, `M`, `G`, `T`, `P`, `E` and the `iB` forms are powers of 1024; `KB`, `MB`, `GB`, `TB`,
/// `PB`, `EB` are powers of 1000. At most 16 EiB (2^64 bytes; the largest count, one byte
/// less, is what that gives).
///
/// # Errors
///
/// A message stating the accepted form (the caller names the value, once).
pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let error = || "expected a size such as 64MiB, 1GiB, 500MB or 4096 (bytes)".to_owned();
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let number: f64 = trimmed[..split].parse().map_err(|_| error())?;
    let multiplier: f64 = match trimmed[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "p" | "pib" => 1024.0f64.powi(5),
        "e" | "eib" => 1024.0f64.powi(6),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        "eb" => 1e18,
        _ => return Err(error()),
    };
    let bytes = number * multiplier;
    // `u64::MAX as f64` is 2^64, 16 EiB, which the cast below ends at `u64::MAX`.
    if !(0.0..=u64::MAX as f64).contains(&bytes) {
        return Err("expected a size of at most 16EiB".to_owned());
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary unit: `47.4 MiB`.
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Formats a duration compactly: `1s`, `10m`, `1h30m`, `2d`.
pub(crate) fn format_duration(duration: Duration) -> String {
    let mut seconds = duration.as_secs();
    if seconds == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            out.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    out
}

/// Formats a count with thousands separators: `34,168,399`.
pub(crate) fn format_count(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        for bad in ["", "5", "5x", "h", "1h 2", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1g").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert_eq!(format_count(34_168_399), "34,168,399");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn the_largest_units_parse() {
        assert_eq!(parse_bytes("2PiB").unwrap(), 2 << 50);
        assert_eq!(parse_bytes("1.5 EiB").unwrap(), 3 << 59);
        assert_eq!(parse_bytes("3p").unwrap(), 3 << 50);
        assert_eq!(parse_bytes("1e").unwrap(), 1 << 60);
        assert_eq!(parse_bytes("2PB").unwrap(), 2_000_000_000_000_000);
        assert_eq!(parse_bytes("1EB").unwrap(), 1_000_000_000_000_000_000);
        // The largest size printed, 2^64 - 1, is "16.0 EiB": 2^64, which ends at the largest.
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
        assert_eq!(parse_bytes("16.0 EiB").unwrap(), u64::MAX);
        assert!(parse_bytes("17EiB").is_err());
    }

    proptest! {
        /// Every size `format_bytes` prints can be typed back: it parses to the same count,
        /// within the printed rounding (a tenth of the unit, at most 5% of the size).
        #[test]
        fn every_printed_size_parses_back(
            bytes in (any::<u64>(), 0u32..64).prop_map(|(n, shift)| n >> shift)
        ) {
            let text = format_bytes(bytes);
            let parsed = parse_bytes(&text)
                .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            let error = (parsed as f64 - bytes as f64).abs();
            prop_assert!(error <= 0.05 * bytes as f64 + 0.5, "{text:?} parsed to {parsed}, not about {bytes}");
        }
    }
}
