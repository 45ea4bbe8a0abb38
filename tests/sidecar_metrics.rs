//! The sidecar's metrics server: the URL it reports, `/ready` (no nsqd connected, a shared
//! store that has not answered since start), the OpenMetrics scrape, and the Grafana dashboard
//! querying only metrics the scrape holds.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use nsq_dedupe::config::StoreKind;
use nsq_dedupe::Sidecar;

use crate::sidecar::{get_page, metric, payload, raw_config, scrape, Recorder, Running, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::util::wait_until_or;

/// The URL a program prints for its metrics page (examples/custom_handler.rs does): the bound
/// address, not an `Option` printed as `http://Some(127.0.0.1:42699)/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_url_is_the_bound_address() {
    let sidecar = Sidecar::with_handler(
        raw_config(&["127.0.0.1:1".parse().unwrap()])
            .validate()
            .unwrap(),
        Recorder::default(),
    )
    .await
    .unwrap();
    let addr = sidecar.metrics_address().unwrap();
    let url = sidecar.metrics_url().unwrap();
    assert_eq!(url, format!("http://127.0.0.1:{}/metrics", addr.port()));
    let uri: hyper::Uri = url.parse().unwrap();
    assert_eq!(
        (uri.host(), uri.port_u16(), uri.path()),
        (Some("127.0.0.1"), Some(addr.port()), "/metrics")
    );
    let mut raw = raw_config(&["127.0.0.1:1".parse().unwrap()]);
    raw.metrics.address = Some("off".to_owned());
    let without = Sidecar::with_handler(raw.validate().unwrap(), Recorder::default())
        .await
        .unwrap();
    assert_eq!(without.metrics_url(), None);
}

/// A shared store that does not answer at start leaves the service unready from the start,
/// before any message has tried it; once it answers a claim, the service is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_shared_store_has_not_answered_since_start() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut memcached = MemcachedServer::start();
    memcached.stop();
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![memcached.addr()]);
    raw.store.buckets = Some(1 << 12);
    let running = Running::start(raw.validate().unwrap(), Recorder::default()).await;
    let addr = running.metrics_addr.unwrap();
    wait_until_or(
        "an nsqd connected",
        Duration::from_secs(10),
        || scrape(addr).contains("nsq_dedupe_nsqd_connections 1"),
        || scrape(addr),
    )
    .await;
    assert_eq!(
        get_page(addr, "/ready"),
        (
            503,
            "not ready: the store's last operation failed (see store_errors_total)\n".to_owned()
        ),
        "no message has reached the store yet"
    );
    memcached.restart();
    broker.publish(TOPIC, payload(1));
    wait_until_or(
        "ready once the store answered a claim",
        Duration::from_secs(15),
        || get_page(addr, "/ready") == (200, "ready\n".to_owned()),
        || format!("{:?}", get_page(addr, "/ready")),
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_while_an_nsqd_is_connected() {
    // Nothing listens at the configured nsqd yet: not ready, and the body says why.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let running = Running::start(
        raw_config(&[dead_addr]).validate().unwrap(),
        Recorder::default(),
    )
    .await;
    let addr = running.metrics_addr.unwrap();
    assert_eq!(
        get_page(addr, "/ready"),
        (
            503,
            "not ready: no nsqd is connected and subscribed\n".to_owned()
        )
    );
    running.stop().await;

    let broker = Broker::start(BrokerConfig::default()).await;
    let running = Running::start(
        raw_config(&[broker.tcp_addr()]).validate().unwrap(),
        Recorder::default(),
    )
    .await;
    let addr = running.metrics_addr.unwrap();
    wait_until_or(
        "ready once connected",
        Duration::from_secs(10),
        || get_page(addr, "/ready") == (200, "ready\n".to_owned()),
        || format!("{:?}", get_page(addr, "/ready")),
    )
    .await;
    let page = scrape(addr);
    assert_eq!(metric(&page, "nsq_dedupe_ready"), Some(1.0));
    assert_eq!(metric(&page, "nsq_dedupe_nsqd_connections"), Some(1.0));
    // The scrape Prometheus reads: OpenMetrics, with the build and the process's own figures.
    assert!(
        page.contains("application/openmetrics-text; version=1.0.0"),
        "{page}"
    );
    let build = format!(
        "nsq_dedupe_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(page.contains(&build), "{page}");
    assert!(metric(&page, "process_resident_memory_bytes").is_some_and(|bytes| bytes > 1e6));
    assert!(metric(&page, "process_open_fds").is_some_and(|fds| fds >= 3.0));
    assert!(page.ends_with("# EOF\n"), "{page}");
    drop(broker);
    wait_until_or(
        "not ready once the nsqd went away",
        Duration::from_secs(10),
        || get_page(addr, "/ready").0 == 503,
        || format!("{:?}", get_page(addr, "/ready")),
    )
    .await;
    assert_eq!(metric(&scrape(addr), "nsq_dedupe_ready"), Some(0.0));
    running.stop().await;
}

/// The sample names a scrape holds, from its `# TYPE` lines: a counter's `_total`, a histogram's
/// `_bucket`, `_sum` and `_count`, an info's `_info`, a gauge's own name.
fn sample_names(page: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').expect("a TYPE line names its type");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_sidecar_exposes() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/grafana-dashboard.json"),
        )
        .unwrap(),
    )
    .expect("the dashboard is JSON");
    // Every query of the dashboard: panel targets' `expr`, variables' `query` and `definition`.
    fn queries(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "definition" | "query", serde_json::Value::String(q)) => {
                            out.push(q.clone())
                        }
                        _ => queries(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    queries(&dashboard, &mut exprs);
    let queried: HashSet<String> = exprs
        .iter()
        .flat_map(|q| q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|word| word.starts_with("nsq_dedupe_") || word.starts_with("process_"))
        .map(str::to_owned)
        .collect();
    // What the issue asks the dashboard to show.
    for wanted in [
        "nsq_dedupe_received_total",
        "nsq_dedupe_unique_total",
        "nsq_dedupe_duplicates_total",
        "nsq_dedupe_catch_probability",
        "nsq_dedupe_store_latency_seconds_bucket",
        "nsq_dedupe_handler_failures_total",
        "nsq_dedupe_ready",
    ] {
        assert!(
            queried.contains(wanted),
            "the dashboard does not show {wanted}"
        );
    }

    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, [payload(1), payload(2), payload(1)]);
    let recorder = Recorder::default();
    let running = Running::start(
        raw_config(&[broker.tcp_addr()]).validate().unwrap(),
        recorder.clone(),
    )
    .await;
    let addr = running.metrics_addr.unwrap();
    wait_until_or(
        "three messages counted",
        Duration::from_secs(10),
        || metric(&scrape(addr), "nsq_dedupe_duplicates_total") == Some(1.0),
        || scrape(addr),
    )
    .await;
    let exposed = sample_names(&scrape(addr));
    running.stop().await;
    let missing: Vec<&String> = queried.iter().filter(|q| !exposed.contains(*q)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which the sidecar does not expose; it exposes {exposed:?}"
    );
    assert_eq!(recorder.distinct_delivered(), 2);
}
