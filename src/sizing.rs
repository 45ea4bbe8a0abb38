//! Sizing: pure functions between table size, catch probability and window.
//!
//! A copy of a message arrives some number `x` of *distinct* messages after the original. It is
//! caught if the original's entry is still in the table by then.
//!
//! - Classic table (`ways = 1`, N buckets): each later digest overwrites the entry with
//!   probability 1/N, so P(caught) = (1 - 1/N)^x.
//! - Set-associative with FIFO replacement (N slots in sets of w): each later digest lands in
//!   the entry's set with probability p = w/N, and the entry survives while fewer than w of them
//!   have, so P(caught) = P(Binomial(x, p) <= w - 1) = sum over k < w of C(x,k) p^k (1-p)^(x-k).
//!
//! Both formulas are evaluated in log space with `ln_1p`, because at the sizes people use
//! (p around 1e-7, x around 1e7) `(1 - p)^x` computed naively loses most of its digits.
//!
//! # Memory
//!
//! The in-process table takes 8 bytes per slot ([`Geometry::SLOT_BYTES`]), 16 with `max_age`
//! (a time beside each). In Memcached an item holds 64 slots (whole sets) of 8 bytes (12 with
//! `max_age`); [`memcached_bytes_estimate`] adds memcached's
//! per-item overhead. In Redis a key holds 64 slots in the same layout;
//! [`redis_bytes_estimate`] adds what Redis spends on a key besides its value, and rounds the
//! value up to its allocator's size class, as `MEMORY USAGE` reports a full key.
//!
//! Worked example (1,000 msg/s, a one-hour window, so x = 3.6 M):
//!
//! | catch probability | `ways = 1` | `ways = 8` |
//! |---|---|---|
//! | 0.9  | 34,168,399 slots (273 MB) | 6,185,416 slots (49 MB) |
//! | 0.99 | 358,196,986 slots (2.9 GB) | 9,910,168 slots (79 MB) |

use crate::dedup::Geometry;

#[cfg(feature = "sidecar")]
pub(crate) mod growth;

/// The window the catch probability is reported for when none is configured: one hour.
pub const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// The catch probability a table is expected to keep when `store.probability` is not given:
/// the target `store.rate` alone sizes for, and the one the "too small" warning holds it to.
#[cfg(feature = "sidecar")]
pub(crate) const DEFAULT_TARGET_PROBABILITY: f64 = 0.99;

/// Memcached's per-item overhead as its `bytes` statistic counts it: the item header with
/// its CAS value (56 bytes), the value's line end, and the key
/// (`<namespace>:v2:<sets>x<ways>g<sets per item>:<item>`, about 32 bytes). Slab rounding
/// (up to a quarter more, by default) comes on top. An estimate; the density benchmark
/// measures it (`bench/store-density.sh`).
const MEMCACHED_ITEM_OVERHEAD_BYTES: u64 = 90;

/// Bytes one entry takes in a compact Memcached item (its fingerprint; entries in flight take
/// 17 more while they are, and a timed table, with `max_age`, 4 more each).
const MEMCACHED_ENTRY_BYTES: u64 = 8;

/// Bytes an entry's time adds in a compact Memcached item of a timed table (`max_age`).
#[cfg(feature = "cli")]
const MEMCACHED_TIME_BYTES: u64 = 4;

/// Bytes of an item's value besides its entries: the header (4) and a cursor per set.
const MEMCACHED_ITEM_HEADER_BYTES: u64 = 4;

/// Redis's bytes per key outside `MEMORY USAGE`: its slot in the main dictionary (410 bytes
/// per 8-way set measured as `used_memory` over 100,000 keys, 392 by `MEMORY USAGE`).
const REDIS_DICT_BYTES: u64 = 18;

/// Redis's bytes for a key besides its value's allocation, as `MEMORY USAGE` counts them
/// (Redis 7.0, 64-bit, jemalloc): the value's object (16), the key's name
/// (`nsq-dedupe:v3:<sets>x<ways>g<sets a key>:<n>`, 30 to 40 bytes, in a 48-byte
/// allocation) and its dictionary entry (24). Valkey 8.1 embeds the key in its object and
/// spends less.
const REDIS_KEY_BYTES: u64 = 16 + 48 + 24;

/// What jemalloc allocates for a request of `bytes`: its size class (8, then steps of 16 up to
/// 128, then four classes between two powers of two).
fn jemalloc_class(bytes: u64) -> u64 {
    if bytes <= 8 {
        return 8;
    }
    if bytes <= 128 {
        return bytes.div_ceil(16) * 16;
    }
    let step = bytes.next_power_of_two() / 8;
    bytes.div_ceil(step) * step
}

/// The probability that a copy arriving `distinct_after` distinct messages after the original
/// is still caught by a table of this shape.
///
/// `distinct_after` may be fractional (a rate times a window). Returns a value in `[0, 1]`.
pub fn catch_probability(geometry: Geometry, distinct_after: f64) -> f64 {
    let ways = geometry.ways();
    if distinct_after <= f64::from(ways - 1) {
        // Fewer later digests than the set holds beside the entry: none can evict it.
        return 1.0;
    }
    if geometry.sets() == 1 {
        // Every later digest lands in the one set: the entry survives exactly w - 1 of them.
        return if distinct_after <= f64::from(ways - 1) {
            1.0
        } else {
            0.0
        };
    }
    let p = 1.0 / geometry.sets() as f64;
    let ln_p = p.ln();
    let ln_q = (-p).ln_1p();
    let x = distinct_after;
    // Terms of the binomial sum in log space; C(x, k) = prod_{i<k} (x - i) / (i + 1).
    let mut ln_terms = Vec::with_capacity(ways as usize);
    let mut ln_choose = 0.0;
    for k in 0..ways {
        if k > 0 {
            let i = f64::from(k - 1);
            if x - i <= 0.0 {
                break; // Fewer than k later messages: C(x, k) = 0.
            }
            ln_choose += (x - i).ln() - (i + 1.0).ln();
        }
        let k = f64::from(k);
        ln_terms.push(ln_choose + k * ln_p + (x - k) * ln_q);
    }
    // At least `ways` later digests may all land in the entry's set, so the catch is never
    // certain: a sum that rounds to 1 is shown as just below it.
    log_sum_exp(&ln_terms).exp().clamp(0.0, 1.0 - f64::EPSILON)
}

fn log_sum_exp(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + values.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
}

/// Why a size could not be found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizingError {
    /// The probability is not strictly between 0 and 1.
    #[error("`probability` must be between 0 and 1 exclusive (0 < p < 1), got {0}")]
    Probability(f64),
    /// No table that fits in memory reaches the probability.
    #[error("no table below 2^60 slots catches {probability} of copies {window_messages} messages later; lower the probability or the window")]
    Unreachable {
        /// The target probability.
        probability: f64,
        /// The window in messages.
        window_messages: f64,
    },
}

/// The smallest table of `ways`-way sets (whole sets) whose catch probability at
/// `window_messages` is at least `probability`.
///
/// # Errors
///
/// [`SizingError`] if `probability` is outside (0, 1) or no table below 2^60 slots reaches it;
/// `ways` must be 1, 2, 4 or 8 (an unsupported value is reported as unreachable).
pub fn slots_for(
    probability: f64,
    ways: u32,
    window_messages: f64,
) -> Result<Geometry, SizingError> {
    check_probability(probability)?;
    let unreachable = SizingError::Unreachable {
        probability,
        window_messages,
    };
    let geometry = |sets: u64| Geometry::new(sets * u64::from(ways), ways).ok();
    let reaches = |sets: u64| {
        geometry(sets).is_some_and(|g| catch_probability(g, window_messages) >= probability)
    };
    // Grow until the target is reached, then bisect: the probability rises with the size.
    let limit = (1u64 << 60) / u64::from(ways.max(1));
    let mut high = 1u64;
    while !reaches(high) {
        if high >= limit {
            return Err(unreachable);
        }
        high = (high * 2).min(limit);
    }
    let mut low = high / 2; // Does not reach (or is 0).
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if reaches(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    geometry(high).ok_or(unreachable)
}

/// The longest window, in distinct messages, over which a table of this shape still catches
/// copies with at least `probability`.
///
/// # Errors
///
/// [`SizingError::Probability`] if `probability` is outside (0, 1).
pub fn window_for(geometry: Geometry, probability: f64) -> Result<f64, SizingError> {
    check_probability(probability)?;
    if geometry.ways() == 1 && geometry.sets() > 1 {
        // Closed form: x = ln P / ln(1 - 1/N).
        return Ok(probability.ln() / (-1.0 / geometry.sets() as f64).ln_1p());
    }
    let reaches = |x: f64| catch_probability(geometry, x) >= probability;
    let mut high = 1.0;
    while reaches(high) {
        high *= 2.0;
        if high > 1e30 {
            return Ok(high);
        }
    }
    let mut low = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if reaches(mid) {
            low = mid;
        } else {
            high = mid;
        }
        if high - low <= 1e-9 * high {
            break;
        }
    }
    Ok(low)
}

/// The rule of a target probability, in a flag, the file or a call: strictly between 0 and 1.
pub(crate) fn check_probability(probability: f64) -> Result<(), SizingError> {
    if probability > 0.0 && probability < 1.0 {
        Ok(())
    } else {
        Err(SizingError::Probability(probability))
    }
}

/// The rule of a rate of distinct messages per second, in a flag or the file: more than 0, and
/// finite.
#[cfg(feature = "sidecar")]
pub(crate) fn is_rate(rate: f64) -> bool {
    rate > 0.0 && rate.is_finite()
}

/// The rule of a table's ways, in a flag or the file: the associativities a set supports
/// ([`Geometry::SUPPORTED_WAYS`]), with what is expected when refused.
///
/// # Errors
///
/// What the ways may be: `expected 1, 2, 4 or 8`.
#[cfg(feature = "sidecar")]
pub(crate) fn check_ways(ways: u32) -> Result<(), &'static str> {
    if Geometry::SUPPORTED_WAYS.contains(&ways) {
        Ok(())
    } else {
        Err(WAYS_EXPECTED)
    }
}

/// What a table's ways may be, as an error says it.
#[cfg(feature = "sidecar")]
pub(crate) const WAYS_EXPECTED: &str = "expected 1, 2, 4 or 8";

/// Estimated Memcached memory for a full table of this shape in the compact layout (as its
/// `bytes` statistic counts it, without slab rounding): an item per
/// `MemcachedConfig::slots_per_item` slots (64 by default) (whole sets), each its overhead, a cursor per set and
/// 8 bytes per entry, no entry in flight and no `max_age`.
pub fn memcached_bytes_estimate(geometry: Geometry) -> u64 {
    memcached_bytes(geometry, MEMCACHED_ENTRY_BYTES)
}

/// [`memcached_bytes_estimate`] for a table with `max_age`, whose entries carry a time.
#[cfg(feature = "cli")]
pub(crate) fn memcached_timed_bytes_estimate(geometry: Geometry) -> u64 {
    memcached_bytes(geometry, MEMCACHED_ENTRY_BYTES + MEMCACHED_TIME_BYTES)
}

fn memcached_bytes(geometry: Geometry, entry_bytes: u64) -> u64 {
    let ways = u64::from(geometry.ways());
    let sets_per_item = (u64::from(crate::dedup::MEMCACHED_SLOTS_PER_ITEM) / ways).max(1);
    let items = geometry.sets().div_ceil(sets_per_item);
    items * (MEMCACHED_ITEM_OVERHEAD_BYTES + MEMCACHED_ITEM_HEADER_BYTES)
        + geometry.sets() * (1 + entry_bytes * ways)
}

/// Bytes one full set of `ways` ways takes in Redis in the layout of a key per set (key
/// format 2, which a table moves from): what Redis 7.0 (64-bit, jemalloc)
/// reports with `MEMORY USAGE` for a full set's key (`nsq-dedupe:v1:<sets>x<ways>:<set>`,
/// value 3 + 34 × ways bytes): the key, the value and their headers in jemalloc's size
/// classes. The Redis tests measure it again.
pub fn redis_set_bytes(ways: u32) -> u64 {
    match ways {
        1 => 136,
        2 => 152,
        4 => 232,
        // 8, the most a set has.
        _ => 392,
    }
}

/// Redis memory for a full table of this shape in the layout of a key per set (key format
/// 2): one string key per set, each as large as `MEMORY USAGE` measures a full set, plus its
/// slot in the main dictionary.
pub fn redis_sets_bytes_estimate(geometry: Geometry) -> u64 {
    geometry.sets() * (redis_set_bytes(geometry.ways()) + REDIS_DICT_BYTES)
}

/// Bytes a full key of the compact layout takes in Redis, as `MEMORY USAGE` reports it: its
/// value (a header, a cursor per set, 8 bytes an entry, 12 when `timed`, for `max_age`), in
/// its string's header and jemalloc's size class, and the key's own bytes. A key of 64 slots
/// of 8 bytes is a 524-byte value, kept in 640.
pub fn redis_key_bytes(sets: u64, ways: u32, timed: bool) -> u64 {
    let entry = MEMCACHED_ENTRY_BYTES + if timed { 4 } else { 0 };
    let value = MEMCACHED_ITEM_HEADER_BYTES + sets * (1 + entry * u64::from(ways));
    // A string's header: 3 bytes below 256, 5 below 65,536; and its final zero.
    let header = if value < 256 { 3 } else { 5 };
    jemalloc_class(value + header + 1) + REDIS_KEY_BYTES
}

/// Redis memory for a full table of this shape in the compact layout (key format 3): a key
/// per 64 slots (whole sets, `REDIS_SLOTS_PER_KEY`), each as [`redis_key_bytes`] says, plus
/// its slot in the main dictionary; no entry in flight and no `max_age`. Valkey 8.1 counts
/// up to a tenth less for the same table (it embeds a key's name in its object).
pub fn redis_bytes_estimate(geometry: Geometry) -> u64 {
    redis_bytes(geometry, false)
}

/// [`redis_bytes_estimate`] for a table with `max_age`, whose entries carry a time.
#[cfg(feature = "cli")]
pub(crate) fn redis_timed_bytes_estimate(geometry: Geometry) -> u64 {
    redis_bytes(geometry, true)
}

fn redis_bytes(geometry: Geometry, timed: bool) -> u64 {
    let ways = geometry.ways();
    let per_key = (u64::from(crate::dedup::REDIS_SLOTS_PER_KEY) / u64::from(ways)).max(1);
    let (full, rest) = (geometry.sets() / per_key, geometry.sets() % per_key);
    let key = |sets: u64| redis_key_bytes(sets, ways, timed) + REDIS_DICT_BYTES;
    full * key(per_key) + if rest > 0 { key(rest) } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_AT_1K: f64 = 3_600_000.0;

    fn geometry(slots: u64, ways: u32) -> Geometry {
        Geometry::new(slots, ways).unwrap()
    }

    #[test]
    fn classic_table_matches_the_published_example_corrected() {
        let g = slots_for(0.9, 1, HOUR_AT_1K).unwrap();
        assert_eq!(g.slots(), 34_168_399);
        // The often-quoted 1,563,461 buckets catch only about 10% of copies an hour late.
        let p = catch_probability(geometry(1_563_461, 1), HOUR_AT_1K);
        assert!((p - 0.1).abs() < 1e-3, "{p}");
        assert_eq!(slots_for(0.99, 1, HOUR_AT_1K).unwrap().slots(), 358_196_986);
    }

    #[test]
    fn eight_ways_need_far_fewer_slots() {
        let at_90 = slots_for(0.9, 8, HOUR_AT_1K).unwrap();
        let at_99 = slots_for(0.99, 8, HOUR_AT_1K).unwrap();
        assert_eq!(at_90.slots() % 8, 0, "whole sets");
        assert_eq!(at_90.slots(), 6_185_416);
        assert_eq!(at_99.slots(), 9_910_168);
        assert!((49.0e6..50.0e6).contains(&(at_90.memory_bytes() as f64)));
        assert!((78.0e6..80.0e6).contains(&(at_99.memory_bytes() as f64)));
        // The smallest: one set fewer misses the target.
        let smaller = geometry(at_90.slots() - 8, 8);
        assert!(catch_probability(smaller, HOUR_AT_1K) < 0.9);
        assert!(catch_probability(at_90, HOUR_AT_1K) >= 0.9);
    }

    #[test]
    fn one_way_binomial_equals_the_closed_form() {
        for (slots, x) in [(1000u64, 500.0), (34_168_399, HOUR_AT_1K), (7, 3.0)] {
            let closed = (x * (-1.0 / slots as f64).ln_1p()).exp();
            let p = catch_probability(geometry(slots, 1), x);
            assert!((p - closed).abs() < 1e-12, "{slots} {x}: {p} vs {closed}");
        }
    }

    #[test]
    fn small_cases_match_exact_binomial_sums() {
        // 4 sets of 2 ways, 3 later digests: P(Bin(3, 1/4) <= 1) = (3/4)^3 + 3 (1/4) (3/4)^2.
        let exact = 0.75f64.powi(3) + 3.0 * 0.25 * 0.75f64.powi(2);
        assert!((catch_probability(geometry(8, 2), 3.0) - exact).abs() < 1e-12);
        // One set of 8: the entry survives exactly 7 later digests.
        assert_eq!(catch_probability(geometry(8, 8), 7.0), 1.0);
        assert_eq!(catch_probability(geometry(8, 8), 8.0), 0.0);
        assert_eq!(catch_probability(geometry(8, 8), 0.0), 1.0);
    }

    #[test]
    fn solving_round_trips() {
        for ways in [1, 2, 4, 8] {
            for &p in &[0.5, 0.9, 0.99, 0.999] {
                let g = slots_for(p, ways, 1e6).unwrap();
                let window = window_for(g, p).unwrap();
                assert!(window >= 1e6 * (1.0 - 1e-9), "{ways} {p}: {window}");
                let back = catch_probability(g, window);
                assert!((back - p).abs() < 1e-6, "{ways} {p}: {back}");
            }
        }
    }

    #[test]
    fn bad_probabilities_are_rejected() {
        for p in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            assert!(slots_for(p, 8, 100.0).is_err());
        }
        assert_eq!(
            slots_for(1.0, 8, 100.0).unwrap_err().to_string(),
            "`probability` must be between 0 and 1 exclusive (0 < p < 1), got 1"
        );
    }
}
