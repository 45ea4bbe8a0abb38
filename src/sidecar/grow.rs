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
use crate::wording::{FlagOrigins, Named};
use crate::{LocalTable, Table};

use super::grow_log::{Voice, Whose};

/// How long a new generation waits for the table's lock at most before the next check
/// decides again (a snapshot being written holds it).
const PUSH_PATIENCE: Duration = Duration::from_secs(5);

/// What both growth loops take: the pipeline whose table grows, the rule, how often a table at
/// its ceiling warns, how the user named the settings, and when to stop.
pub(super) struct Growing<H: Handler> {
    pub(super) dedupe: Dedupe<Backend, H>,
    pub(super) growth: Growth,
    pub(super) warn_every: Duration,
    pub(super) names: FlagOrigins,
    pub(super) stop: CancellationToken,
}

impl<H: Handler> Growing<H> {
    /// What the table of `whose` says as it grows.
    pub(super) fn voice(&self, whose: Whose) -> Voice<'_> {
        let ceiling = self.names.show(&Named::key("store.max_memory")).to_string();
        Voice {
            whose,
            growth: &self.growth,
            ceiling,
        }
    }
}

/// Checks the table every [`CHECK_EVERY`] until `stop`, growing it as [`Growth::decide`] says.
pub(super) async fn grow_loop<H: Handler>(growing: Growing<H>) {
    let (dedupe, growth, stop) = (&growing.dedupe, &growing.growth, &growing.stop);
    let table = match dedupe.store() {
        Backend::Memory(table) | Backend::Journalled(table, _) if table.is_growable() => table,
        _ => return,
    };
    let metrics = dedupe.metrics();
    let voice = growing.voice(Whose::Own);
    voice.start(Some(table.with(Table::geometry)));
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
                if grow(table, next, stop).await {
                    metrics.table_resizes.fetch_add(1, Ordering::Relaxed);
                    let held = table.with(Table::held_bytes);
                    voice.grew(rate, (geometry, next), (probability, capped), held);
                }
            }
            Decision::AtCeiling {
                probability,
                needed,
            } => {
                if warned.is_none_or(|at| now.duration_since(at) >= growing.warn_every) {
                    warned = Some(now);
                    voice.at_ceiling(rate, (geometry, needed), probability, held);
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
