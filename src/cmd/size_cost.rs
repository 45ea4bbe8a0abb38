//! What a table costs, as `size` reports it: its memory in each store (times included with
//! `max_age`), what resizing it costs (two generations held at once, one more look-up per
//! claim while the previous one is read), and for a table that sizes itself where it starts,
//! how it grows and what its ceiling holds. `size` writes these as text and as JSON from the
//! same values, so the two agree.

use serde_json::{json, Value};

use crate::dedup::Geometry;
use crate::sizing::growth::{self, Growth, CHECK_EVERY, HEADROOM, INITIAL_ENTRIES};
use crate::sizing::{self, growth::RATE_SPAN, growth::SHARED_RATE_SPAN};

/// A full table's memory in each store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TableBytes {
    pub(super) in_process: u64,
    pub(super) memcached: u64,
    pub(super) redis: u64,
}

impl TableBytes {
    /// A full table of `geometry`; `timed` (`max_age`) puts a time beside each entry: 16 bytes
    /// a slot in process instead of 8, 12 an entry in Memcached and Redis instead of 8.
    pub(super) fn of(geometry: Geometry, timed: bool) -> Self {
        TableBytes {
            in_process: geometry.memory_bytes() * if timed { 2 } else { 1 },
            memcached: if timed {
                sizing::memcached_timed_bytes_estimate(geometry)
            } else {
                sizing::memcached_bytes_estimate(geometry)
            },
            redis: if timed {
                sizing::redis_timed_bytes_estimate(geometry)
            } else {
                sizing::redis_bytes_estimate(geometry)
            },
        }
    }

    fn plus(self, other: TableBytes) -> Self {
        TableBytes {
            in_process: self.in_process + other.in_process,
            memcached: self.memcached + other.memcached,
            redis: self.redis + other.redis,
        }
    }

    /// The JSON keys of `size`'s memory figures, each prefixed with `prefix`.
    pub(super) fn write_json(&self, value: &mut Value, prefix: &str) {
        value[format!("{prefix}memory_bytes")] = json!(self.in_process);
        value[format!("{prefix}memcached_bytes_estimate")] = json!(self.memcached);
        value[format!("{prefix}redis_bytes_estimate")] = json!(self.redis);
    }
}

/// What growing a table of fixed size to twice its buckets costs (`nsq-dedupe resize`, or a
/// table file restarted at another size): the old table stays, read-only, beside the new one
/// until it retires.
#[derive(Debug)]
pub(super) struct Resize {
    /// The new table.
    pub(super) to: Geometry,
    /// Both tables together, while the old one is read.
    pub(super) peak: TableBytes,
    /// New messages the new table takes before the old one retires: as many as it has slots
    /// (or, with `max_age`, until `max_age` has passed, whichever comes first).
    pub(super) retire_messages: u64,
    /// The same in seconds, at the rate given.
    pub(super) retire_seconds: Option<f64>,
}

impl Resize {
    /// Growing `geometry` to twice its buckets, at `rate` distinct messages a second when
    /// known; `None` for a table too large to double.
    pub(super) fn doubling(geometry: Geometry, timed: bool, rate: Option<f64>) -> Option<Self> {
        let to = Geometry::new(geometry.slots().checked_mul(2)?, geometry.ways()).ok()?;
        Some(Resize {
            to,
            peak: TableBytes::of(geometry, timed).plus(TableBytes::of(to, timed)),
            retire_messages: to.slots(),
            retire_seconds: rate.map(|rate| to.slots() as f64 / rate),
        })
    }

    pub(super) fn to_json(&self) -> Value {
        let mut value = json!({
            "to_buckets": self.to.slots(),
            "previous_read_messages": self.retire_messages,
            "previous_read_seconds": self.retire_seconds,
            "extra_reads_per_claim": 1,
        });
        self.peak.write_json(&mut value, "peak_");
        value
    }
}

/// A table that sizes itself (`--probability` and `--window` without a rate or a size): where
/// it starts, how it grows and what its ceiling holds.
#[derive(Debug)]
pub(super) struct SelfSizing {
    pub(super) growth: Growth,
    /// The first generation.
    pub(super) start: Geometry,
    /// The first generation the target asks for, which the ceiling may cut.
    pub(super) wanted_start: Option<Geometry>,
    pub(super) start_bytes: TableBytes,
    /// Whether the ceiling is the default one (no `--max-memory`).
    pub(super) default_ceiling: bool,
    /// The largest table under the whole ceiling, once the previous generations have retired.
    pub(super) ceiling_table: Option<Geometry>,
    /// The highest distinct rate that table meets the target at, in messages a second.
    pub(super) ceiling_rate: Option<f64>,
}

impl SelfSizing {
    /// The table `run --probability P --window W` makes without a rate or a size, within
    /// `max_bytes` (`None`: the default ceiling on this machine); `timed` with `max_age`.
    ///
    /// # Errors
    ///
    /// The reason not one set fits under the ceiling, or the probability is out of range.
    pub(super) fn new(
        probability: f64,
        window: std::time::Duration,
        ways: u32,
        max_bytes: Option<u64>,
        timed: bool,
    ) -> Result<Self, String> {
        let growth = Growth {
            probability,
            window,
            max_bytes: max_bytes.unwrap_or_else(|| {
                growth::default_max_bytes(crate::dedup::table::machine_memory_bytes())
            }),
            slot_bytes: Geometry::SLOT_BYTES * if timed { 2 } else { 1 },
        };
        let start = growth.initial(ways)?;
        let wanted_start = sizing::slots_for(probability, ways, INITIAL_ENTRIES).ok();
        let ceiling_table = growth.ceiling_table(ways);
        let ceiling_rate = ceiling_table
            .and_then(|table| sizing::window_for(table, probability).ok())
            .map(|messages| messages / window.as_secs_f64());
        Ok(SelfSizing {
            growth,
            start,
            wanted_start,
            start_bytes: TableBytes::of(start, timed),
            default_ceiling: max_bytes.is_none(),
            ceiling_table,
            ceiling_rate,
        })
    }

    /// Distinct messages a window the first generation has room for.
    pub(super) fn start_messages(&self) -> f64 {
        INITIAL_ENTRIES
    }

    /// How many times the rate seen a new generation is sized for.
    pub(super) fn headroom(&self) -> f64 {
        HEADROOM
    }

    pub(super) fn to_json(&self) -> Value {
        let mut value = json!({
            "start_buckets": self.start.slots(),
            "start_messages": INITIAL_ENTRIES,
            "check_interval_seconds": CHECK_EVERY.as_secs_f64(),
            "rate_span_seconds": RATE_SPAN.as_secs_f64(),
            "shared_rate_span_seconds": SHARED_RATE_SPAN.as_secs_f64(),
            "growth_factor": HEADROOM,
            "max_memory_bytes": self.growth.max_bytes,
            "max_memory_default": self.default_ceiling,
            "ceiling_buckets": self.ceiling_table.map(|table| table.slots()),
            "ceiling_rate": self.ceiling_rate,
            "extra_reads_per_claim_while_growing": 1,
        });
        self.start_bytes.write_json(&mut value, "start_");
        value
    }
}
