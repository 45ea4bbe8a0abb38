//! Counters of the sidecar; `exposition` renders them for Prometheus, with the process's own
//! figures from `process.rs`.
//!
//! One [`Metrics`] per pipeline, shared by its tasks behind an `Arc`. Every outcome of a message
//! has its own counter (one event per outcome, as vector's `internal_events`), so the counters
//! add up: `received = duplicates + in_flight_requeues + in_flight_finished + deferred_copies +
//! unique + keyless + store_errors_at_claim` (a keyless message is both `keyless` and handled
//! as unique; a copy held beside its original is counted once it is answered, as a duplicate
//! or as whatever deciding it again makes of it; `copies_held` counts how many waited).
//!
//! All counters are `AtomicU64` with `Relaxed` ordering: they are statistics that no other
//! memory depends on, and readers only need eventually-consistent totals.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::dedup::Geometry;
use crate::sizing;

#[cfg(feature = "sidecar")]
pub(crate) mod exposition;
#[cfg(feature = "sidecar")]
mod process;
pub(crate) mod rate;

use rate::RateTracker;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0,
];

/// A latency histogram with fixed buckets, lock-free.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        self.observe_many(elapsed, 1);
    }

    /// Records `n` observations of the same value (the records of one batch).
    pub fn observe_many(&self, elapsed: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let secs = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(n, Ordering::Relaxed);
        }
        self.count.fetch_add(n, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos
            .fetch_add(nanos.saturating_mul(n), Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Observations per bucket (not cumulative), each with its upper bound in seconds, the
    /// last one unbounded (`f64::MAX`); and the sum of the observations in seconds.
    pub fn buckets(&self) -> (Vec<(f64, u64)>, f64) {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        let bounded: u64 = buckets.iter().map(|(_, n)| n).sum();
        buckets.push((f64::MAX, self.count().saturating_sub(bounded)));
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        (buckets, sum)
    }
}

/// The sidecar's counters. See the module docs for how they add up.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    /// Messages received, per source nsqd address. A read lock and a linear scan per message:
    /// there are a handful of sources, and the write lock is only taken for a new one.
    received: RwLock<Vec<(String, AtomicU64)>>,
    /// Digests claimed as new and handed to the handler: a message that comes back after a
    /// failure or a REQ (its claim erased) is claimed new again and counted again.
    pub unique: AtomicU64,
    /// Copies recognised and finished without reaching the handler.
    pub duplicates: AtomicU64,
    /// Copies found in flight and requeued to be decided later.
    pub in_flight_requeues: AtomicU64,
    /// Copies found in flight and finished (`on_in_flight = "finish"`).
    pub in_flight_finished: AtomicU64,
    /// Copies found in flight here, held beside their original until it settled.
    pub copies_held: AtomicU64,
    /// Copies of a message whose receiver asked for it later, requeued to come back then.
    pub deferred_copies: AtomicU64,
    /// Bodies without a key, passed on as unique.
    pub keyless: AtomicU64,
    /// Handler calls that succeeded.
    pub handler_successes: AtomicU64,
    /// Handler calls that failed (retryable or not).
    pub handler_failures: AtomicU64,
    /// Records the handler's receiver asked to have later (a consumer's REQ through the serve
    /// sink), requeued with its delay, and records a stopping sink handed back because no
    /// consumer could take them: not failures.
    pub handler_requeues: AtomicU64,
    /// Handler call durations.
    pub handler_duration: Histogram,
    /// Entries erased after a handler failure so that the retry is not taken for a copy.
    pub erased: AtomicU64,
    /// Messages written to the dead-letter.
    pub dead_lettered: AtomicU64,
    /// Dead-letter writes that failed (the message was requeued instead).
    pub dead_letter_failures: AtomicU64,
    /// Messages requeued after a handler failure.
    pub retries: AtomicU64,
    /// Store errors, every one.
    pub store_errors: AtomicU64,
    /// Messages requeued because the store failed at claim (`on_store_error = "requeue"`).
    pub store_error_requeues: AtomicU64,
    /// Messages delivered without de-duplication because the store failed
    /// (`on_store_error = "process"`).
    pub store_error_processed: AtomicU64,
    /// Store call latencies.
    pub store_latency: Histogram,
    /// FIN/REQ/TOUCH that nsqd can no longer take (the message timed out or its connection
    /// closed); nsqd redelivers those messages.
    pub answer_failures: AtomicU64,
    /// TOUCHes sent while a handler ran.
    pub touches: AtomicU64,
    /// Lease renewals that failed or found the claim gone.
    pub renew_failures: AtomicU64,
    /// Handler calls given up at shutdown (claim erased, message requeued).
    pub abandoned: AtomicU64,
    /// nsqd connections up and subscribed now (a gauge the sidecar keeps current).
    pub nsqd_connections: AtomicU64,
    /// Whether the store's last operation failed.
    pub store_failing: AtomicBool,
    /// New generations the in-process table took to size itself (`store.probability`
    /// without `store.rate`).
    pub table_resizes: AtomicU64,
    /// The distinct rate now and its peak over the window, sampled by [`sample_rate`](Metrics::sample_rate).
    pub(crate) rates: RateTracker,
    /// The received rate now, for the status line, sampled with the distinct rate.
    received_rates: RateTracker,
    /// The handler's own figures, if it has any (the serve sink's consumers), read at each
    /// scrape; set once by [`watch_handler`](Metrics::watch_handler).
    handler: OnceLock<Arc<dyn HandlerMetrics>>,
}

/// Figures a handler adds to `/metrics`, beside the pipeline's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandlerFigures {
    /// Counters: name (the page adds `_total`), help, value.
    pub counters: Vec<(&'static str, &'static str, u64)>,
    /// Gauges: name, help, value.
    pub gauges: Vec<(&'static str, &'static str, f64)>,
}

/// A handler whose own figures belong on `/metrics` (the serve sink: its consumers and their
/// answers), read at each scrape.
pub trait HandlerMetrics: Send + Sync + std::fmt::Debug {
    /// The figures now.
    fn figures(&self) -> HandlerFigures;
}

impl Default for Metrics {
    /// Counters whose rate peak covers [`DEFAULT_WINDOW`](crate::sizing::DEFAULT_WINDOW).
    fn default() -> Self {
        Metrics::with_window(sizing::DEFAULT_WINDOW)
    }
}

impl Metrics {
    /// Counters whose rate peak covers `window` (the window the table is sized for).
    pub fn with_window(window: Duration) -> Self {
        Metrics {
            started: Instant::now(),
            received: RwLock::new(Vec::new()),
            unique: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            in_flight_requeues: AtomicU64::new(0),
            in_flight_finished: AtomicU64::new(0),
            copies_held: AtomicU64::new(0),
            deferred_copies: AtomicU64::new(0),
            keyless: AtomicU64::new(0),
            handler_successes: AtomicU64::new(0),
            handler_failures: AtomicU64::new(0),
            handler_requeues: AtomicU64::new(0),
            handler_duration: Histogram::default(),
            erased: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            dead_letter_failures: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            store_error_requeues: AtomicU64::new(0),
            store_error_processed: AtomicU64::new(0),
            store_latency: Histogram::default(),
            answer_failures: AtomicU64::new(0),
            touches: AtomicU64::new(0),
            renew_failures: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            nsqd_connections: AtomicU64::new(0),
            store_failing: AtomicBool::new(false),
            table_resizes: AtomicU64::new(0),
            rates: RateTracker::new(window),
            received_rates: RateTracker::new(window),
            handler: OnceLock::new(),
        }
    }

    /// Shows `handler`'s own figures on `/metrics` from now on; a second call changes nothing
    /// (one pipeline, one handler).
    pub fn watch_handler(&self, handler: Arc<dyn HandlerMetrics>) {
        let _ = self.handler.set(handler);
    }

    /// The handler's own figures now, if it has any.
    pub fn handler_figures(&self) -> Option<HandlerFigures> {
        self.handler.get().map(|handler| handler.figures())
    }
}

/// Adds one to a counter.
#[inline]
pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
#[inline]
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    if n > 0 {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Reads a counter.
#[inline]
pub fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What the renderer needs to know about the table, besides the counters.
#[derive(Debug, Clone, Copy)]
pub struct TableView {
    /// The table's shape, if the store keeps one.
    pub geometry: Option<Geometry>,
    /// Fraction of slots in use, if the store can tell.
    pub occupancy: Option<f64>,
    /// For a table of generations, in-process or shared: where a resize stands (`None` with
    /// one generation). `None` without a table.
    pub resizing: Option<Option<crate::Resizing>>,
    /// The window the table was sized for.
    pub window: Duration,
    /// What the near-table in front of Memcached answered, if there is one.
    pub near: Option<crate::dedup::near::NearStats>,
    /// The catch probability the table should keep (`store.probability`, else the
    /// default target).
    pub target: f64,
    /// Servers of a shared store ejected and taken back so far, with several servers.
    pub ejections: Option<(u64, u64)>,
    /// For a Redis Cluster: redirections followed, and operations tried again after a node
    /// failed or the cluster was failing over.
    pub cluster_retries: Option<(u64, u64)>,
}

/// A table too small for the messages of its last window: what it catches and what would do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TooSmall {
    /// The catch probability of a copy one window late, after the last window's distinct
    /// messages.
    pub probability: f64,
    /// The last window's distinct messages a second (its count over the whole window).
    pub rate: f64,
    /// A table that would meet the target for that many messages (same ways).
    pub suggested: Geometry,
}

impl Metrics {
    /// Records a store operation's latency and whether it succeeded.
    pub fn store_answered(&self, latency: std::time::Duration, ok: bool) {
        self.store_latency.observe(latency);
        // Written only when it changes: every message's task passes here, on every core, and
        // a store to a shared line would move it between the cores each time.
        if self.store_failing.load(Ordering::Relaxed) == ok {
            self.store_failing.store(!ok, Ordering::Relaxed);
        }
    }

    /// `Ok` when the service is ready: at least one nsqd connected and subscribed, and the
    /// store's last operation (if any) succeeded; otherwise why not.
    ///
    /// # Errors
    ///
    /// The reason it is not ready, for the body of a 503.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if get(&self.nsqd_connections) == 0 {
            return Err("not ready: no nsqd is connected and subscribed\n");
        }
        if self.store_failing.load(Ordering::Relaxed) {
            return Err("not ready: the store's last operation failed (see store_errors_total)\n");
        }
        Ok(())
    }

    /// Counts a message received from `source`.
    pub fn received_from(&self, source: &str) {
        self.received_many(source, 1);
    }

    /// Counts `count` messages received from `source`.
    pub fn received_many(&self, source: &str, count: usize) {
        {
            let sources = self.received.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, n)) = sources.iter().find(|(s, _)| s == source) {
                add(n, count);
                return;
            }
        }
        let mut sources = self.received.write().unwrap_or_else(|e| e.into_inner());
        match sources.iter().find(|(s, _)| s == source) {
            Some((_, n)) => add(n, count),
            None => sources.push((source.to_owned(), AtomicU64::new(count as u64))),
        }
    }

    /// Messages received, per source, sorted by source.
    pub fn received(&self) -> Vec<(String, u64)> {
        let sources = self.received.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(String, u64)> = sources.iter().map(|(s, n)| (s.clone(), get(n))).collect();
        v.sort();
        v
    }

    /// Messages received from all sources.
    pub fn received_total(&self) -> u64 {
        self.received().iter().map(|(_, n)| n).sum()
    }

    /// Time since the pipeline started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Distinct messages (unique plus keyless) so far.
    pub fn distinct(&self) -> u64 {
        get(&self.unique) + get(&self.keyless)
    }

    /// Records the distinct count now, for the recent rate; the sidecar calls it every second.
    pub fn sample_rate(&self) {
        self.sample_rates_at(Instant::now());
    }

    fn sample_rates_at(&self, now: Instant) {
        self.rates.sample(now, self.distinct());
        self.received_rates.sample(now, self.received_total());
    }

    /// Messages received per second over the last `rate::RECENT_SPAN` (since the start until
    /// two samples were taken): the status line's `rate`.
    #[cfg(any(feature = "sidecar", test))]
    pub(crate) fn received_rate(&self) -> f64 {
        self.recent_or_average(&self.received_rates, self.received_total())
    }

    /// `rates`' recent rate, or before it has two samples, `count` over the time since the
    /// start.
    fn recent_or_average(&self, rates: &RateTracker, count: u64) -> f64 {
        rates.recent().unwrap_or_else(|| {
            let secs = self.uptime().as_secs_f64().max(1e-3);
            count as f64 / secs
        })
    }

    /// Distinct messages per second: the fleet's when consumers share a store and it is known
    /// (see `rate`), else this process's [`own_distinct_rate`](Metrics::own_distinct_rate).
    pub fn distinct_rate(&self) -> f64 {
        self.rates
            .fleet()
            .unwrap_or_else(|| self.own_distinct_rate())
    }

    /// This process's distinct messages per second over the last `rate::RECENT_SPAN` (since
    /// the start until two samples were taken).
    pub fn own_distinct_rate(&self) -> f64 {
        self.recent_or_average(&self.rates, self.distinct())
    }

    /// The highest [`distinct_rate`](Metrics::distinct_rate) of the last window.
    pub fn distinct_rate_peak(&self) -> f64 {
        self.rates.peak().unwrap_or_else(|| self.distinct_rate())
    }

    /// The probability that a copy arriving one whole `window` late is still caught, if the
    /// recent distinct rate held for the window. `None` without a table.
    pub fn catch_probability(&self, table: &TableView) -> Option<f64> {
        let geometry = table.geometry?;
        Some(sizing::catch_probability(
            geometry,
            self.distinct_rate() * table.window.as_secs_f64(),
        ))
    }

    /// The table's shape that meets `table.target` for the distinct messages of the last
    /// window (since the start, early on), as the "too small" warning sizes it; `None` without
    /// a table or traffic.
    pub fn suggested_geometry(&self, table: &TableView) -> Option<Geometry> {
        suggested_for(table, self.rates.window_count()?)
    }

    /// `Some` when the distinct messages of the last window (of the time since the start,
    /// early on) leave a copy one window late caught with a probability below `table.target`.
    /// A burst counts for the messages it brought: a minute at ten times the rate the table
    /// was sized for is a sixth of an hour's messages, not ten hours' worth.
    pub fn too_small(&self, table: &TableView) -> Option<TooSmall> {
        let geometry = table.geometry?;
        let count = self.rates.window_count()?;
        let probability = sizing::catch_probability(geometry, count);
        if probability >= table.target {
            return None;
        }
        Some(TooSmall {
            probability,
            rate: count / table.window.as_secs_f64(),
            suggested: suggested_for(table, count)?,
        })
    }
}

/// The shape of `table`'s ways that meets its target for `count` distinct messages a window;
/// `None` without a table or messages.
fn suggested_for(table: &TableView, count: f64) -> Option<Geometry> {
    let geometry = table.geometry?;
    if count <= 0.0 {
        return None;
    }
    sizing::slots_for(table.target, geometry.ways(), count).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status line's rate is the last minute's, not the average since the start: a
    /// sidecar idle for ten minutes after a burst reports 0.
    #[test]
    fn the_received_rate_is_the_last_minutes() {
        let metrics = Metrics::default();
        let start = Instant::now();
        metrics.sample_rates_at(start);
        metrics.received_many("nsqd", 6_000);
        metrics.sample_rates_at(start + Duration::from_secs(60));
        assert_eq!(metrics.received_rate(), 100.0);
        for minute in 2..=11 {
            metrics.sample_rates_at(start + Duration::from_secs(60 * minute));
        }
        assert_eq!(metrics.received_rate(), 0.0);
    }
}
