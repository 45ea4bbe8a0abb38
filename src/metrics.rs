//! Counters of the sidecar, rendered in Prometheus' text format.
//!
//! One [`Metrics`] per pipeline, shared by its tasks behind an `Arc`. Every outcome of a message
//! has its own counter (one event per outcome, as vector's `internal_events`), so the counters
//! add up: `received = duplicates + in_flight_requeues + in_flight_finished + unique + keyless
//! + store_errors_at_claim` (a keyless message is both `keyless` and handled as unique).
//!
//! All counters are `AtomicU64` with `Relaxed` ordering: they are statistics that no other
//! memory depends on, and readers only need eventually-consistent totals.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::dedup::Geometry;
use crate::sizing;

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
        let secs = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// The sidecar's counters. See the module docs for how they add up.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    /// Messages received, per source nsqd address. A read lock and a linear scan per message:
    /// there are a handful of sources, and the write lock is only taken for a new one.
    received: RwLock<Vec<(String, AtomicU64)>>,
    /// Digests claimed as new and handed to the handler.
    pub unique: AtomicU64,
    /// Copies recognised and finished without reaching the handler.
    pub duplicates: AtomicU64,
    /// Copies found in flight and requeued to be decided later.
    pub in_flight_requeues: AtomicU64,
    /// Copies found in flight and finished (`on_in_flight = "finish"`).
    pub in_flight_finished: AtomicU64,
    /// Bodies without a key, passed on as unique.
    pub keyless: AtomicU64,
    /// Handler calls that succeeded.
    pub handler_successes: AtomicU64,
    /// Handler calls that failed (retryable or not).
    pub handler_failures: AtomicU64,
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
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            received: RwLock::new(Vec::new()),
            unique: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            in_flight_requeues: AtomicU64::new(0),
            in_flight_finished: AtomicU64::new(0),
            keyless: AtomicU64::new(0),
            handler_successes: AtomicU64::new(0),
            handler_failures: AtomicU64::new(0),
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
        }
    }
}

/// Adds one to a counter.
#[inline]
pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
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
    /// The window the table was sized for.
    pub window: Duration,
    /// What the near-table in front of Memcached answered, if there is one.
    pub near: Option<crate::dedup::near::NearStats>,
}

impl Metrics {
    /// Records a store operation's latency and whether it succeeded.
    pub fn store_answered(&self, latency: std::time::Duration, ok: bool) {
        self.store_latency.observe(latency);
        self.store_failing.store(!ok, Ordering::Relaxed);
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
        {
            let sources = self.received.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, n)) = sources.iter().find(|(s, _)| s == source) {
                inc(n);
                return;
            }
        }
        let mut sources = self.received.write().unwrap_or_else(|e| e.into_inner());
        match sources.iter().find(|(s, _)| s == source) {
            Some((_, n)) => inc(n),
            None => sources.push((source.to_owned(), AtomicU64::new(1))),
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

    /// Distinct messages per second since the start (unique plus keyless).
    pub fn distinct_rate(&self) -> f64 {
        let secs = self.uptime().as_secs_f64().max(1e-3);
        (get(&self.unique) + get(&self.keyless)) as f64 / secs
    }

    /// The probability that a copy arriving one whole `window` late is still caught, at the
    /// distinct rate observed so far. `None` without a table.
    pub fn catch_probability(&self, table: &TableView) -> Option<f64> {
        let geometry = table.geometry?;
        Some(sizing::catch_probability(
            geometry,
            self.distinct_rate() * table.window.as_secs_f64(),
        ))
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self, table: &TableView) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP nsq_dedupe_received_total Messages received, per source nsqd."
        );
        let _ = writeln!(out, "# TYPE nsq_dedupe_received_total counter");
        for (source, n) in self.received() {
            let source = source.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "nsq_dedupe_received_total{{source=\"{source}\"}} {n}");
        }
        let counters: [(&str, &str, &AtomicU64); 18] = [
            (
                "unique_total",
                "Messages claimed as new and handed to the handler.",
                &self.unique,
            ),
            (
                "duplicates_total",
                "Copies finished without reaching the handler.",
                &self.duplicates,
            ),
            (
                "in_flight_requeues_total",
                "Copies found in flight and requeued.",
                &self.in_flight_requeues,
            ),
            (
                "in_flight_finished_total",
                "Copies found in flight and finished.",
                &self.in_flight_finished,
            ),
            (
                "keyless_total",
                "Bodies without a key, passed on as unique.",
                &self.keyless,
            ),
            (
                "handler_successes_total",
                "Handler calls that succeeded.",
                &self.handler_successes,
            ),
            (
                "handler_failures_total",
                "Handler calls that failed.",
                &self.handler_failures,
            ),
            (
                "erased_total",
                "Claims erased after a handler failure.",
                &self.erased,
            ),
            (
                "retries_total",
                "Messages requeued after a handler failure.",
                &self.retries,
            ),
            (
                "dead_lettered_total",
                "Messages accepted by the dead-letter.",
                &self.dead_lettered,
            ),
            (
                "dead_letter_failures_total",
                "Dead-letter writes that failed (message requeued).",
                &self.dead_letter_failures,
            ),
            (
                "store_errors_total",
                "Store operations that failed.",
                &self.store_errors,
            ),
            (
                "store_error_requeues_total",
                "Messages requeued because the store failed.",
                &self.store_error_requeues,
            ),
            (
                "store_error_processed_total",
                "Messages delivered without de-duplication because the store failed.",
                &self.store_error_processed,
            ),
            (
                "answer_failures_total",
                "FIN/REQ/TOUCH that nsqd could no longer take.",
                &self.answer_failures,
            ),
            (
                "touches_total",
                "TOUCHes sent while a handler ran.",
                &self.touches,
            ),
            (
                "renew_failures_total",
                "Lease renewals that failed.",
                &self.renew_failures,
            ),
            (
                "abandoned_total",
                "Handler calls given up at shutdown (claim erased, message requeued).",
                &self.abandoned,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP nsq_dedupe_{name} {help}");
            let _ = writeln!(out, "# TYPE nsq_dedupe_{name} counter");
            let _ = writeln!(out, "nsq_dedupe_{name} {}", get(value));
        }
        self.handler_duration.render(
            &mut out,
            "nsq_dedupe_handler_duration_seconds",
            "Handler call durations.",
            "",
        );
        self.store_latency.render(
            &mut out,
            "nsq_dedupe_store_latency_seconds",
            "Store call latencies.",
            "",
        );
        let mut gauge = |name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP nsq_dedupe_{name} {help}");
            let _ = writeln!(out, "# TYPE nsq_dedupe_{name} gauge");
            let _ = writeln!(out, "nsq_dedupe_{name} {value}");
        };
        gauge(
            "distinct_rate",
            "Distinct messages per second since the start.",
            self.distinct_rate(),
        );
        gauge(
            "nsqd_connections",
            "nsqd connections up and subscribed.",
            get(&self.nsqd_connections) as f64,
        );
        gauge(
            "ready",
            "1 when /ready answers 200: an nsqd connected and the store answering.",
            if self.readiness().is_ok() { 1.0 } else { 0.0 },
        );
        if let Some(geometry) = table.geometry {
            gauge(
                "table_slots",
                "Slots of the table.",
                geometry.slots() as f64,
            );
            gauge("table_ways", "Slots per set.", f64::from(geometry.ways()));
        }
        if let Some(occupancy) = table.occupancy {
            gauge(
                "table_occupancy",
                "Fraction of slots holding an entry.",
                occupancy,
            );
        }
        if let Some(p) = self.catch_probability(table) {
            gauge(
                "catch_probability",
                "Probability that a copy one whole window late is caught, at the observed distinct rate.",
                p,
            );
            gauge(
                "window_seconds",
                "The window the catch probability refers to.",
                table.window.as_secs_f64(),
            );
        }
        if let Some(near) = table.near {
            for (name, help, value) in [
                (
                    "near_table_hits_total",
                    "Claims answered Duplicate by the near-table, without a Memcached round trip.",
                    near.hits,
                ),
                (
                    "near_table_misses_total",
                    "Claims the near-table did not hold, which went on to Memcached.",
                    near.misses,
                ),
            ] {
                let _ = writeln!(out, "# HELP nsq_dedupe_{name} {help}");
                let _ = writeln!(out, "# TYPE nsq_dedupe_{name} counter");
                let _ = writeln!(out, "nsq_dedupe_{name} {value}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_per_source_and_histograms() {
        let m = Metrics::default();
        m.received_from("127.0.0.1:4150");
        m.received_from("127.0.0.1:4150");
        m.received_from("127.0.0.1:4250");
        inc(&m.duplicates);
        m.handler_duration.observe(Duration::from_millis(3));
        let view = TableView {
            geometry: Some(Geometry::new(1024, 8).unwrap()),
            occupancy: Some(0.5),
            near: None,
            window: Duration::from_secs(60),
        };
        let text = m.render(&view);
        assert!(text.contains("nsq_dedupe_received_total{source=\"127.0.0.1:4150\"} 2\n"));
        assert!(text.contains("nsq_dedupe_received_total{source=\"127.0.0.1:4250\"} 1\n"));
        assert!(text.contains("nsq_dedupe_duplicates_total 1\n"));
        assert!(text.contains("nsq_dedupe_handler_duration_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("nsq_dedupe_handler_duration_seconds_count 1\n"));
        assert!(text.contains("nsq_dedupe_table_occupancy 0.5\n"));
        assert!(text.contains("nsq_dedupe_catch_probability "));
        assert_eq!(m.received_total(), 3);
    }
}
