//! The `/metrics` page: the sidecar's counters, the table's gauges, the build and the process's
//! own figures, in the OpenMetrics text format that Prometheus scrapes.
//!
//! `prometheus-client` writes the format (names, escaping, the `_total` of counters, `# EOF`).
//! The counters stay our own atomics, updated on the hot path without locks; each scrape copies
//! them into a `Scrape` that the registry's encoder walks.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{get, process, Histogram, Metrics, TableView};

/// The `Content-Type` of the page.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The version that `nsq_dedupe_build_info` reports.
const VERSION: &str = env!("CARGO_PKG_VERSION");

impl Metrics {
    /// The `/metrics` page.
    pub fn render(&self, table: &TableView) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape::of(self, table)));
        let mut page = String::with_capacity(8192);
        prometheus_client::encoding::text::encode(&mut page, &registry)
            .expect("writing to a String does not fail");
        page
    }
}

/// One histogram's copy: name, help, buckets (not cumulative, the last unbounded), sum, count.
type HistogramCopy = (&'static str, &'static str, Vec<(f64, u64)>, f64, u64);

/// What one scrape shows, copied from the live counters.
#[derive(Debug)]
struct Scrape {
    received: Vec<(String, u64)>,
    counters: Vec<CounterCopy>,
    histograms: Vec<HistogramCopy>,
    gauges: Vec<GaugeCopy>,
    process: Option<process::Figures>,
}

impl Scrape {
    fn of(m: &Metrics, table: &TableView) -> Scrape {
        let mut counters = sidecar_counters(m);
        store_counters(table, &mut counters);
        if table.resizing.is_some() {
            counters.push((
                "nsq_dedupe_table_resizes",
                "Times the in-process table sized itself: a new generation for the rate it meets.",
                get(&m.table_resizes),
            ));
        }
        let mut gauges = rate_gauges(m);
        table_gauges(m, table, &mut gauges);
        if let Some(own) = m.handler_figures() {
            counters.extend(own.counters);
            gauges.extend(own.gauges);
        }
        Scrape {
            // The encoder writes label values as they are; the format wants `\`, `"` and line
            // feeds escaped.
            received: m
                .received()
                .into_iter()
                .map(|(source, n)| (escape_label(&source), n))
                .collect(),
            counters,
            histograms: histograms(m),
            gauges,
            process: process::read(),
        }
    }
}

/// One counter's copy: name, help, value.
type CounterCopy = (&'static str, &'static str, u64);

/// One gauge's copy: name, help, value.
type GaugeCopy = (&'static str, &'static str, f64);

/// The sidecar's own counters: what became of the messages, the handler and the store calls.
fn sidecar_counters(m: &Metrics) -> Vec<CounterCopy> {
    let mut counters = message_counters(m);
    counters.extend(handler_and_store_counters(m));
    counters
}

/// What became of the messages: each received message ends in one of these.
fn message_counters(m: &Metrics) -> Vec<CounterCopy> {
    vec![
        (
            "nsq_dedupe_unique",
            "Messages claimed as new and handed to the handler; one that comes back after a failure or a REQ counts again.",
            get(&m.unique),
        ),
        (
            "nsq_dedupe_duplicates",
            "Copies finished without reaching the handler.",
            get(&m.duplicates),
        ),
        (
            "nsq_dedupe_in_flight_requeues",
            "Copies found in flight and requeued.",
            get(&m.in_flight_requeues),
        ),
        (
            "nsq_dedupe_in_flight_finished",
            "Copies found in flight and finished.",
            get(&m.in_flight_finished),
        ),
        (
            "nsq_dedupe_copies_held",
            "Copies found in flight here, held until their original settled.",
            get(&m.copies_held),
        ),
        (
            "nsq_dedupe_deferred_copies",
            "Copies requeued until the delay their receiver asked for ends.",
            get(&m.deferred_copies),
        ),
        (
            "nsq_dedupe_keyless",
            "Bodies without a key, passed on as unique.",
            get(&m.keyless),
        ),
    ]
}

/// What the handler, the dead-letter and the store did with them.
fn handler_and_store_counters(m: &Metrics) -> Vec<CounterCopy> {
    vec![
        (
            "nsq_dedupe_handler_successes",
            "Handler calls that succeeded.",
            get(&m.handler_successes),
        ),
        (
            "nsq_dedupe_handler_failures",
            "Handler calls that failed.",
            get(&m.handler_failures),
        ),
        (
            "nsq_dedupe_handler_requeues",
            "Records requeued at the request of the handler's receiver.",
            get(&m.handler_requeues),
        ),
        (
            "nsq_dedupe_erased",
            "Claims erased after a handler failure.",
            get(&m.erased),
        ),
        (
            "nsq_dedupe_retries",
            "Messages requeued after a handler failure.",
            get(&m.retries),
        ),
        (
            "nsq_dedupe_dead_lettered",
            "Messages accepted by the dead-letter.",
            get(&m.dead_lettered),
        ),
        (
            "nsq_dedupe_dead_letter_failures",
            "Dead-letter writes that failed (message requeued).",
            get(&m.dead_letter_failures),
        ),
        (
            "nsq_dedupe_store_errors",
            "Store operations that failed.",
            get(&m.store_errors),
        ),
        (
            "nsq_dedupe_store_error_requeues",
            "Messages requeued because the store failed.",
            get(&m.store_error_requeues),
        ),
        (
            "nsq_dedupe_store_error_processed",
            "Messages delivered without de-duplication because the store failed.",
            get(&m.store_error_processed),
        ),
        (
            "nsq_dedupe_answer_failures",
            "FIN/REQ/TOUCH that nsqd could no longer take.",
            get(&m.answer_failures),
        ),
        (
            "nsq_dedupe_touches",
            "TOUCHes sent while a handler ran.",
            get(&m.touches),
        ),
        (
            "nsq_dedupe_renew_failures",
            "Lease renewals that failed.",
            get(&m.renew_failures),
        ),
        (
            "nsq_dedupe_abandoned",
            "Handler calls given up at shutdown (claim erased, message requeued).",
            get(&m.abandoned),
        ),
    ]
}

/// The counters a store has only in some kinds: near-table hits, ejections, cluster retries.
fn store_counters(table: &TableView, counters: &mut Vec<CounterCopy>) {
    if let Some(near) = table.near {
        counters.push((
            "nsq_dedupe_near_table_hits",
            "Claims answered Duplicate by the near-table, without a round trip to the shared store.",
            near.hits,
        ));
        counters.push((
            "nsq_dedupe_near_table_misses",
            "Claims the near-table did not hold, which went on to the shared store.",
            near.misses,
        ));
    }
    if let Some((ejections, returns)) = table.ejections {
        counters.push((
            "nsq_dedupe_store_ejections",
            "Shared-store servers ejected after failing for store.eject_after.",
            ejections,
        ));
        counters.push((
            "nsq_dedupe_store_returns",
            "Ejected shared-store servers that answered again and were taken back.",
            returns,
        ));
    }
    if let Some((redirects, retries)) = table.cluster_retries {
        counters.push((
            "nsq_dedupe_store_redirects",
            "MOVED and ASK answers of the Redis Cluster followed: slots that moved.",
            redirects,
        ));
        counters.push((
            "nsq_dedupe_store_retries",
            "Redis Cluster operations tried again after a node failed or a failover.",
            retries,
        ));
    }
}

/// The handler's durations and the store's latencies.
fn histograms(m: &Metrics) -> Vec<HistogramCopy> {
    let copy = |name, help, histogram: &Histogram| {
        let (buckets, sum) = histogram.buckets();
        (name, help, buckets, sum, histogram.count())
    };
    vec![
        copy(
            "nsq_dedupe_handler_duration_seconds",
            "Handler call durations.",
            &m.handler_duration,
        ),
        copy(
            "nsq_dedupe_store_latency_seconds",
            "Store call latencies.",
            &m.store_latency,
        ),
    ]
}

/// The distinct rates, the nsqd connections and readiness.
fn rate_gauges(m: &Metrics) -> Vec<GaugeCopy> {
    vec![
        (
            "nsq_dedupe_distinct_rate",
            "Distinct messages per second over the last minute: the fleet's, with a shared store.",
            m.distinct_rate(),
        ),
        (
            "nsq_dedupe_own_distinct_rate",
            "This consumer's distinct messages per second over the last minute.",
            m.own_distinct_rate(),
        ),
        (
            "nsq_dedupe_distinct_rate_peak",
            "The highest distinct rate over a minute in the last window.",
            m.distinct_rate_peak(),
        ),
        (
            "nsq_dedupe_nsqd_connections",
            "nsqd connections up and subscribed.",
            get(&m.nsqd_connections) as f64,
        ),
        (
            "nsq_dedupe_ready",
            "1 when /ready answers 200: an nsqd connected and the store answering.",
            if m.readiness().is_ok() { 1.0 } else { 0.0 },
        ),
    ]
}

/// The table's geometry and occupancy, the catch probability and the suggested size, when the
/// store knows them.
fn table_gauges(m: &Metrics, table: &TableView, gauges: &mut Vec<GaugeCopy>) {
    if let Some(geometry) = table.geometry {
        gauges.push((
            "nsq_dedupe_table_slots",
            "Slots of the table, as configured.",
            geometry.slots() as f64,
        ));
        gauges.push((
            "nsq_dedupe_table_ways",
            "Slots per set.",
            f64::from(geometry.ways()),
        ));
    }
    if let Some(occupancy) = table.occupancy {
        gauges.push((
            "nsq_dedupe_table_occupancy",
            "Fraction of slots holding an entry.",
            occupancy,
        ));
    }
    if let Some(resizing) = table.resizing {
        gauges.push((
            "nsq_dedupe_table_generations",
            "Generations of the table held: more than 1 while a resize keeps the previous ones.",
            resizing.map_or(1.0, |r| r.generations as f64),
        ));
    }
    if let Some(resizing) = table.resizing.flatten() {
        gauges.push((
            "nsq_dedupe_table_previous_slots",
            "Slots of the previous generations a resize keeps, read-only.",
            resizing.previous_slots as f64,
        ));
        gauges.push((
            "nsq_dedupe_table_previous_inserts_left",
            "New entries the table takes (a shared table: this consumer makes) before the previous generations retire.",
            resizing.inserts_left as f64,
        ));
        if let Some(seconds) = resizing.seconds_left {
            gauges.push((
                "nsq_dedupe_table_previous_seconds_left",
                "Seconds before the previous generations retire (max_age).",
                seconds as f64,
            ));
        }
    }
    if let Some(p) = m.catch_probability(table) {
        gauges.push(("nsq_dedupe_catch_probability", "Probability that a copy one whole window late is caught, at the observed distinct rate.", p));
        gauges.push((
            "nsq_dedupe_window_seconds",
            "The window the catch probability refers to.",
            table.window.as_secs_f64(),
        ));
        gauges.push((
            "nsq_dedupe_table_too_small",
            "1 when the last window's distinct messages leave a copy one window late caught below the target (store.probability, else 0.99).",
            if m.too_small(table).is_some() {
                1.0
            } else {
                0.0
            },
        ));
    }
    if let Some(suggested) = m.suggested_geometry(table) {
        gauges.push((
            "nsq_dedupe_table_suggested_slots",
            "Slots (--buckets) that would meet the target catch probability for the last window's distinct messages.",
            suggested.slots() as f64,
        ));
    }
}

/// `value` as the text format's label values want it.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes one unlabelled sample of `kind` under a new descriptor.
fn single(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    write: impl FnOnce(&mut MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    write(&mut encoder.encode_descriptor(name, help, None, kind)?)
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    single(encoder, name, help, MetricType::Counter, |m| {
        m.encode_counter::<NoLabelSet, _, u64>(&value, None)
    })
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    single(encoder, name, help, MetricType::Gauge, |m| {
        m.encode_gauge(&value)
    })
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let e = &mut encoder;
        single(
            e,
            "nsq_dedupe_build",
            "The running version.",
            MetricType::Info,
            |m| m.encode_info(&[("version", VERSION)]),
        )?;
        let mut received = e.encode_descriptor(
            "nsq_dedupe_received",
            "Messages received, per source nsqd.",
            None,
            MetricType::Counter,
        )?;
        for (source, n) in &self.received {
            received
                .encode_family(&[("source", source.as_str())])?
                .encode_counter::<NoLabelSet, _, u64>(n, None)?;
        }
        for &(name, help, value) in &self.counters {
            single(e, name, help, MetricType::Counter, |m| {
                m.encode_counter::<NoLabelSet, _, u64>(&value, None)
            })?;
        }
        for (name, help, buckets, sum, count) in &self.histograms {
            single(e, name, help, MetricType::Histogram, |m| {
                m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)
            })?;
        }
        for &(name, help, value) in &self.gauges {
            gauge(e, name, help, value)?;
        }
        if let Some(p) = &self.process {
            counter(
                e,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                p.cpu_seconds,
            )?;
            gauge(
                e,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                p.resident_bytes as f64,
            )?;
            gauge(
                e,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                p.virtual_bytes as f64,
            )?;
            gauge(
                e,
                "process_threads",
                "Number of OS threads in the process.",
                p.threads as f64,
            )?;
            gauge(
                e,
                "process_open_fds",
                "Number of open file descriptors.",
                p.open_fds as f64,
            )?;
            if let Some(max) = p.max_fds {
                gauge(
                    e,
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    max as f64,
                )?;
            }
            gauge(
                e,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                p.start_time_seconds,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dedup::Geometry;
    use crate::metrics::inc;

    fn page(m: &Metrics, near: bool) -> String {
        page_resizing(m, near, Some(None))
    }

    fn page_resizing(m: &Metrics, near: bool, resizing: Option<Option<crate::Resizing>>) -> String {
        let view = TableView {
            geometry: Some(Geometry::new(1024, 8).unwrap()),
            occupancy: Some(0.5),
            resizing,
            near: near.then_some(crate::dedup::near::NearStats { hits: 4, misses: 6 }),
            window: Duration::from_secs(60),
            target: 0.99,
            ejections: None,
            cluster_retries: None,
        };
        m.render(&view)
    }

    #[test]
    fn a_table_too_small_for_its_window_says_so_and_what_would_do() {
        let m = Metrics::default();
        let start = std::time::Instant::now();
        // 1,000 distinct a second for 10 s: 10,000 in the 60 s window, far more than 1,024
        // slots hold; the size suggested holds those 10,000.
        m.rates.sample(start, 0);
        m.rates.sample(start + Duration::from_secs(10), 10_000);
        let text = page(&m, false);
        assert!(
            text.contains("\nnsq_dedupe_table_too_small 1.0\n"),
            "{text}"
        );
        assert!(
            text.contains("\nnsq_dedupe_distinct_rate 1000.0\n"),
            "{text}"
        );
        let slots: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("nsq_dedupe_table_suggested_slots "))
            .and_then(|v| v.trim_end_matches(".0").parse().ok())
            .unwrap_or_else(|| panic!("no suggested slots in\n{text}"));
        let suggested = Geometry::new(slots, 8).unwrap();
        assert!(crate::sizing::catch_probability(suggested, 10_000.0) >= 0.99);
        let smaller = Geometry::new(slots - 8 * 64, 8).unwrap();
        assert!(crate::sizing::catch_probability(smaller, 10_000.0) < 0.99);
        // At 1 a second the same table is large enough.
        let quiet = Metrics::default();
        quiet.rates.sample(start, 0);
        quiet.rates.sample(start + Duration::from_secs(10), 10);
        assert!(page(&quiet, false).contains("\nnsq_dedupe_table_too_small 0.0\n"));
    }

    #[test]
    fn a_resize_shows_its_generations_and_what_is_left_of_the_previous_one() {
        let m = Metrics::default();
        let resizing = crate::Resizing {
            generations: 2,
            previous_slots: 262_144,
            inserts_left: 1000,
            seconds_left: Some(30),
        };
        let text = page_resizing(&m, false, Some(Some(resizing)));
        for line in [
            "nsq_dedupe_table_slots 1024.0\n",
            "nsq_dedupe_table_generations 2.0\n",
            "nsq_dedupe_table_previous_slots 262144.0\n",
            "nsq_dedupe_table_previous_inserts_left 1000.0\n",
            "nsq_dedupe_table_previous_seconds_left 30.0\n",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        // A store without a table (`--store none`) has no generations to show.
        let none = page_resizing(&m, false, None);
        assert!(!none.contains("generations"), "{none}");
        assert!(!page(&m, false).contains("nsq_dedupe_table_previous"));
    }

    #[test]
    fn renders_counters_per_source_histograms_and_gauges() {
        let m = Metrics::default();
        m.received_from("127.0.0.1:4150");
        m.received_from("127.0.0.1:4150");
        m.received_from("127.0.0.1:4250");
        inc(&m.duplicates);
        m.handler_duration.observe(Duration::from_millis(3));
        m.handler_duration.observe(Duration::from_secs(60));
        let text = page(&m, false);
        for line in [
            "# TYPE nsq_dedupe_received counter\n",
            "nsq_dedupe_received_total{source=\"127.0.0.1:4150\"} 2\n",
            "nsq_dedupe_received_total{source=\"127.0.0.1:4250\"} 1\n",
            "nsq_dedupe_duplicates_total 1\n",
            "nsq_dedupe_unique_total 0\n",
            "nsq_dedupe_handler_duration_seconds_bucket{le=\"0.0025\"} 0\n",
            "nsq_dedupe_handler_duration_seconds_bucket{le=\"0.005\"} 1\n",
            "nsq_dedupe_handler_duration_seconds_bucket{le=\"10.0\"} 1\n",
            "nsq_dedupe_handler_duration_seconds_bucket{le=\"+Inf\"} 2\n",
            "nsq_dedupe_handler_duration_seconds_count 2\n",
            "nsq_dedupe_handler_duration_seconds_sum 60.003\n",
            "nsq_dedupe_table_slots 1024.0\n",
            "nsq_dedupe_table_occupancy 0.5\n",
            "nsq_dedupe_table_generations 1.0\n",
            "nsq_dedupe_nsqd_connections 0.0\n",
            "nsq_dedupe_ready 0.0\n",
            &format!("nsq_dedupe_build_info{{version=\"{VERSION}\"}} 1\n"),
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        assert!(text.contains("\nnsq_dedupe_catch_probability "));
        assert!(!text.contains("near_table"));
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(m.received_total(), 3);
    }

    #[test]
    fn near_table_counters_appear_with_a_near_table() {
        let text = page(&Metrics::default(), true);
        assert!(text.contains("nsq_dedupe_near_table_hits_total 4\n"));
        assert!(text.contains("nsq_dedupe_near_table_misses_total 6\n"));
    }

    #[test]
    fn a_source_with_quotes_is_escaped() {
        let m = Metrics::default();
        m.received_from("a\"b\\c");
        assert!(page(&m, false).contains(r#"nsq_dedupe_received_total{source="a\"b\\c"} 1"#));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn shows_the_process() {
        let text = page(&Metrics::default(), false);
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
            "process_threads ",
        ] {
            assert!(text.contains(&format!("\n{name}")), "no {name} in\n{text}");
        }
    }
}
