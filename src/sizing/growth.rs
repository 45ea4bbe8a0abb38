//! When a table that sizes itself grows, and to what size: pure decisions on the rate the
//! table meets, for `run --probability P --window W` without a rate or a size.
//!
//! Such a table starts small ([`Growth::initial`]: room for [`INITIAL_ENTRIES`] distinct
//! messages a window) and is checked every few hundred milliseconds against the distinct
//! rate of the last second or so ([`Growth::decide`]). It is too small *now* when, at that
//! rate, an entry is evicted before it is one window old: the catch probability a whole
//! window late ([`sizing::catch_probability`]) is below P. It then grows by a generation
//! (see `src/dedup/table/generations.rs`) sized with [`sizing::slots_for`] for
//! [`HEADROOM`] times the rate, so that a rise that keeps going is met by few resizes; the
//! previous generations stay behind it, read-only, until they retire, so nothing claimed
//! before is forgotten.
//!
//! A one-second rate sees a sudden rise within one check, where the 60-second rate of the
//! status line would take most of a minute; a table that evicts entries younger than the
//! window is losing copies at that very moment, so waiting for a smoother rate costs copies.
//!
//! `max_bytes` bounds what every generation held at once takes: the next generation gets what
//! is left of it. A table that cannot grow enough within it says so
//! ([`Decision::AtCeiling`]) and keeps catching what it can; once the previous generations
//! retire, their memory is free to grow into again.

use std::time::Duration;

use crate::dedup::Geometry;
use crate::sizing;

/// Distinct messages a window that a table sizing itself starts with room for.
pub(crate) const INITIAL_ENTRIES: f64 = 1024.0;

/// How many times the observed rate a new generation is sized for.
pub(crate) const HEADROOM: f64 = 2.0;

/// How often a table that sizes itself is checked.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The span of the in-process table's rate: short, so that a sudden rise is met within a
/// check or two.
pub(crate) const RATE_SPAN: Duration = Duration::from_secs(1);

/// The span of a shared table consumer's own rate: half the in-process table's, since a
/// shared table grows at most once a window and its growth must see most of a rise (see
/// `src/sidecar/grow_shared.rs`).
pub(crate) const SHARED_RATE_SPAN: Duration = Duration::from_millis(500);

/// The ceiling of a table sizing itself when none is given: a quarter of the machine's
/// memory, at most 1 GiB.
pub(crate) fn default_max_bytes(machine_bytes: Option<u64>) -> u64 {
    const GIB: u64 = 1 << 30;
    machine_bytes.map_or(GIB, |bytes| (bytes / 4).min(GIB))
}

/// What a table sizing itself keeps to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Growth {
    /// The catch probability a whole window late (`store.probability`).
    pub probability: f64,
    /// The window (`store.window`).
    pub window: Duration,
    /// What every generation held at once may take (`store.max_memory`).
    pub max_bytes: u64,
    /// Bytes a slot takes: 8, or 16 with `max_age` (a time beside each slot).
    pub slot_bytes: u64,
}

/// What to do with the table now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Decision {
    /// It meets the probability at the rate it sees.
    Keep,
    /// Start a generation of this shape.
    Grow {
        /// The new generation's shape.
        geometry: Geometry,
        /// The catch probability a window late the table meets now.
        probability: f64,
        /// Whether the ceiling cut it below what the rate asks for.
        capped: bool,
    },
    /// It falls short and the ceiling leaves no room to grow.
    AtCeiling {
        /// The catch probability a window late the table meets now.
        probability: f64,
        /// The table that would meet the target at this rate.
        needed: Geometry,
    },
}

impl Growth {
    /// The first generation: room for [`INITIAL_ENTRIES`] a window, within the ceiling.
    ///
    /// # Errors
    ///
    /// A reason naming what is wrong when not one set fits under `max_bytes`, or the
    /// probability is out of range.
    pub(crate) fn initial(&self, ways: u32) -> Result<Geometry, String> {
        let wanted = sizing::slots_for(self.probability, ways, INITIAL_ENTRIES)
            .map_err(|error| error.to_string())?;
        let room = self.fit(ways, self.max_bytes).ok_or_else(|| {
            format!(
                "holds less than one set of {ways} slots ({} bytes)",
                u64::from(ways) * self.slot_bytes
            )
        })?;
        Ok(if room.slots() < wanted.slots() {
            room
        } else {
            wanted
        })
    }

    /// Whether a table of `current` shape, whose generations take `held_bytes` together,
    /// should grow, seeing `rate` distinct messages a second.
    pub(crate) fn decide(&self, current: Geometry, held_bytes: u64, rate: f64) -> Decision {
        if !(rate > 0.0 && rate.is_finite()) {
            return Decision::Keep;
        }
        let messages = rate * self.window.as_secs_f64();
        let probability = sizing::catch_probability(current, messages);
        if probability >= self.probability {
            return Decision::Keep;
        }
        let ways = current.ways();
        let needed = sizing::slots_for(self.probability, ways, messages).ok();
        let wanted = sizing::slots_for(self.probability, ways, messages * HEADROOM).ok();
        let room = self.fit(ways, self.max_bytes.saturating_sub(held_bytes));
        match (wanted, room) {
            (Some(wanted), Some(room)) if wanted.slots() <= room.slots() => Decision::Grow {
                geometry: wanted,
                probability,
                capped: false,
            },
            // Only a table larger than this one is worth a generation.
            (_, Some(room)) if room.slots() > current.slots() => Decision::Grow {
                geometry: room,
                probability,
                capped: true,
            },
            _ => Decision::AtCeiling {
                probability,
                needed: needed.unwrap_or(current),
            },
        }
    }

    /// The largest table of `ways` under the whole ceiling, as the table may grow to once
    /// its previous generations have retired.
    #[cfg(feature = "cli")]
    pub(crate) fn ceiling_table(&self, ways: u32) -> Option<Geometry> {
        self.fit(ways, self.max_bytes)
    }

    /// The largest table of `ways` that takes at most `bytes`.
    fn fit(&self, ways: u32, bytes: u64) -> Option<Geometry> {
        let per_slot = self.slot_bytes / Geometry::SLOT_BYTES;
        Geometry::with_memory(bytes / per_slot.max(1), ways).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn growth(max_bytes: u64) -> Growth {
        Growth {
            probability: 0.99,
            window: Duration::from_secs(30),
            max_bytes,
            slot_bytes: 8,
        }
    }

    #[test]
    fn a_table_that_meets_the_target_at_the_rate_it_sees_keeps_its_size() {
        let g = growth(64 * MIB);
        let table = g.initial(8).unwrap();
        assert!(sizing::catch_probability(table, INITIAL_ENTRIES) >= 0.99);
        // 30 messages a second for 30 s: 900 a window, less than it has room for.
        assert_eq!(g.decide(table, table.memory_bytes(), 30.0), Decision::Keep);
        assert_eq!(g.decide(table, table.memory_bytes(), 0.0), Decision::Keep);
    }

    #[test]
    fn a_sudden_rise_grows_the_table_for_twice_the_rate() {
        let g = growth(64 * MIB);
        let table = g.initial(8).unwrap();
        // 4,000 a second: 120,000 a window.
        let Decision::Grow {
            geometry,
            probability,
            capped,
        } = g.decide(table, table.memory_bytes(), 4000.0)
        else {
            panic!("no growth at 4,000 a second");
        };
        assert!(probability < 0.99, "{probability}");
        assert!(!capped);
        assert_eq!(geometry, sizing::slots_for(0.99, 8, 240_000.0).unwrap());
        // The new generation meets the target at that rate, and at twice it.
        assert!(sizing::catch_probability(geometry, 240_000.0) >= 0.99);
        assert_eq!(
            g.decide(geometry, geometry.memory_bytes(), 4000.0),
            Decision::Keep
        );
    }

    #[test]
    fn the_ceiling_caps_the_next_generation_then_stops_growth() {
        // 4 MiB, of which the previous generations hold 1 MiB.
        let g = growth(4 * MIB);
        let table = Geometry::with_memory(MIB / 2, 8).unwrap();
        let Decision::Grow {
            geometry, capped, ..
        } = g.decide(table, MIB, 40_000.0)
        else {
            panic!("no growth within the ceiling");
        };
        assert!(capped);
        assert_eq!(geometry, Geometry::with_memory(3 * MIB, 8).unwrap());
        // With the ceiling reached, it says what would meet the target instead.
        match g.decide(geometry, 4 * MIB, 40_000.0) {
            Decision::AtCeiling {
                probability,
                needed,
            } => {
                assert!(probability < 0.99);
                assert_eq!(needed, sizing::slots_for(0.99, 8, 1_200_000.0).unwrap());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_beside_the_slots_count_against_the_ceiling() {
        let timed = Growth {
            slot_bytes: 16,
            ..growth(4 * MIB)
        };
        let table = Geometry::with_memory(MIB / 4, 8).unwrap();
        let Decision::Grow { geometry, .. } = timed.decide(table, MIB / 2, 40_000.0) else {
            panic!("no growth within the ceiling");
        };
        assert_eq!(geometry.memory_bytes(), (4 * MIB - MIB / 2) / 2);
    }

    #[test]
    fn the_first_generation_fits_under_a_small_ceiling_or_is_refused() {
        let g = growth(4096);
        assert_eq!(g.initial(8).unwrap().memory_bytes(), 4096);
        assert_eq!(
            growth(32).initial(8).unwrap_err(),
            "holds less than one set of 8 slots (64 bytes)"
        );
    }

    #[test]
    fn the_default_ceiling_is_a_quarter_of_the_machine_at_most_1_gib() {
        assert_eq!(default_max_bytes(Some(16 << 30)), 1 << 30);
        assert_eq!(default_max_bytes(Some(2 << 30)), 512 * MIB);
        assert_eq!(default_max_bytes(None), 1 << 30);
    }
}
