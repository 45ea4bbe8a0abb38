//! The sidecar end to end: test brokers (`support::broker`), a real memcached
//! (`support::memcached`), and the `nsq-dedupe run` binary as a child process.
//!
//! Every wait is bounded in time, every server is on loopback and is stopped when its test ends
//! (brokers and memcached on drop, child processes by `ChildGuard`). Message timeouts are 1-2 s
//! so that redelivery and lease expiry happen within the test's time.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nsq_dedupe::config::{ConfigError, Dur, OneOrMany, RawConfig, SinkKind, StoreKind};
use nsq_dedupe::metrics::get;
use nsq_dedupe::sidecar::{RunError, RunReport};
use nsq_dedupe::sink::{Handler, HandlerError};
use nsq_dedupe::{Metrics, Settings, Sidecar};
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::broker::{Broker, BrokerConfig};
use crate::support::http::{Answer as HttpAnswer, HttpServer};
use crate::support::lookupd::Lookupd;
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;
use crate::util::{signal_and_wait, wait_until_or};

pub(crate) const TOPIC: &str = "events";
pub(crate) const CHANNEL: &str = "dedupe";

/// A configuration with short timers for `addrs`, metrics on a free loopback port.
pub(crate) fn raw_config(addrs: &[SocketAddr]) -> RawConfig {
    let list = addrs
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    RawConfig::from_toml(
        &format!(
            r#"
[source]
nsqd_tcp_addresses = [{list}]
topic = "{TOPIC}"
channel = "{CHANNEL}"
max_in_flight = 200
msg_timeout = "2s"
heartbeat_interval = "1s"
backoff = "10ms"
max_backoff = "200ms"

[dedupe]
in_flight_requeue_delay = "50ms"
store_error_requeue_delay = "100ms"

[store]
kind = "memory"
buckets = 1048576
ways = 8
window = "1m"

[metrics]
address = "127.0.0.1:0"
status_interval = "2s"

[shutdown]
grace = "2s"
"#
        ),
        "test",
    )
    .expect("the test configuration parses")
}

/// Counts handler calls per body, and successful ones.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    calls: Arc<Mutex<HashMap<Bytes, u32>>>,
    delivered: Arc<Mutex<HashMap<Bytes, u32>>>,
}

/// A handler that records each body as delivered and always succeeds.
impl Handler for Recorder {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.deliver(body);
        Ok(())
    }
}

impl Recorder {
    pub(crate) fn call(&self, body: &Bytes) {
        *self.calls.lock().unwrap().entry(body.clone()).or_default() += 1;
    }
    pub(crate) fn deliver(&self, body: Bytes) {
        *self.delivered.lock().unwrap().entry(body).or_default() += 1;
    }
    pub(crate) fn distinct_delivered(&self) -> usize {
        self.delivered.lock().unwrap().len()
    }
    pub(crate) fn delivered(&self) -> HashMap<Bytes, u32> {
        self.delivered.lock().unwrap().clone()
    }
    pub(crate) fn calls(&self) -> HashMap<Bytes, u32> {
        self.calls.lock().unwrap().clone()
    }
    /// A handler that works for `delay`, then records the body as delivered and succeeds.
    pub(crate) fn delivering_after(&self, delay: Duration) -> impl Handler {
        let recorder = self.clone();
        move |body: Bytes| {
            let recorder = recorder.clone();
            async move {
                tokio::time::sleep(delay).await;
                recorder.deliver(body);
                Ok(())
            }
        }
    }
}

/// A sidecar running in a task, stopped by `stop`.
pub(crate) struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<RunReport, RunError>>,
    pub(crate) metrics: Arc<Metrics>,
    metrics_addr: Option<SocketAddr>,
}

impl Running {
    pub(crate) async fn start<H: Handler>(settings: Settings, handler: H) -> Running {
        let sidecar = Sidecar::with_handler(settings, handler)
            .await
            .expect("the sidecar starts");
        Running::from_sidecar(sidecar)
    }

    pub(crate) async fn start_configured(settings: Settings) -> Running {
        Running::from_sidecar(Sidecar::new(settings).await.expect("the sidecar starts"))
    }

    fn from_sidecar<H: Handler>(sidecar: Sidecar<H>) -> Running {
        let metrics = sidecar.metrics();
        let metrics_addr = sidecar.metrics_address();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sidecar.run(async move {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            task,
            metrics,
            metrics_addr,
        }
    }

    pub(crate) async fn stop(mut self) -> RunReport {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .expect("the sidecar stops within 15 s")
            .expect("the sidecar task does not panic")
            .expect("the sidecar ends without error")
    }
}

pub(crate) fn payload(i: usize) -> Bytes {
    Bytes::from(format!("{{\"id\":\"p{i:05}\",\"amount\":{}}}", i * 7))
}

/// Nothing queued, deferred or in flight. A channel nobody subscribed to yet also counts as
/// drained, so callers check delivered counts too.
pub(crate) fn drained(broker: &Broker) -> bool {
    broker.depth(TOPIC, CHANNEL) == (0, 0, 0)
}

/// Waits, up to 60 s, until `recorder` holds `n` distinct payloads and every broker's channel
/// is drained; `after` says what came before, for the failure message.
pub(crate) async fn wait_all_delivered(
    recorder: &Recorder,
    brokers: &[&Broker],
    n: usize,
    after: &str,
) {
    wait_until_or(
        &format!("every payload delivered and the brokers drained{after}"),
        Duration::from_secs(60),
        || recorder.distinct_delivered() == n && brokers.iter().all(|b| drained(b)),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
}

/// GET /metrics from the sidecar's metrics server.
pub(crate) fn scrape(addr: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// GET `path` from the sidecar's metrics server: the status code and the body.
fn get_page(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    (status, body)
}

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

pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_stream_reaches_the_sink_exactly_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut order_b: Vec<usize> = (0..10_000).collect();
    rand::seq::SliceRandom::shuffle(&mut order_b[..], &mut rng);
    a.publish_many(TOPIC, (0..10_000).map(payload));
    b.publish_many(TOPIC, order_b.iter().map(|&i| payload(i)));
    a.publish_many(TOPIC, (10_000..10_500).map(payload));

    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            r.deliver(body);
            Ok::<(), HandlerError>(())
        }
    })
    .await;
    wait_until_or(
        "10 500 distinct payloads and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == 10_500 && drained(&a) && drained(&b),
        || {
            format!(
                "{} distinct, depths {:?} {:?}",
                recorder.distinct_delivered(),
                a.depth(TOPIC, CHANNEL),
                b.depth(TOPIC, CHANNEL)
            )
        },
    )
    .await;
    let text = scrape(running.metrics_addr.unwrap());
    let metrics_addr = running.metrics_addr.unwrap();
    wait_until_or(
        "the connection gauge counts both nsqd",
        Duration::from_secs(5),
        || metric(&scrape(metrics_addr), "nsq_dedupe_nsqd_connections") == Some(2.0),
        || scrape(metrics_addr),
    )
    .await;
    let report = running.stop().await;

    let delivered = recorder.delivered();
    let twice: Vec<_> = delivered.iter().filter(|(_, &n)| n != 1).collect();
    assert!(
        twice.is_empty(),
        "{} payloads delivered more than once, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    for i in 0..10_500 {
        assert_eq!(delivered.get(&payload(i)), Some(&1), "payload {i}");
    }
    let m = &running_metrics(&text);
    assert_eq!(m("nsq_dedupe_unique_total"), 10_500.0);
    assert_eq!(m("nsq_dedupe_handler_successes_total"), 10_500.0);
    assert_eq!(
        m("nsq_dedupe_duplicates_total") + m("nsq_dedupe_unique_total"),
        20_500.0,
        "every message was either delivered or a duplicate"
    );
    // Received counts deliveries: copies requeued because they were in flight come back.
    let received = |addr: SocketAddr| m(&format!("nsq_dedupe_received_total{{source=\"{addr}\"}}"));
    assert!(received(a.tcp_addr()) >= 10_500.0 && received(b.tcp_addr()) >= 10_000.0);
    assert_eq!(
        received(a.tcp_addr()) + received(b.tcp_addr()),
        20_500.0 + m("nsq_dedupe_in_flight_requeues_total")
    );
    assert!(text.contains("nsq_dedupe_catch_probability "));
    assert!(report.shutdown.clean, "{report:?}");
}

fn running_metrics(text: &str) -> impl Fn(&str) -> f64 + '_ {
    move |name| metric(text, name).unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_sink_gets_every_payload_at_least_once() {
    flaky_sink(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_sink_with_memcached_gets_every_payload_at_least_once() {
    let memcached = MemcachedServer::start();
    flaky_sink(Some(&memcached)).await;
}

/// A sink failing 10% of calls at random, two replicated nsqd, the in-process table or
/// `memcached`.
async fn flaky_sink(memcached: Option<&MemcachedServer>) {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).rev().map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.source.max_attempts = Some(50);
    let store = match memcached {
        Some(server) => {
            raw.store.kind = Some(StoreKind::Memcached);
            raw.store.memcached_addresses = Some(vec![server.addr()]);
            raw.store.buckets = Some(1 << 16);
            "memcached"
        }
        None => "memory",
    };
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(10)));
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        let fail = rng.lock().unwrap().gen_bool(0.1);
        async move {
            r.call(&body);
            if fail {
                return Err(HandlerError::Retry("flaky sink: injected failure".into()));
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "every payload delivered and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&a) && drained(&b),
        || {
            format!(
                "{} distinct delivered, depths {:?} {:?}, clients {:?} {:?}, stats {:?} {:?}\n{}",
                recorder.distinct_delivered(),
                a.depth(TOPIC, CHANNEL),
                b.depth(TOPIC, CHANNEL),
                a.clients()
                    .iter()
                    .map(|c| (c.rdy, c.in_flight))
                    .collect::<Vec<_>>(),
                b.clients()
                    .iter()
                    .map(|c| (c.rdy, c.in_flight))
                    .collect::<Vec<_>>(),
                a.stats(),
                b.stats(),
                scrape(running.metrics_addr.unwrap())
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.contains("_bucket"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(
            delivered.get(&payload(i)).copied().unwrap_or(0) >= 1,
            "payload {i} never delivered"
        );
    }
    let total: u32 = delivered.values().sum();
    let failures: u32 = recorder.calls().values().sum::<u32>() - total;
    let extra = total as usize - N;
    println!(
        "flaky sink, {store} store: {N} distinct payloads (each published to 2 nsqd), {failures} injected failures, {total} deliveries, {extra} extra deliveries ({:.2}%)",
        100.0 * extra as f64 / N as f64
    );
    assert!(
        failures > 0,
        "the sink never failed, so the test proved nothing"
    );
    assert_eq!(get(&metrics.handler_failures), u64::from(failures));
    assert_eq!(get(&metrics.dead_lettered), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_is_touched_not_redelivered() {
    let a = Broker::start(BrokerConfig::default()).await;
    const N: usize = 20;
    a.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(1)));
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            // Two and a half message timeouts.
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "every slow payload delivered and the broker drained",
        Duration::from_secs(20),
        || recorder.distinct_delivered() == N && drained(&a),
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    for (body, n) in recorder.calls() {
        assert_eq!(n, 1, "{body:?} handled {n} times");
    }
    assert_eq!(recorder.calls().len(), N);
    let stats = a.stats();
    assert_eq!(
        stats.timeouts, 0,
        "nsqd timed a message out despite TOUCH: {stats:?}"
    );
    assert!(stats.touch_ok >= N as u64, "{stats:?}");
    assert_eq!(stats.fin_ok, N as u64);
    assert!(get(&metrics.touches) >= N as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_the_key_pass_as_unique_and_are_counted() {
    let a = Broker::start(BrokerConfig::default()).await;
    let keyless: Vec<Bytes> = vec![
        Bytes::from_static(b"not json at all"),
        Bytes::from_static(b"{\"other\":1}"),
        Bytes::from_static(b"{\"other\":1}"),
        Bytes::from_static(b"\xff\xfe binary"),
    ];
    a.publish_many(TOPIC, keyless.iter().cloned());
    a.publish_many(TOPIC, [payload(1), payload(1), payload(2)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(settings, recorder.clone()).await;
    wait_until_or(
        "7 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 7,
        || format!("{:?}", a.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    // Keyless bodies are never de-duplicated: both `{"other":1}` arrive.
    assert_eq!(delivered.get(&keyless[1]), Some(&2));
    assert_eq!(delivered.get(&keyless[0]), Some(&1));
    assert_eq!(delivered.get(&keyless[3]), Some(&1));
    assert_eq!(delivered.get(&payload(1)), Some(&1));
    assert_eq!(delivered.get(&payload(2)), Some(&1));
    assert_eq!(get(&metrics.keyless), 4);
    assert_eq!(get(&metrics.duplicates), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_outage_with_requeue_loses_nothing() {
    let mut memcached = MemcachedServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 3_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.source.max_in_flight = Some(20);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![memcached.addr()]);
    raw.store.buckets = Some(1 << 16);
    raw.store.timeout = Some(Dur(Duration::from_millis(200)));
    raw.source.max_attempts = Some(1000);
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(
        settings,
        recorder.delivering_after(Duration::from_millis(2)),
    )
    .await;
    wait_until_or(
        "300 deliveries before the outage",
        Duration::from_secs(30),
        || recorder.distinct_delivered() >= 300,
        String::new,
    )
    .await;
    memcached.stop();
    let at_stop = recorder.distinct_delivered();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let during = recorder.distinct_delivered();
    memcached.restart();
    wait_all_delivered(&recorder, &[&a, &b], N, " after memcached came back").await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(delivered.contains_key(&payload(i)), "payload {i} lost");
    }
    let extra: u32 = delivered.values().sum::<u32>() - N as u32;
    println!(
        "memcached outage: {at_stop} delivered at stop, {during} after 1.5 s down, {} store errors, {} requeued for store errors, {extra} extra deliveries (the restart emptied the table)",
        get(&metrics.store_errors),
        get(&metrics.store_error_requeues)
    );
    assert!(get(&metrics.store_errors) > 0, "the outage was not noticed");
    assert!(get(&metrics.store_error_requeues) > 0);
    assert!(
        during - at_stop < 100,
        "with policy requeue, little is delivered while the store is down ({at_stop} -> {during})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memcached_server_dead_for_good_is_ejected_and_stalls_nothing() {
    let one = MemcachedServer::start();
    let mut two = MemcachedServer::start();
    let broker = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.source.max_in_flight = Some(20);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![one.addr(), two.addr()]);
    raw.store.buckets = Some(1 << 16);
    raw.store.timeout = Some(Dur(Duration::from_millis(200)));
    raw.store.eject_after = Some("1s".into());
    raw.source.max_attempts = Some(1000);
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(
        settings,
        recorder.delivering_after(Duration::from_millis(2)),
    )
    .await;
    wait_until_or(
        "300 deliveries before the outage",
        Duration::from_secs(30),
        || recorder.distinct_delivered() >= 300,
        String::new,
    )
    .await;
    two.stop();
    // Without ejection, half of the rest would be requeued for as long as server two is down
    // (for ever here). With it, everything is delivered a few requeue delays after `1s`.
    wait_until_or(
        "every payload delivered with server two dead",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&broker),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
    let page = scrape(running.metrics_addr.expect("metrics are served"));
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(delivered.contains_key(&payload(i)), "payload {i} lost");
    }
    assert_eq!(
        metric(&page, "nsq_dedupe_store_ejections_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(metric(&page, "nsq_dedupe_store_returns_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_sharing_memcached_each_report_the_fleets_distinct_rate() {
    let memcached = MemcachedServer::start();
    sidecars_sharing_a_store_report_the_fleets_distinct_rate(|raw| {
        raw.store.kind = Some(StoreKind::Memcached);
        raw.store.memcached_addresses = Some(vec![memcached.addr()]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_sharing_redis_each_report_the_fleets_distinct_rate() {
    let redis = RedisServer::start();
    sidecars_sharing_a_store_report_the_fleets_distinct_rate(|raw| {
        raw.store.kind = Some(StoreKind::Redis);
        raw.store.redis_urls = Some(vec![redis.url()]);
    })
    .await;
}

/// Two sidecars share one table (the store `shared` configures), each reading its own nsqd:
/// 600 and 300 distinct messages a second. Each reports the fleet's 900 as `distinct_rate`,
/// within 10% (810 to 990); a sidecar that reported its own share (600 or 300) would be
/// outside.
async fn sidecars_sharing_a_store_report_the_fleets_distinct_rate(shared: impl Fn(&mut RawConfig)) {
    const INTERVAL: Duration = Duration::from_millis(500);
    const TICK: Duration = Duration::from_millis(10);
    // Per tick of 10 ms: 600/s to the first nsqd, 300/s to the second.
    const PER_TICK: [usize; 2] = [6, 3];
    const FLEET: f64 = 900.0;
    let brokers = [
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    ];
    let recorder = Recorder::default();
    let mut sidecars = Vec::new();
    for broker in &brokers {
        let mut raw = raw_config(&[broker.tcp_addr()]);
        shared(&mut raw);
        raw.store.namespace = Some("fleet-rate".into());
        raw.store.buckets = Some(1 << 16);
        raw.store.fleet_interval = Some(Dur(INTERVAL));
        let settings = raw.validate().unwrap();
        sidecars.push(Running::start(settings, recorder.clone()).await);
    }
    wait_until_or(
        "both sidecars subscribed",
        Duration::from_secs(10),
        || brokers.iter().all(|b| !b.clients().is_empty()),
        String::new,
    )
    .await;

    // The rate a sidecar reports covers six whole intervals ending up to two intervals before,
    // and is reported after seven shares: read it 10 intervals into the steady stream, which
    // runs for 12.
    let scrape_at = (INTERVAL * 10).as_millis() / TICK.as_millis();
    let ticks = (INTERVAL * 12).as_millis() / TICK.as_millis();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    let mut pages = Vec::new();
    for t in 0..ticks {
        tick.tick().await;
        for (broker, n) in brokers.iter().zip(PER_TICK) {
            broker.publish_many(TOPIC, (sent..sent + n).map(payload));
            sent += n;
        }
        if t == scrape_at {
            for sidecar in &sidecars {
                let addr = sidecar.metrics_addr.expect("metrics are served");
                pages.push(
                    tokio::task::spawn_blocking(move || scrape(addr))
                        .await
                        .unwrap(),
                );
            }
        }
    }
    wait_until_or(
        "every payload delivered",
        Duration::from_secs(30),
        || recorder.distinct_delivered() == sent,
        || format!("{} of {sent} delivered", recorder.distinct_delivered()),
    )
    .await;
    for sidecar in sidecars {
        sidecar.stop().await;
    }
    let rates: Vec<f64> = pages
        .iter()
        .map(|page| metric(page, "nsq_dedupe_distinct_rate").expect("distinct_rate is exposed"))
        .collect();
    assert!(
        rates
            .iter()
            .all(|rate| (rate - FLEET).abs() <= FLEET * 0.1),
        "each sidecar reports the fleet's rate, {FLEET} distinct messages a second, within 10%: {rates:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let raw =
                RawConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            raw.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "expected at least 3 example configs in config/, found {n}"
    );
    // The TOML examples of the README and docs/ too.
    let mut blocks = 0;
    for (page, text) in crate::docs::pages() {
        for block in crate::docs::code_blocks(&text, "toml") {
            RawConfig::from_toml(block, &page.display().to_string())
                .and_then(|raw| raw.validate())
                .unwrap_or_else(|e| panic!("{}: example: {e}\n{block}", page.display()));
            blocks += 1;
        }
    }
    assert!(blocks > 0, "the documentation has no TOML example");
}

fn bad_config(text: &str) -> String {
    match RawConfig::from_toml(text, "bad.toml").and_then(|raw| raw.validate()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const SOURCE: &str = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n";

#[test]
fn malformed_configs_are_rejected_with_the_key_named() {
    let e = bad_config("[source]\ntopic = \"t\"\nnsqd_tcp_adresses = [\"a:1\"]\n");
    assert!(
        e.starts_with("invalid config file bad.toml: TOML parse error at line 3"),
        "{e}"
    );
    assert!(e.contains("unknown field `nsqd_tcp_adresses`"), "{e}");
    let e = bad_config(&format!("{SOURCE}[store]\nbuckets = \"many\"\n"));
    assert!(
        e.contains("buckets") && e.contains("invalid type: string \"many\""),
        "{e}"
    );
    let e = bad_config(&format!("{SOURCE}[store]\nkind = \"valkey\"\n"));
    assert!(
        e.contains("unknown variant `valkey`") && e.contains("redis"),
        "{e}"
    );
    let e = bad_config(
        "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\nmsg_timeout = \"10 parsecs\"\n",
    );
    assert!(
        e.contains(
            "(`source.msg_timeout`): invalid value: string \"10 parsecs\", expected a duration \
             such as 30s"
        ) && !e.contains("msg_timeout = "),
        "{e}"
    );
    // A duration written as a bare number says how to write one, quotes included.
    let e = bad_config(&format!("{SOURCE}[shutdown]\ngrace = 10\n"));
    assert!(
        e.contains(
            "(`shutdown.grace`): invalid type: integer `10`, expected a duration in quotes, \
             such as \"30s\""
        ),
        "{e}"
    );
    assert_eq!(
        bad_config(&format!(
            "{SOURCE}[sink]\nkind = \"http\"\npost = [\"http://a/\", \"ftp://example.com/x\"]\n"
        )),
        "invalid `sink.post` = \"ftp://example.com/x\": expected an http:// or https:// URL"
    );
    // (the text after the minimal [source], or a whole file when it starts with [source]; the error)
    let cases: &[(&str, &str)] = &[
        ("[source]\ntopic = \"t\"\n", "`source.nsqd_tcp_addresses` is required: set it in the config file or pass `--nsqd-tcp-address` or `--lookupd-http-address`"),
        ("[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"localhost\"]\n", "invalid `source.nsqd_tcp_addresses` = \"localhost\": expected host:port such as 127.0.0.1:4150"),
        ("[sink]\nkind = \"http\"\n", "`sink.post` is required: set it in the config file or pass `--post`"),
        ("[sink]\nkind = \"nsq\"\ndestination_nsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n", "`sink.destination_topic` is required: set it in the config file or pass `--destination-topic`"),
        ("[store]\nbuckets = 1000\nprobability = 0.9\n", "invalid `store.probability` = 0.9: give either `store.buckets` or `store.probability` with `store.rate` and `store.window`, not both"),
        ("[store]\nmemory = \"1MiB\"\nbuckets = 1000\n", "invalid `store.memory` = \"1MiB\": give one of `store.buckets`, `store.memory` or `store.probability`, not two"),
        ("[store]\nmemory = \"lots\"\n", "invalid `store.memory` = \"lots\": expected a size such as 64MiB, 1GiB, 500MB or 4096 (bytes)"),
        ("[store]\nkind = \"memcached\"\nmemory = \"1MiB\"\n", "invalid `store.memory` = \"1MiB\": sizes the in-process table; size a shared table with `store.buckets` or `store.probability`"),
        ("[store]\nprobability = 0.9\nwindow = \"1h\"\n", "`store.rate` is required with `store.probability`: set it in the config file"),
        ("[store]\nprobability = 1.5\nrate = 10\nwindow = \"1h\"\n", "invalid `store.probability` = 1.5: `probability` must be between 0 and 1 exclusive (0 < p < 1), got 1.5"),
        ("[store]\nkind = \"memcached\"\nlease = \"5s\"\n", "invalid `store.lease` = 5s: must be at least `source.msg_timeout` (60s), or another delivery may take over a claim whose handler is still running"),
        ("[dedupe]\nkey = \"id\"\n", "invalid `dedupe.key` = \"id\": expected `body` or `json:<JSON pointer>` such as `json:/id`"),
        ("[metrics]\naddress = \"localhost\"\n", "invalid `metrics.address` = \"localhost\": invalid socket address; expected host:port such as 127.0.0.1:9150, localhost:9150 or :9150 (every IPv4 interface), or \"off\""),
        ("[dead_letter]\nkind = \"file\"\n", "`dead_letter.path` is required with `dead_letter.kind = \"file\"`: set it in the config file"),
        ("[source]\ntopic = \"t\"\nlookupd_http_addresses = [\"https://x:4161\"]\n", "invalid `source.lookupd_http_addresses` = \"https://x:4161\": https is not supported; use http://host:port"),
        ("[store]\nkind = \"memcached\"\nfleet_interval = \"0s\"\n", "invalid `store.fleet_interval` = 0s: must be at least 1ms (the fleet's counters are named by the millisecond)"),
        ("[store]\nfleet_interval = \"1s\"\n", "`store.fleet_interval` is used only with a shared table, `store.kind = \"memcached\"` or `store.kind = \"redis\"`: remove it, or set that too"),
        ("[store]\nkind = \"memcached\"\nnamespace = \"my table\"\n", "invalid `store.namespace` = \"my table\": must be 1 to 160 printable ASCII characters without spaces"),
        ("[sink]\nkind = \"nsq\"\ndestination_nsqd_tcp_addresses = [\"127.0.0.1:4150\"]\ndestination_topic = \"bad topic!\"\n", "invalid `sink.destination_topic` = \"bad topic!\": NSQ topic names are 1 to 64 of letters, digits, '.', '_' and '-', optionally ending in #ephemeral"),
    ];
    for (text, expected) in cases {
        let text = if text.starts_with("[source]") {
            (*text).to_owned()
        } else {
            format!("{SOURCE}{text}")
        };
        assert_eq!(bad_config(&text), *expected, "config:\n{text}");
    }
    assert!(matches!(
        RawConfig::from_file(Path::new("/nonexistent/nsq-dedupe.toml")),
        Err(ConfigError::Read { .. })
    ));
}

/// Kills the child process when dropped, so a failing test leaves nothing behind.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn sidecar_binary() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("nsq-dedupe")
}

#[test]
fn run_reports_bad_config_files_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[source]\ntopic = \"t\"\n[stor]\nkind = \"memory\"\n",
    )
    .unwrap();
    let out = Command::new(sidecar_binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `stor`"), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");

    let out = Command::new(sidecar_binary())
        .args([
            "run",
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "127.0.0.1:1",
            "--sink",
            "nsq",
            "--metrics-address",
            "off",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`sink.destination_nsqd_tcp_addresses` is required"),
        "{stderr}"
    );

    let out = Command::new(sidecar_binary())
        .args(["run", "--topic", "t"])
        .env("NSQ_DEDUPE_CONFIG", dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read config file") && stderr.contains("missing.toml"),
        "{stderr}"
    );
}

fn spawn_sidecar(config: &Path, log: &Path) -> Child {
    Command::new(sidecar_binary())
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .expect("the nsq-dedupe binary runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_restart_with_memcached_loses_nothing() {
    let memcached = MemcachedServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    const N: usize = 4_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crash.toml");
    let log = dir.path().join("sidecar.log");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
nsqd_tcp_addresses = ["{addr}"]
topic = "{TOPIC}"
channel = "{CHANNEL}"
max_in_flight = 5
msg_timeout = "1s"
heartbeat_interval = "1s"
backoff = "10ms"
max_backoff = "200ms"

[dedupe]
in_flight_requeue_delay = "200ms"

[store]
kind = "memcached"
memcached_addresses = ["{mc}"]
namespace = "crash-test"
buckets = 65536
lease = "1500ms"

[sink]
kind = "nsq"
destination_nsqd_tcp_addresses = ["{addr}"]
destination_topic = "events.unique"

[metrics]
address = "off"

[shutdown]
grace = "2s"
"#,
            addr = a.tcp_addr(),
            mc = memcached.addr()
        ),
    )
    .unwrap();
    let out_count = || a.messages_on("events.unique").len();
    let mut child = ChildGuard(Some(spawn_sidecar(&config, &log)));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "the first 400 republished",
        Duration::from_secs(30),
        || out_count() >= 400,
        log_text,
    )
    .await;
    // SIGKILL: no chance to answer anything; in-flight messages and claims are left behind.
    let mut first = child.0.take().unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = out_count();
    assert!(
        at_kill < N,
        "the whole stream was done before the kill; nothing was tested"
    );
    let mut second = ChildGuard(Some(spawn_sidecar(&config, &log)));
    wait_until_or(
        "every payload republished after the restart",
        Duration::from_secs(60),
        || {
            let out: HashSet<Bytes> = a.messages_on("events.unique").into_iter().collect();
            out.len() == N && drained(&a)
        },
        || {
            format!(
                "{} republished, depth {:?}\n{}",
                out_count(),
                a.depth(TOPIC, CHANNEL),
                log_text()
            )
        },
    )
    .await;
    // A graceful stop: SIGTERM, exit status 0.
    let mut child = second.0.take().unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 15 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "exit status {status:?} after SIGTERM\n{}",
        log_text()
    );
    let out = a.messages_on("events.unique");
    let distinct: HashSet<&Bytes> = out.iter().collect();
    for i in 0..N {
        assert!(distinct.contains(&payload(i)), "payload {i} lost");
    }
    println!(
        "crash: killed after {at_kill} of {N} republished; {} republished in all, {} extra",
        out.len(),
        out.len() - N
    );
    let log = log_text();
    let last_stop = log
        .lines()
        .rfind(|l| l.contains("Sidecar stopped."))
        .unwrap_or_default()
        .to_owned();
    println!("crash: second run's final status: {last_stop}");
    assert!(log.contains("Sidecar stopped."));
}

/// The binary consuming `broker` into the stdout sink, configured by flags alone (no file):
/// a 4,096-bucket table, no metrics server, `extra` flags; stdout piped, stderr as given.
fn stdout_sidecar(broker: &Broker, extra: &[&str], stderr: Stdio) -> ChildGuard {
    ChildGuard(Some(
        Command::new(sidecar_binary())
            .args([
                "run",
                "--topic",
                TOPIC,
                "--channel",
                CHANNEL,
                "--nsqd-tcp-address",
            ])
            .arg(broker.tcp_addr().to_string())
            .args([
                "--buckets",
                "4096",
                "--sink",
                "stdout",
                "--metrics-address",
                "off",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_too_small_for_the_rate_warns_and_names_the_size_that_would_do() {
    // 2,000 distinct messages in a second or two, into 4,096 slots that should hold an hour.
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..2000).map(payload));
    let mut child = stdout_sidecar(&a, &["--status-interval", "1s"], Stdio::piped());
    let mut c = child.0.take().unwrap();
    let mut stdout = c.stdout.take().unwrap();
    let drain = std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    wait_until_or(
        "2,000 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 2000,
        || format!("{:?}", a.stats()),
    )
    .await;
    // Two status intervals after the last message.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(Command::new("kill")
        .args(["-INT", &c.id().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(c.wait().unwrap().success());
    drain.join().unwrap().unwrap();
    let mut log = String::new();
    c.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let warning = log
        .lines()
        .find(|l| l.contains("The table is too small for the recent rate"))
        .unwrap_or_else(|| panic!("no warning in\n{log}"));
    assert!(
        warning.contains("below the target 0.99; --buckets ")
            && warning.contains(" or --memory ")
            && warning.contains("(with --ways 8) would meet it."),
        "{warning}"
    );
    let suggested: u64 = warning
        .split("--buckets ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no suggested size in {warning}"));
    assert!(suggested > 4096 * 100, "{warning}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_kind_flag_overrides_are_applied() {
    // The stdout sink through the binary, configured by flags alone (no file).
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2), payload(1)]);
    let mut child = stdout_sidecar(&a, &["--key", "json:/id", "--ways", "8"], Stdio::null());
    wait_until_or(
        "3 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 3,
        || format!("{:?}", a.stats()),
    )
    .await;
    let mut c = child.0.take().unwrap();
    let pid = c.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let status = c.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let expected = [payload(1), payload(2)];
    let expected: Vec<&str> = expected
        .iter()
        .map(|b| std::str::from_utf8(b).unwrap())
        .collect();
    assert_eq!(lines, expected);
    let _ = SinkKind::Stdout;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_stops_the_run_and_finishes_nothing_unwritten() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..50).map(payload));
    let mut child = stdout_sidecar(&a, &[], Stdio::piped());
    // The reader goes away before anything is written: every write fails with EPIPE.
    drop(child.0.as_mut().unwrap().stdout.take());
    let mut c = child.0.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = c.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "run did not stop after stdout closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    c.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    // Like `filter | head`: a reader that went away is not a failure.
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("The sink's output was closed; stopping."),
        "{stderr}"
    );
    // Nothing was written, so nothing was finished: every message is back in the queue.
    let stats = a.stats();
    assert_eq!(stats.fin_ok, 0, "{stats:?}");
    let (queued, deferred, in_flight) = a.depth(TOPIC, CHANNEL);
    assert_eq!(queued + deferred + in_flight, 50, "{stats:?}");
}

/// Runs the sidecar from `source` to the nsq sink on `destinations`, with each of 1,000 bodies
/// published twice to `source`; returns once every message is decided.
async fn republish_through_nsq_sink(source: &Broker, destinations: &[String]) {
    source.publish_many(TOPIC, (0..2000).map(|i| payload(i % 1000)));
    let mut raw = raw_config(&[source.tcp_addr()]);
    raw.source.max_in_flight = Some(1000);
    raw.sink.kind = Some(SinkKind::Nsq);
    raw.sink.destination_nsqd_tcp_addresses = Some(destinations.to_vec());
    raw.sink.destination_topic = Some(UNIQUE_TOPIC.into());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "all 2,000 messages decided",
        Duration::from_secs(60),
        || source.stats().fin_ok == 2000 && drained(source),
        || format!("{:?} {:?}", source.stats(), source.depth(TOPIC, CHANNEL)),
    )
    .await;
    running.stop().await;
}

const UNIQUE_TOPIC: &str = "events.unique";

/// Each of the 1,000 distinct bodies exactly once on `destination`.
fn assert_each_once(destination: &Broker) {
    let mut published = destination.messages_on(UNIQUE_TOPIC);
    published.sort();
    let mut expected: Vec<Bytes> = (0..1000).map(payload).collect();
    expected.sort();
    assert_eq!(published.len(), 1000, "duplicates or losses downstream");
    assert_eq!(published, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsq_sink_publishes_each_unique_body_once_in_batches() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    republish_through_nsq_sink(&a, &[b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
    let stats = b.stats();
    assert!(stats.mpub_commands >= 1, "{stats:?}");
    assert!(
        stats.pub_commands + stats.mpub_commands < 500,
        "1,000 records took {} PUB and {} MPUB",
        stats.pub_commands,
        stats.mpub_commands
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_requeues_every_record_of_it_and_loses_none() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    // The first five publishes (whole batches) fail with E_MPUB_FAILED / E_PUB_FAILED.
    b.fail_publishes(5);
    republish_through_nsq_sink(&a, &[b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
    assert!(a.stats().req_ok >= 5, "{:?}", a.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_fail_over_to_the_next_destination() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    // Nothing listens on the first destination.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    republish_through_nsq_sink(&a, &[dead_addr, b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
}

/// A test HTTP endpoint: answers 503 to the first POST of each body, 400 to bodies containing
/// `reject`, holds the first POST of bodies containing `slow` past the sink's timeout, and
/// 200 otherwise. Records the bodies it answered 200 to, and the headers it saw.
struct TestEndpoint {
    addr: SocketAddr,
    accepted: Arc<Mutex<HashMap<Bytes, u32>>>,
    seen_header: Arc<Mutex<bool>>,
    task: JoinHandle<()>,
}

impl Drop for TestEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestEndpoint {
    async fn start() -> TestEndpoint {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted: Arc<Mutex<HashMap<Bytes, u32>>> = Arc::default();
        let seen_header: Arc<Mutex<bool>> = Arc::default();
        let posts: Arc<Mutex<HashMap<Bytes, u32>>> = Arc::default();
        let (acc, hdr) = (accepted.clone(), seen_header.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (acc, hdr, posts) = (acc.clone(), hdr.clone(), posts.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (head_end, length) = loop {
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if head.contains("x-test: yes") {
                                *hdr.lock().unwrap() = true;
                            }
                            break (i + 4, length);
                        }
                    };
                    while buf.len() < head_end + length {
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body = Bytes::copy_from_slice(&buf[head_end..head_end + length]);
                    let attempt = {
                        let mut p = posts.lock().unwrap();
                        let n = p.entry(body.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let status = if text.contains("reject") {
                        "400 Bad Request"
                    } else if attempt == 1 && text.contains("slow") {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        "200 OK"
                    } else if attempt == 1 {
                        "503 Service Unavailable"
                    } else {
                        *acc.lock().unwrap().entry(body).or_default() += 1;
                        "200 OK"
                    };
                    let _ = s
                        .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                        .await;
                });
            }
        });
        TestEndpoint {
            addr,
            accepted,
            seen_header,
            task,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_retries_5xx_and_timeouts_and_dead_letters_4xx() {
    let endpoint = TestEndpoint::start().await;
    let a = Broker::start(BrokerConfig::default()).await;
    let mut bodies: Vec<Bytes> = (0..50).map(payload).collect();
    bodies.push(Bytes::from_static(b"{\"id\":\"slow-1\"}"));
    bodies.push(Bytes::from_static(b"{\"id\":\"reject-1\"}"));
    bodies.push(Bytes::from_static(b"{\"id\":\"reject-2\"}"));
    a.publish_many(TOPIC, bodies.iter().cloned());
    a.publish_many(TOPIC, (0..50).map(payload)); // copies
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join("dead.ndjson");
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!(
        "http://{}/ingest?src=test",
        endpoint.addr
    )));
    raw.sink.headers = Some([("X-Test".to_string(), "yes".to_string())].into());
    raw.sink.http_client_request_timeout = Some(Dur(Duration::from_millis(500)));
    raw.dead_letter =
        Some(toml::from_str(&format!("kind = \"file\"\npath = \"{}\"\n", dead.display())).unwrap());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    let accepted = || endpoint.accepted.lock().unwrap().clone();
    wait_until_or(
        "51 bodies accepted, 2 dead-lettered, broker drained",
        Duration::from_secs(30),
        || {
            accepted().len() == 51
                && drained(&a)
                && std::fs::read_to_string(&dead)
                    .unwrap_or_default()
                    .lines()
                    .count()
                    == 2
        },
        || {
            format!(
                "{} accepted, depth {:?}",
                accepted().len(),
                a.depth(TOPIC, CHANNEL)
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    for body in &bodies[..51] {
        assert_eq!(accepted().get(body), Some(&1), "{body:?}");
    }
    assert!(
        *endpoint.seen_header.lock().unwrap(),
        "the configured header was not sent"
    );
    let dead_lines = std::fs::read_to_string(&dead).unwrap();
    let mut ids: Vec<String> = dead_lines
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["reason"].as_str().unwrap().contains("HTTP 400"), "{l}");
            assert_eq!(v["source"], a.tcp_addr().to_string());
            serde_json::from_str::<serde_json::Value>(v["body"].as_str().unwrap()).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["reject-1", "reject-2"]);
    assert_eq!(get(&metrics.dead_lettered), 2);
    // 51 first tries failed with 503 or a timeout.
    assert_eq!(get(&metrics.retries), 51);
    assert_eq!(get(&metrics.duplicates), 50);
}

/// The records of one `lines` request body.
fn lines_of(body: &Bytes) -> Vec<Bytes> {
    body.split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(Bytes::copy_from_slice)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_holds_2000_in_flight_to_its_connection_bound() {
    let server = HttpServer::start(HttpAnswer::default()).await;
    let a = Broker::start(BrokerConfig::default()).await;
    let bodies: Vec<Bytes> = (0..2000).map(payload).collect();
    a.publish_many(TOPIC, bodies.iter().cloned());
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/pub", server.addr)));
    raw.sink.http_concurrency = Some(10);
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "2000 bodies POSTed and the broker drained",
        Duration::from_secs(30),
        || server.received().len() >= 2000 && drained(&a),
        || format!("{} POSTed", server.received().len()),
    )
    .await;
    running.stop().await;
    let received: HashSet<Bytes> = server.received().into_iter().map(|r| r.body).collect();
    assert_eq!(received, bodies.into_iter().collect::<HashSet<_>>());
    assert!(
        server.most_open() <= 10,
        "{} open at once",
        server.most_open()
    );
    assert!(
        server.connections() <= 10,
        "{} accepted",
        server.connections()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_of_records_fills_http_batches_within_the_batch_timeout() {
    // One record every 20 ms reaches the sidecar in bursts of one: each burst's record waits
    // for the next ones instead of making a request of its own.
    let server = HttpServer::start(HttpAnswer::default()).await;
    let a = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/mpub", server.addr)));
    raw.sink.http_batch_size = Some(10);
    raw.sink.http_batch_timeout = Some(Dur(Duration::from_secs(2)));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    const N: usize = 60;
    for i in 0..N {
        a.publish_many(TOPIC, [payload(i)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered = || -> Vec<Bytes> {
        server
            .received()
            .iter()
            .flat_map(|r| lines_of(&r.body))
            .collect()
    };
    wait_until_or(
        "every record delivered and the broker drained",
        Duration::from_secs(30),
        || delivered().len() >= N && drained(&a),
        || format!("{} delivered", delivered().len()),
    )
    .await;
    running.stop().await;
    let mut records = delivered();
    records.sort();
    let mut expected: Vec<Bytes> = (0..N).map(payload).collect();
    expected.sort();
    assert_eq!(records, expected, "each record once");
    let sizes: Vec<usize> = server
        .received()
        .iter()
        .map(|r| lines_of(&r.body).len())
        .collect();
    // Six full batches, unless the machine stalled for the whole batch timeout.
    assert!(sizes.len() <= 8, "requests of {sizes:?} records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_batches_lose_nothing_to_a_500_and_dead_letter_what_lines_cannot_frame() {
    // The third request fails: its whole batch is requeued and comes back in later ones.
    let server = HttpServer::start(HttpAnswer {
        first_statuses: vec![200, 200, 500],
        ..HttpAnswer::default()
    })
    .await;
    let a = Broker::start(BrokerConfig::default()).await;
    let bodies: Vec<Bytes> = (0..1000).map(payload).collect();
    let two_lines = Bytes::from_static(b"{\"id\":\"two\",\n\"lines\":true}");
    a.publish_many(TOPIC, bodies.iter().take(500).cloned());
    a.publish_many(TOPIC, [two_lines.clone()]);
    a.publish_many(TOPIC, bodies.iter().skip(500).cloned());
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join("dead.ndjson");
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/mpub", server.addr)));
    raw.sink.http_batch_size = Some(50);
    raw.sink.http_concurrency = Some(4);
    raw.dead_letter =
        Some(toml::from_str(&format!("kind = \"file\"\npath = \"{}\"\n", dead.display())).unwrap());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    let delivered = || -> HashSet<Bytes> {
        server
            .received()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 2)
            .flat_map(|(_, r)| lines_of(&r.body))
            .collect()
    };
    wait_until_or(
        "1000 records delivered, 1 dead-lettered, broker drained",
        Duration::from_secs(30),
        || {
            delivered().len() == 1000
                && drained(&a)
                && std::fs::read_to_string(&dead)
                    .unwrap_or_default()
                    .lines()
                    .count()
                    == 1
        },
        || {
            format!(
                "{} delivered, {} requests",
                delivered().len(),
                server.received().len()
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(delivered(), bodies.iter().cloned().collect::<HashSet<_>>());
    let received = server.received();
    let failed = lines_of(&received[2].body);
    assert!(!failed.is_empty());
    for record in &failed {
        let again = received[3..]
            .iter()
            .filter(|r| lines_of(&r.body).contains(record))
            .count();
        assert_eq!(again, 1, "{record:?} of the failed batch sent again once");
    }
    assert_eq!(get(&metrics.retries), failed.len() as u64);
    assert!(
        received.len() < 100,
        "{} requests for 1000 records",
        received.len()
    );
    assert!(
        server.connections() <= 4,
        "{} accepted",
        server.connections()
    );
    let line = std::fs::read_to_string(&dead).unwrap();
    let record: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(record["body"], std::str::from_utf8(&two_lines).unwrap());
    assert!(
        record["reason"].as_str().unwrap().contains("line break"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_the_requeue_back_that_long() {
    let server = HttpServer::start(HttpAnswer {
        first_statuses: vec![429],
        retry_after: Some("2"),
        ..HttpAnswer::default()
    })
    .await;
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/", server.addr)));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "the body POSTed twice and the broker drained",
        Duration::from_secs(20),
        || server.received().len() == 2 && drained(&a),
        || format!("{} POSTed", server.received().len()),
    )
    .await;
    running.stop().await;
    let records = a.records(TOPIC, CHANNEL);
    let requeues = &records
        .iter()
        .find(|r| r.body == payload(1))
        .unwrap()
        .requeued_at;
    assert_eq!(requeues.len(), 1);
    // The configured backoff is 10 ms; the server asked for 2 s.
    assert!(requeues[0].1 >= Duration::from_secs(2), "{requeues:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_past_max_attempts_goes_to_the_dead_letter_topic_then_fin() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_attempts = Some(3);
    raw.dead_letter = Some(toml::from_str("kind = \"nsq\"\ntopic = \"events.dead\"\n").unwrap());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            if body == payload(1) {
                return Err(HandlerError::Retry("always fails".into()));
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "payload 1 dead-lettered and the broker drained",
        Duration::from_secs(20),
        || a.messages_on("events.dead").len() == 1 && drained(&a),
        || format!("{:?} {:?}", a.depth(TOPIC, CHANNEL), recorder.calls()),
    )
    .await;
    running.stop().await;
    assert_eq!(a.messages_on("events.dead"), [payload(1)]);
    assert_eq!(
        recorder.calls().get(&payload(1)),
        Some(&3),
        "tried max_attempts times"
    );
    assert_eq!(recorder.delivered().get(&payload(2)), Some(&1));
    let records = a.records(TOPIC, CHANNEL);
    let failed = records.iter().find(|r| r.body == payload(1)).unwrap();
    assert_eq!((failed.req_ok, failed.fin_ok), (2, 1), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_handlers_within_grace_and_requeues_the_rest() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..6).map(payload));
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.shutdown.grace = Some(Dur(Duration::from_secs(1)));
    let settings = raw.validate().unwrap();
    let started = Recorder::default();
    let r = started.clone();
    let running = Running::start(settings.clone(), move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            // Even payloads finish within the grace period, odd ones do not.
            let i: usize = std::str::from_utf8(&body[8..13]).unwrap().parse().unwrap();
            let work = if i.is_multiple_of(2) { 300 } else { 5_000 };
            tokio::time::sleep(Duration::from_millis(work)).await;
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "6 handlers running",
        Duration::from_secs(10),
        || started.calls().len() == 6,
        String::new,
    )
    .await;
    let metrics = running.metrics.clone();
    let report = running.stop().await;
    assert_eq!(report.shutdown.requeued_at_deadline, 3, "{report:?}");
    assert_eq!(report.abandoned_handlers, 3, "{report:?}");
    assert_eq!(
        get(&metrics.abandoned),
        3,
        "the slow handlers were dropped, not left running"
    );
    let records = a.records(TOPIC, CHANNEL);
    assert_eq!(records.iter().map(|r| r.fin_ok).sum::<u32>(), 3);
    assert_eq!(records.iter().map(|r| r.req_ok).sum::<u32>(), 3);
    for i in [0, 2, 4] {
        assert!(started.delivered().contains_key(&payload(i)));
    }
    // Nothing lost: a second sidecar picks up the three that were requeued.
    let second = Recorder::default();
    let running = Running::start(settings, second.clone()).await;
    wait_until_or(
        "the 3 requeued delivered",
        Duration::from_secs(10),
        || second.distinct_delivered() == 3 && drained(&a),
        String::new,
    )
    .await;
    running.stop().await;
    for i in [1, 3, 5] {
        assert!(second.delivered().contains_key(&payload(i)), "payload {i}");
    }
}

/// A handler made for batches that takes each batch and never finishes writing it.
#[derive(Clone, Default)]
struct StuckBatches(Recorder);

impl Handler for StuckBatches {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.handle_batch(vec![body]).await.remove(0)
    }

    fn handles_batches(&self) -> bool {
        true
    }

    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        for body in &bodies {
            self.0.call(body);
        }
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_in_the_middle_of_a_batch_requeues_it_and_finishes_nothing_unwritten() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..6).map(payload));
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.shutdown.grace = Some(Dur(Duration::from_millis(500)));
    let settings = raw.validate().unwrap();
    let stuck = StuckBatches::default();
    let running = Running::start(settings.clone(), stuck.clone()).await;
    wait_until_or(
        "6 records with the sink",
        Duration::from_secs(10),
        || stuck.0.calls().len() == 6,
        String::new,
    )
    .await;
    let report = running.stop().await;
    assert_eq!(report.shutdown.requeued_at_deadline, 6, "{report:?}");
    assert_eq!(report.abandoned_handlers, 6, "{report:?}");
    let records = a.records(TOPIC, CHANNEL);
    assert_eq!(records.iter().map(|r| r.fin_ok).sum::<u32>(), 0);
    assert_eq!(records.iter().map(|r| r.req_ok).sum::<u32>(), 6);
    // Nothing lost: a second sidecar delivers all six.
    let second = Recorder::default();
    let running = Running::start(settings, second.clone()).await;
    wait_until_or(
        "the 6 requeued delivered",
        Duration::from_secs(10),
        || second.distinct_delivered() == 6 && drained(&a),
        || format!("{:?}", a.stats()),
    )
    .await;
    running.stop().await;
}

/// One timed pass of [`throughput`]: `n` distinct 100-byte bodies through `run` to the null
/// sink with `store`; returns messages per second from the publish to the last FIN.
///
/// Steady state: the sidecar first handles `WARM_UP` other messages, so connecting, RDY
/// ramp-up and the first touch of the table's memory (64 MiB zeroed by the kernel) are not
/// timed; a long-running sidecar pays them once.
/// Which sink a timed pass delivers to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BenchSink {
    Null,
    /// The stdout sink's writer, on `/dev/null`.
    StdoutToDevNull,
    /// The stdout sink as it was before group commit, on `/dev/null`: an async mutex, then one
    /// write and one flush per record through tokio's blocking pool.
    PerRecordToDevNull,
    /// The nsq sink, to a second broker.
    Nsq(SocketAddr),
    /// One PUB and one round trip per record, as the nsq sink did before batching.
    PubPerRecord(SocketAddr),
}

/// CPU time (user and system) this process has used so far: the sidecar's and the test
/// broker's, which share it.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` through the pointer, which points at one.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// One timed pass: messages per second, and CPU microseconds per message (process-wide).
#[derive(Debug, Clone, Copy)]
struct Pass {
    rate: f64,
    cpu_us: f64,
}

/// Publishes `bodies` to the test broker and waits until it has counted `fin_total` FINs in
/// all; returns the time that took and the CPU time this process used meanwhile.
pub(crate) async fn publish_timed(
    broker: &Broker,
    bodies: Vec<Bytes>,
    fin_total: u64,
) -> (Duration, Duration) {
    let started = Instant::now();
    let cpu_before = process_cpu();
    broker.publish_many(TOPIC, bodies);
    wait_for_fins(broker, "all FINs at the broker", fin_total).await;
    (started.elapsed(), process_cpu() - cpu_before)
}

/// Waits (at most 5 minutes) until the test broker has counted `fin_total` FINs in all.
pub(crate) async fn wait_for_fins(broker: &Broker, what: &str, fin_total: u64) {
    wait_until_or(
        what,
        Duration::from_secs(300),
        || broker.stats().fin_ok == fin_total,
        || format!("{:?}", broker.stats()),
    )
    .await;
}

async fn timed_pass(store: StoreKind, sink: BenchSink, n: usize, pass: usize) -> Pass {
    const WARM_UP: usize = 100_000;
    let broker = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let bodies = |prefix: &str, count: usize| {
        let mut all = bytes::BytesMut::with_capacity(count * 100);
        for i in 0..count {
            let mut b = [b'x'; 100];
            b[..13].copy_from_slice(format!("{prefix}{pass:03}{i:09}").as_bytes());
            all.extend_from_slice(&b);
        }
        let all = all.freeze();
        (0..count).map(move |i| all.slice(i * 100..(i + 1) * 100))
    };
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(60)));
    raw.source.heartbeat_interval = Some(Dur(Duration::from_secs(30)));
    raw.store.kind = Some(store);
    raw.store.buckets = Some(8 * 1024 * 1024);
    raw.sink.kind = Some(SinkKind::Null);
    raw.metrics.address = Some("off".into());
    raw.metrics.status_interval = Some(Dur(Duration::from_secs(3600)));
    broker.publish_many(TOPIC, bodies("w", WARM_UP));
    let running = match sink {
        BenchSink::Null => Running::start_configured(raw.validate().unwrap()).await,
        BenchSink::StdoutToDevNull => {
            let dev_null = std::fs::File::create("/dev/null").unwrap();
            let sink = nsq_dedupe::sink::Sink::Stdout(nsq_dedupe::sink::StdoutSink::new(dev_null));
            Running::start(raw.validate().unwrap(), sink).await
        }
        BenchSink::PerRecordToDevNull => {
            use tokio::io::AsyncWriteExt;
            let dev_null = tokio::fs::File::from_std(std::fs::File::create("/dev/null").unwrap());
            let out = Arc::new(tokio::sync::Mutex::new(dev_null));
            let handler = move |body: Bytes| {
                let out = out.clone();
                async move {
                    let mut line = Vec::with_capacity(body.len() + 1);
                    line.extend_from_slice(&body);
                    line.push(b'\n');
                    let mut out = out.lock().await;
                    out.write_all(&line).await.unwrap();
                    out.flush().await.unwrap();
                    Ok(())
                }
            };
            Running::start(raw.validate().unwrap(), handler).await
        }
        BenchSink::Nsq(destination) => {
            raw.sink.kind = Some(SinkKind::Nsq);
            raw.sink.destination_nsqd_tcp_addresses = Some(vec![destination.to_string()]);
            raw.sink.destination_topic = Some(UNIQUE_TOPIC.into());
            Running::start_configured(raw.validate().unwrap()).await
        }
        BenchSink::PubPerRecord(destination) => {
            let config = nsq_dedupe::ProducerConfig::new(vec![destination.to_string()]);
            let producer = Arc::new(nsq_dedupe::Producer::new(config).unwrap());
            let handler = move |body: Bytes| {
                let producer = producer.clone();
                async move {
                    producer.publish(UNIQUE_TOPIC, body).await.unwrap();
                    Ok(())
                }
            };
            Running::start(raw.validate().unwrap(), handler).await
        }
    };
    wait_for_fins(&broker, "the warm-up finished", WARM_UP as u64).await;
    let (elapsed, cpu) =
        publish_timed(&broker, bodies("t", n).collect(), (WARM_UP + n) as u64).await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(get(&metrics.unique), (WARM_UP + n) as u64);
    assert_eq!(get(&metrics.handler_successes), (WARM_UP + n) as u64);
    assert_eq!(broker.depth(TOPIC, CHANNEL), (0, 0, 0));
    Pass {
        rate: n as f64 / elapsed.as_secs_f64(),
        cpu_us: cpu.as_secs_f64() * 1e6 / n as f64,
    }
}

/// End-to-end throughput of `run`: test broker -> de-dup -> null sink, with the in-process
/// table against the `none` store, alternating which runs first, best of five each.
///
/// `cargo test --release --test integration sidecar::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 300_000;
    let (mut none, mut memory) = (Vec::new(), Vec::new());
    // Alternate which goes first, so that neither always runs on a warmer (or busier) machine.
    for pass in 0..5 {
        if pass % 2 == 0 {
            none.push(timed_pass(StoreKind::None, BenchSink::Null, N, 2 * pass).await);
            memory.push(timed_pass(StoreKind::Memory, BenchSink::Null, N, 2 * pass + 1).await);
        } else {
            memory.push(timed_pass(StoreKind::Memory, BenchSink::Null, N, 2 * pass + 1).await);
            none.push(timed_pass(StoreKind::None, BenchSink::Null, N, 2 * pass).await);
        }
    }
    let median = |v: &[Pass], field: fn(&Pass) -> f64| {
        let mut v: Vec<f64> = v.iter().map(field).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let best = |v: &[Pass]| v.iter().map(|p| p.rate).fold(0.0, f64::max);
    let rate = |p: &Pass| p.rate;
    let cpu = |p: &Pass| p.cpu_us;
    println!("sidecar throughput, {N} distinct 100-byte messages after a warm-up, max_in_flight 2500, null sink:");
    for (name, passes) in [("none", &none), ("memory", &memory)] {
        println!(
            "  store {name:<7} {:>9.0} msgs/s best, {:>9.0} median; CPU {:.2} µs/msg median (sidecar and test broker); passes {:?}",
            best(passes),
            median(passes, rate),
            median(passes, cpu),
            passes.iter().map(|p| (p.rate.round(), (p.cpu_us * 100.0).round() / 100.0)).collect::<Vec<_>>()
        );
    }
    println!(
        "  ratio memory/none: {:.3} (best of each), {:.3} (medians); CPU per message memory/none {:.3} (medians)",
        best(&memory) / best(&none),
        median(&memory, rate) / median(&none, rate),
        median(&memory, cpu) / median(&none, cpu),
    );
}

/// Runs each of `sinks` (with its message count) five times, rotating which goes first, and
/// prints the median rate of each and its ratio to the first.
async fn compare_sinks(title: &str, sinks: &[(&str, BenchSink, usize)]) {
    let mut rates = vec![Vec::new(); sinks.len()];
    for pass in 0..5 {
        for k in 0..sinks.len() {
            let which = (pass + k) % sinks.len();
            let (_, sink, n) = sinks[which];
            let tag = sinks.len() * pass + k;
            rates[which].push(timed_pass(StoreKind::Memory, sink, n, tag).await.rate);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("{title}, 100-byte messages, max_in_flight 2500, memory store, medians of 5:");
    let first = median(&rates[0]);
    for ((name, _, n), rates) in sinks.iter().zip(&rates) {
        let rounded: Vec<f64> = rates.iter().map(|x| x.round()).collect();
        println!(
            "  {name:<18} {:>9.0} msgs/s of {n} ({:.3} of {}; passes {rounded:?})",
            median(rates),
            median(rates) / first,
            sinks[0].0
        );
    }
}

/// End-to-end throughput of the nsq sink (MPUB batches to a second broker) against the `null`
/// sink and against one PUB per record, in-process table.
///
/// `cargo test --release --test integration sidecar::nsq_sink_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn nsq_sink_throughput() {
    let destination = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let to = destination.tcp_addr();
    let sinks = [
        ("null", BenchSink::Null, 200_000),
        ("nsq (MPUB)", BenchSink::Nsq(to), 200_000),
        ("one PUB each", BenchSink::PubPerRecord(to), 50_000),
    ];
    compare_sinks("nsq sink", &sinks).await;
}

/// End-to-end throughput of the stdout sink (writing to `/dev/null`) against the `null` sink
/// and against the per-record write-and-flush it had before, in-process table.
///
/// `cargo test --release --test integration sidecar::stdout_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn stdout_throughput() {
    let sinks = [
        ("null", BenchSink::Null, 300_000),
        ("stdout /dev/null", BenchSink::StdoutToDevNull, 300_000),
        ("per-record flush", BenchSink::PerRecordToDevNull, 20_000),
    ];
    compare_sinks("stdout sink", &sinks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once_with_143_and_nsqd_keeps_the_message() {
    assert_eq!(second_signal_exit_status("-TERM").await, Some(128 + 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigint_exits_at_once_with_130_and_nsqd_keeps_the_message() {
    assert_eq!(second_signal_exit_status("-INT").await, Some(128 + 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sighup_exits_at_once_with_129_and_nsqd_keeps_the_message() {
    assert_eq!(second_signal_exit_status("-HUP").await, Some(128 + 1));
}

/// A terminal closing, `kill -HUP` or a service manager's hangup must not cost what SIGTERM
/// saves: SIGHUP mid-stream stops the run as SIGTERM does, with the same exit status, the
/// running POSTs finished and nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_mid_stream_stops_gracefully_as_sigterm_does() {
    let term = stop_mid_stream("-TERM").await;
    assert_eq!(term, Some(0));
    assert_eq!(stop_mid_stream("-HUP").await, term);
}

/// Sends `signal` to a run whose http sink answers each POST after 50 ms, once 10 of 200
/// messages were POSTed, and returns its exit status; checks that the run stopped
/// gracefully: every message POSTed was FINished (the running handlers finished), and every
/// other one is back with nsqd, none in flight.
async fn stop_mid_stream(signal: &str) -> Option<i32> {
    const N: usize = 200;
    let http = HttpServer::start(HttpAnswer {
        delay: Duration::from_millis(50),
        ..HttpAnswer::default()
    })
    .await;
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..N).map(payload));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("slow.toml");
    let log = dir.path().join("sidecar.log");
    std::fs::write(
        &config,
        format!(
            "[source]\nnsqd_tcp_addresses = [\"{}\"]\ntopic = \"{TOPIC}\"\nchannel = \"{CHANNEL}\"\n\
             max_in_flight = 4\n\
             [sink]\nkind = \"http\"\npost = \"http://{}/\"\n\
             [metrics]\naddress = \"off\"\n[shutdown]\ngrace = \"10s\"\n",
            a.tcp_addr(),
            http.addr
        ),
    )
    .unwrap();
    let mut guard = ChildGuard(Some(spawn_sidecar(&config, &log)));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "10 messages POSTed",
        Duration::from_secs(20),
        || http.received().len() >= 10,
        log_text,
    )
    .await;
    let child = guard.0.as_mut().unwrap();
    let status = signal_and_wait(child, signal, Duration::from_secs(20)).await;
    let posted: HashSet<Bytes> = http.received().into_iter().map(|r| r.body).collect();
    let finished: HashSet<Bytes> = a.finished(TOPIC, CHANNEL).into_iter().collect();
    assert!(
        posted.len() < N,
        "{signal}: the stream was over before the signal"
    );
    assert_eq!(
        finished,
        posted,
        "{signal}: a POST was left unfinished, or a message finished unPOSTed\n{}",
        log_text()
    );
    // The broker takes back what was in flight as it reads the connection's last frames.
    wait_until_or(
        "nothing in flight",
        Duration::from_secs(5),
        || a.depth(TOPIC, CHANNEL).2 == 0,
        || format!("{signal}: {:?}", a.depth(TOPIC, CHANNEL)),
    )
    .await;
    let (queued, deferred, _) = a.depth(TOPIC, CHANNEL);
    assert_eq!(finished.len() + queued + deferred, N, "{signal}: lost");
    assert!(
        log_text().contains("Stopping gracefully"),
        "{signal}: {status:?}\n{}",
        log_text()
    );
    status.code()
}

/// A SIGTERM while the store is still being opened (a Memcached that accepts connections and
/// never answers) stops the run gracefully once it is open, with status 0: the handlers are
/// installed before anything connects, not when the run starts taking messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_the_store_is_opened_stops_the_run_gracefully() {
    // Accepts connections (into its backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sidecar.log");
    let child = Command::new(sidecar_binary())
        .args(["run", "--topic", TOPIC, "--nsqd-tcp-address", "127.0.0.1:1"])
        .args([
            "--metrics-address",
            "off",
            "--store",
            "memcached",
            "--store-timeout",
            "1s",
        ])
        .arg("--memcached-address")
        .arg(silent.local_addr().unwrap().to_string())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut guard = ChildGuard(Some(child));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "the start logged",
        Duration::from_secs(10),
        || log_text().contains("Starting nsq-dedupe."),
        log_text,
    )
    .await;
    // Opening the store takes about 2 s (a connect and a `version` of 1 s each).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let child = guard.0.as_mut().unwrap();
    let status = signal_and_wait(child, "-TERM", Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", log_text());
    assert!(log_text().contains("Stopping gracefully"), "{}", log_text());
}

/// Sends `signal` twice to a run whose handler hangs, and returns its exit status; checks that
/// the first signal waits for the handler, the second exits at once, and the message stays
/// with nsqd.
async fn second_signal_exit_status(signal: &str) -> Option<i32> {
    // An HTTP endpoint that accepts connections and never answers: the handler hangs.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish(TOPIC, payload(1));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hang.toml");
    let log = dir.path().join("sidecar.log");
    std::fs::write(
        &config,
        format!(
            "[source]\nnsqd_tcp_addresses = [\"{}\"]\ntopic = \"{TOPIC}\"\nchannel = \"{CHANNEL}\"\n\
             [sink]\nkind = \"http\"\npost = \"http://{}/\"\nhttp_client_request_timeout = \"60s\"\n\
             [metrics]\naddress = \"off\"\n[shutdown]\ngrace = \"30s\"\n",
            a.tcp_addr(),
            black_hole.local_addr().unwrap()
        ),
    )
    .unwrap();
    let mut guard = ChildGuard(Some(spawn_sidecar(&config, &log)));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "the message in flight",
        Duration::from_secs(20),
        || a.depth(TOPIC, CHANNEL).2 == 1,
        log_text,
    )
    .await;
    let child = guard.0.as_mut().unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the grace period:\n{}",
        log_text()
    );
    // Exits at once: well within the grace period of 30 s.
    let status = signal_and_wait(child, signal, Duration::from_secs(3)).await;
    assert!(
        log_text().contains("Second signal: exiting at once"),
        "{}",
        log_text()
    );
    // The message was never finished: nsqd still holds it (in flight until its timeout, then
    // queued again), so it is not lost.
    let (queued, deferred, in_flight) = a.depth(TOPIC, CHANNEL);
    assert_eq!(queued + deferred + in_flight, 1);
    assert_eq!(a.stats().fin_ok, 0);
    status.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_error_policy_process_delivers_without_de_duplication() {
    // Nothing listens on this port: every claim fails fast with a store error.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2), payload(1)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![dead.to_string()]);
    raw.store.timeout = Some(Dur(Duration::from_millis(100)));
    raw.dedupe.on_store_error = Some(nsq_dedupe::pipeline::StoreErrorPolicy::Process);
    raw.dedupe.store_error_requeue_delay = None;
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    wait_until_or(
        "3 messages finished",
        Duration::from_secs(20),
        || a.stats().fin_ok == 3,
        || format!("{:?}", a.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    // Duplicates possible, nothing lost: the copy of payload 1 is delivered too.
    assert_eq!(recorder.delivered().get(&payload(1)), Some(&2));
    assert_eq!(recorder.delivered().get(&payload(2)), Some(&1));
    assert_eq!(get(&metrics.store_error_processed), 3);
    assert!(get(&metrics.store_errors) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsqd_found_through_lookupd() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let lookupd = Lookupd::start().await;
    lookupd.set_producers(TOPIC, &[a.tcp_addr(), b.tcp_addr()]);
    a.publish_many(TOPIC, (0..100).map(payload));
    b.publish_many(TOPIC, (0..100).map(payload));
    let mut raw = raw_config(&[]);
    raw.source.nsqd_tcp_addresses = None;
    raw.source.lookupd_http_addresses = Some(vec![format!("http://{}", lookupd.http_addr())]);
    raw.source.lookupd_poll_interval = Some(Dur(Duration::from_millis(200)));
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    wait_until_or(
        "both nsqd drained",
        Duration::from_secs(20),
        || drained(&a) && drained(&b) && a.stats().fin_ok == 100 && b.stats().fin_ok == 100,
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    running.stop().await;
    assert!(recorder.delivered().values().all(|&n| n == 1));
    assert!(lookupd.lookups() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_in_flight_are_finished_with_policy_finish() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..20).map(payload));
    b.publish_many(TOPIC, (0..20).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.dedupe.on_in_flight = Some(nsq_dedupe::pipeline::InFlightPolicy::Finish);
    raw.dedupe.in_flight_requeue_delay = None;
    let recorder = Recorder::default();
    // Slow enough that the copy from the other nsqd arrives while this one runs.
    let handler = recorder.delivering_after(Duration::from_millis(300));
    let running = Running::start(raw.validate().unwrap(), handler).await;
    wait_until_or(
        "both drained",
        Duration::from_secs(20),
        || drained(&a) && drained(&b) && a.stats().fin_ok + b.stats().fin_ok == 40,
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(recorder.distinct_delivered(), 20);
    assert!(recorder.delivered().values().all(|&n| n == 1));
    assert!(
        get(&metrics.in_flight_finished) > 0,
        "no copy was found in flight"
    );
    assert_eq!(get(&metrics.in_flight_requeues), 0);
    let fins = a.stats().fin_ok + b.stats().fin_ok;
    assert_eq!((fins, a.stats().req_ok + b.stats().req_ok), (40, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_not_stuck() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2)]);
    let raw = raw_config(&[a.tcp_addr()]);
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(raw.validate().unwrap(), move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            if body == payload(1) && r.calls().get(&body) == Some(&1) {
                panic!("handler bug on the first try");
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "both delivered",
        Duration::from_secs(10),
        || recorder.distinct_delivered() == 2 && a.stats().fin_ok == 2,
        || format!("{:?}", recorder.calls()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(recorder.calls().get(&payload(1)), Some(&2));
    assert_eq!(get(&metrics.handler_failures), 1);
    assert_eq!(get(&metrics.erased), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_lets_a_body_sent_again_later_pass() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.dedupe.max_age = Some(nsq_dedupe::config::Dur(Duration::from_secs(1)));
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    let total = |n: u32| {
        let recorder = recorder.clone();
        move || recorder.delivered().values().sum::<u32>() == n
    };
    // The original and an immediate copy: one delivery.
    broker.publish_many(TOPIC, [payload(1), payload(1)]);
    crate::util::wait_until("the first delivery", Duration::from_secs(10), total(1)).await;
    crate::util::wait_until("both finished", Duration::from_secs(10), || {
        broker.finished(TOPIC, CHANNEL).len() == 2
    })
    .await;
    // The same body two seconds later, on purpose: it passes; its own copy does not.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    broker.publish_many(TOPIC, [payload(1), payload(1)]);
    crate::util::wait_until("every message finished", Duration::from_secs(10), || {
        broker.finished(TOPIC, CHANNEL).len() == 4
    })
    .await;
    running.stop().await;
    assert_eq!(recorder.delivered().get(&payload(1)), Some(&2));
}
