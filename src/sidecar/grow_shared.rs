//! Grows a shared table that sizes itself (`store.probability` without `store.rate`, with
//! Redis or Memcached): every tick, the rule of the in-process table ([`Growth::decide`]) on
//! the fleet's distinct rate, and a new generation of the store's table when it falls short.
//!
//! The fleet's rate is the larger of the one the store's counters give (see
//! [`crate::dedup::fleet`], learnt every `store.fleet_interval`) and this consumer's own over
//! the last half second ([`SHARED_RATE_SPAN`]) divided by its share of the fleet (times the
//! counters' rate over this consumer's own over the counters' span): the counters are a minute's average
//! (at the default interval), so a sudden rise shows first in each consumer's own rate.
//!
//! Whichever consumer decides first makes its decision the fleet's by a compare-and-set of the
//! table's descriptor ([`Generations::grow`]); the others follow it, and decide again on the
//! new size. `store.max_memory` bounds the table's generations together, counted as an
//! in-process table of the same buckets: one ceiling for the fleet's one table.
//!
//! The store keeps two generations, not more: a growth drops the generation before the
//! previous one. So a consumer does not grow the table again until the previous generation
//! has been read for one window since its switch, when every entry it holds that a copy
//! within the window could match has also been looked up there; until then a table that
//! falls short keeps catching what it can. For the same reason a growth waits until the table
//! has fallen short for [`SHARED_RATE_SPAN`], so that it is sized from a rate measured after a rise,
//! not half-way through it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::grow::{tick, Growing, RecentRate};
use super::grow_log::Whose;
use crate::dedup::fleet::{FleetCounters, FLEET_BUCKETS};
use crate::dedup::generational::{Generation, Generations};
use crate::dedup::shared::now_ms;
use crate::dedup::Store;
use crate::metrics::get;
use crate::sink::Handler;
use crate::sizing::growth::{Decision, SHARED_RATE_SPAN};

/// Checks the shared table every tick until `stop`, growing it as [`Growth::decide`] says.
pub(super) async fn grow_loop<S: Generation, H: Handler>(
    table: Generations<S>,
    growing: Growing<H>,
) {
    let (dedupe, growth, stop) = (&growing.dedupe, &growing.growth, &growing.stop);
    let metrics = dedupe.metrics();
    let voice = growing.voice(Whose::Fleet);
    let held = |table: &Generations<S>| {
        let slots = table.geometry().map_or(0, |g| g.slots())
            + table
                .previous()
                .map_or(0, |(shape, _)| shape.geometry.slots());
        slots.saturating_mul(growth.slot_bytes)
    };
    let mut seen = table.geometry();
    voice.start(seen);
    let held_at_start = held(&table);
    if held_at_start > growth.max_bytes {
        voice.above_ceiling(held_at_start);
    }
    let mut recent = RecentRate::over(SHARED_RATE_SPAN);
    let mut share = RecentRate::over(table.fleet_interval() * FLEET_BUCKETS as u32);
    let mut warned: Option<Instant> = None;
    let mut short_since: Option<Instant> = None;
    let mut tick = tick();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let count = get(&metrics.unique);
        let (Some(own), Some(own_long)) = (recent.sample(now, count), share.sample(now, count))
        else {
            continue;
        };
        let rate = rise_rate(metrics.rates.fleet(), own, own_long);
        let Some(geometry) = table.geometry() else {
            return;
        };
        if seen != Some(geometry) {
            // Another consumer's growth (or `nsq-dedupe resize`), followed.
            seen = Some(geometry);
            metrics.table_resizes.fetch_add(1, Ordering::Relaxed);
        }
        let previous_young = table.previous().is_some_and(|(_, since_ms)| {
            now_ms().saturating_sub(since_ms)
                < u64::try_from(growth.window.as_millis()).unwrap_or(u64::MAX)
        });
        let decision = growth.decide(geometry, held(&table), rate);
        if !matches!(decision, Decision::Grow { .. }) {
            short_since = None;
        }
        match decision {
            Decision::Grow { .. } if previous_young => {}
            // A shortfall seen for less than a span: the rate of a rise under way, measured
            // partly before it, would size a growth too small to last a window.
            Decision::Grow { .. }
                if now.duration_since(*short_since.get_or_insert(now)) < SHARED_RATE_SPAN => {}
            Decision::Keep => {}
            Decision::Grow {
                geometry: next,
                probability,
                capped,
            } => match table.grow(next).await {
                Ok(true) => {
                    seen = table.geometry();
                    metrics.table_resizes.fetch_add(1, Ordering::Relaxed);
                    let shapes = (geometry, next);
                    voice.grew(rate, shapes, (probability, capped), held(&table));
                }
                // Another consumer grew it first: followed, counted at the next tick.
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, buckets = next.slots(), "The shared table could not grow; trying again at the next check.");
                }
            },
            Decision::AtCeiling {
                probability,
                needed,
            } => {
                if warned.is_none_or(|at| now.duration_since(at) >= growing.warn_every) {
                    warned = Some(now);
                    voice.at_ceiling(rate, (geometry, needed), probability, held(&table));
                }
            }
        }
    }
}

/// The rate a growth is sized for: the fleet's, or this consumer's rate over the last
/// [`SHARED_RATE_SPAN`] divided by its share of the fleet (`own_long`, its rate over the fleet's span,
/// over the fleet's),
/// whichever is higher, so that a rise shows before the fleet's counters have seen it.
fn rise_rate(fleet: Option<f64>, own: f64, own_long: f64) -> f64 {
    match fleet {
        Some(fleet) if own_long > 0.0 => fleet.max(own * (fleet / own_long).max(1.0)),
        Some(fleet) => fleet.max(own),
        None => own,
    }
}
