//! What a table that sizes itself says: the INFO when it starts, the INFO of each growth, and
//! the WARN, once per status interval, while `store.max_memory` leaves it no room to grow.
//! One wording for the in-process table ([`grow`](super::grow)) and the shared one
//! ([`grow_shared`](super::grow_shared)); memory is counted as the ceiling counts it
//! ([`Growth::slot_bytes`] a bucket).

use crate::dedup::Geometry;
use crate::sizing::growth::Growth;
use crate::units::{format_bytes, format_duration};

/// Whose table grows: this consumer's own, or the fleet's shared one.
#[derive(Clone, Copy)]
pub(super) enum Whose {
    /// The in-process table, for the distinct rate this consumer meets.
    Own,
    /// The store's table, for the fleet's distinct rate.
    Fleet,
}

impl Whose {
    fn table(self) -> &'static str {
        match self {
            Whose::Own => "The table",
            Whose::Fleet => "The shared table",
        }
    }

    fn rate(self) -> &'static str {
        match self {
            Whose::Own => "the recent rate",
            Whose::Fleet => "the fleet's recent rate",
        }
    }

    fn per_second(self) -> &'static str {
        match self {
            Whose::Own => "distinct messages a second",
            Whose::Fleet => "distinct messages a second across the fleet",
        }
    }

    fn grows_for(self) -> &'static str {
        match self {
            Whose::Own => "the distinct rate it meets",
            Whose::Fleet => "the fleet's distinct rate",
        }
    }
}

/// What one table that sizes itself says: whose it is, its rule, and its ceiling as the user
/// named it.
pub(super) struct Voice<'a> {
    pub(super) whose: Whose,
    pub(super) growth: &'a Growth,
    pub(super) ceiling: String,
}

impl Voice<'_> {
    /// The memory of a table of `geometry`, as `store.max_memory` counts it.
    fn memory(&self, geometry: Geometry) -> u64 {
        geometry.slots().saturating_mul(self.growth.slot_bytes)
    }

    /// The INFO of a table that starts sizing itself at `geometry` (none: not yet known).
    pub(super) fn start(&self, geometry: Option<Geometry>) {
        let (growth, ceiling) = (self.growth, &self.ceiling);
        tracing::info!(
            buckets = geometry.map_or(0, |g| g.slots()),
            memory = %format_bytes(geometry.map_or(0, |g| self.memory(g))),
            max_memory = %format_bytes(growth.max_bytes),
            target = growth.probability,
            window = %format_duration(growth.window),
            "{} sizes itself: it grows for {}, up to {ceiling}.",
            self.whose.table(),
            self.whose.grows_for(),
        );
    }

    /// The INFO of a growth from `geometry` to `next` at `rate`, after which every generation
    /// holds `held` bytes together.
    pub(super) fn grew(
        &self,
        rate: f64,
        (geometry, next): (Geometry, Geometry),
        (probability, capped): (f64, bool),
        held: u64,
    ) {
        let growth = self.growth;
        tracing::info!(
            old_buckets = geometry.slots(),
            new_buckets = next.slots(),
            old_memory = %format_bytes(self.memory(geometry)),
            new_memory = %format_bytes(self.memory(next)),
            held_memory = %format_bytes(held),
            distinct_rate = format_args!("{rate:.1}"),
            catch_probability = format_args!("{probability:.6}"),
            capped,
            "{} grew: at {rate:.0} {} its entries would be evicted before the window ({}) ends, catching a copy one window late with probability {probability:.4}, below the target {}.",
            self.whose.table(),
            self.whose.per_second(),
            format_duration(growth.window),
            growth.probability,
        );
    }

    /// The WARN of a table of `geometry`, holding `held` bytes in all its generations, that
    /// needs `needed` to meet the target at `rate` and cannot grow past its ceiling.
    pub(super) fn at_ceiling(
        &self,
        rate: f64,
        (geometry, needed): (Geometry, Geometry),
        probability: f64,
        held: u64,
    ) {
        let (growth, ceiling) = (self.growth, &self.ceiling);
        let needed_bytes = self.memory(needed);
        tracing::warn!(
            catch_probability = format_args!("{probability:.6}"),
            target = growth.probability,
            distinct_rate = format_args!("{rate:.1}"),
            window = %format_duration(growth.window),
            buckets = geometry.slots(),
            needed_buckets = needed.slots(),
            max_memory = %format_bytes(growth.max_bytes),
            "{} is too small for {} and cannot grow past {ceiling}: a copy one window late is caught with probability {probability:.4}, below the target {}; a table of {} would meet it, so {ceiling} of at least {} (that table and the {} held now, until they retire) lets it grow there.",
            self.whose.table(),
            self.whose.rate(),
            growth.probability,
            format_bytes(needed_bytes),
            format_bytes(needed_bytes.saturating_add(held)),
            format_bytes(held),
        );
    }

    /// The WARN of a consumer that found the table holding `held` bytes, more than its own
    /// ceiling: another consumer, with a higher one, grew it.
    pub(super) fn above_ceiling(&self, held: u64) {
        let (growth, ceiling) = (self.growth, &self.ceiling);
        tracing::warn!(
            held_memory = %format_bytes(held),
            max_memory = %format_bytes(growth.max_bytes),
            "{} holds {} in its generations, more than this consumer's {ceiling} of {}: another consumer grew it. This one follows it as it is (a table never shrinks) and does not grow it further. Give every consumer of the table the same {ceiling}.",
            self.whose.table(),
            format_bytes(held),
            format_bytes(growth.max_bytes),
        );
    }
}
