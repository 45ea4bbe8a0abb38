//! Grows the in-process table that sizes itself (`store.probability` without `store.rate`):
//! every [`CHECK_EVERY`], the distinct rate of the last [`RATE_SPAN`] against the table's size
//! ([`Growth::decide`]), and a new generation when it falls short; a warning, once per status
//! interval, while `store.max_memory` leaves no room to grow.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::dedup::backend::Backend;
use crate::metrics::get;
use crate::pipeline::Dedupe;
use crate::sink::Handler;
use crate::sizing::growth::{Decision, Growth, CHECK_EVERY, RATE_SPAN};
use crate::units::{format_bytes, format_duration};
use crate::wording::{FlagOrigins, Named};
use crate::{LocalTable, Table};

/// How long a new generation waits for the table's lock at most before the next check
/// decides again (a snapshot being written holds it).
const PUSH_PATIENCE: Duration = Duration::from_secs(5);

/// Checks the table every [`CHECK_EVERY`] until `stop`, growing it as [`Growth::decide`] says.
pub(super) async fn grow_loop<H: Handler>(
    dedupe: Dedupe<Backend, H>,
    growth: Growth,
    warn_every: Duration,
    names: FlagOrigins,
    stop: CancellationToken,
) {
    let table = match dedupe.store() {
        Backend::Memory(table) | Backend::Journalled(table, _) if table.is_growable() => table,
        _ => return,
    };
    let metrics = dedupe.metrics();
    let ceiling = Named::key("store.max_memory");
    let ceiling = names.show(&ceiling);
    let geometry = table.with(Table::geometry);
    tracing::info!(
        buckets = geometry.slots(),
        memory = %format_bytes(geometry.memory_bytes()),
        max_memory = %format_bytes(growth.max_bytes),
        target = growth.probability,
        window = %format_duration(growth.window),
        "The table sizes itself: it grows for the distinct rate it meets, up to {ceiling}."
    );
    let mut recent = RecentRate::default();
    let mut warned: Option<Instant> = None;
    let mut tick = tick();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let Some(rate) = recent.sample(now, get(&metrics.unique)) else {
            continue;
        };
        let (geometry, held) = table.with(|t| (t.geometry(), t.held_bytes()));
        match growth.decide(geometry, held, rate) {
            Decision::Keep => {}
            Decision::Grow {
                geometry: next,
                probability,
                capped,
            } => {
                if grow(table, next, &stop).await {
                    metrics.table_resizes.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        old_buckets = geometry.slots(),
                        new_buckets = next.slots(),
                        old_memory = %format_bytes(geometry.memory_bytes()),
                        new_memory = %format_bytes(next.memory_bytes()),
                        held_memory = %format_bytes(table.with(Table::held_bytes)),
                        distinct_rate = format_args!("{rate:.1}"),
                        catch_probability = format_args!("{probability:.6}"),
                        capped,
                        "The table grew: at {rate:.0} distinct messages a second its entries would be evicted before the window ({}) ends, catching a copy one window late with probability {probability:.4}, below the target {}.",
                        format_duration(growth.window),
                        growth.probability,
                    );
                }
            }
            Decision::AtCeiling {
                probability,
                needed,
            } => {
                if warned.is_none_or(|at| now.duration_since(at) >= warn_every) {
                    warned = Some(now);
                    let needed_bytes =
                        needed.memory_bytes() * growth.slot_bytes / crate::Geometry::SLOT_BYTES;
                    tracing::warn!(
                        catch_probability = format_args!("{probability:.6}"),
                        target = growth.probability,
                        distinct_rate = format_args!("{rate:.1}"),
                        window = %format_duration(growth.window),
                        buckets = geometry.slots(),
                        needed_buckets = needed.slots(),
                        max_memory = %format_bytes(growth.max_bytes),
                        "The table is too small for the recent rate and cannot grow past {ceiling}: a copy one window late is caught with probability {probability:.4}, below the target {}; a table of {} would meet it, so {ceiling} of at least {} (that table and the {} held now, until they retire) lets it grow there.",
                        growth.probability,
                        format_bytes(needed_bytes),
                        format_bytes(needed_bytes + held),
                        format_bytes(held),
                    );
                }
            }
        }
    }
}

/// A timer of [`CHECK_EVERY`]s that waits out the ticks it missed.
pub(super) fn tick() -> tokio::time::Interval {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// This consumer's distinct rate over the last [`RATE_SPAN`] (or another span), from a count
/// sampled every tick.
pub(super) struct RecentRate {
    samples: VecDeque<(Instant, u64)>,
    span: Duration,
}

impl Default for RecentRate {
    fn default() -> Self {
        RecentRate::over(RATE_SPAN)
    }
}

impl RecentRate {
    /// The rate over the last `span`.
    pub(super) fn over(span: Duration) -> Self {
        RecentRate {
            samples: VecDeque::new(),
            span,
        }
    }

    /// Notes `count` distinct messages so far at `now`; the rate since the oldest sample
    /// kept, once two are more than an instant apart.
    pub(super) fn sample(&mut self, now: Instant, count: u64) -> Option<f64> {
        self.samples.push_back((now, count));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= self.span {
            self.samples.pop_front();
        }
        let (first, first_count) = self.samples[0];
        let span = now.duration_since(first).as_secs_f64();
        (span > 0.0).then(|| count.saturating_sub(first_count) as f64 / span)
    }
}

/// Starts a generation of `next`, waiting for the table's lock up to [`PUSH_PATIENCE`];
/// whether it did.
async fn grow(table: &LocalTable, next: crate::Geometry, stop: &CancellationToken) -> bool {
    let mut current = match table.with(|t| t.next_generation(next)) {
        Ok(current) => current,
        Err(error) => {
            tracing::warn!(%error, buckets = next.slots(), "The table could not grow.");
            return false;
        }
    };
    let started = Instant::now();
    loop {
        match table.push_generation(current) {
            Ok(()) => return true,
            Err(back) => current = back,
        }
        if started.elapsed() >= PUSH_PATIENCE || stop.is_cancelled() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
