//! What the sidecar's end-to-end tests share: a configuration with short timers
//! ([`raw_config`]), a handler that counts what it gets ([`Recorder`]), a sidecar running in a
//! task ([`Running`]), the test payloads and the waits for them, the metrics page read over
//! HTTP ([`scrape`], [`metric`]), the `nsq-dedupe` binary as a child process killed on drop
//! ([`ChildGuard`], [`spawn_sidecar`]), and the timed publish of the throughput benchmarks
//! ([`publish_timed`]).
//!
//! The tests that use them are in the `sidecar_*` modules (and the stores' and sinks' own).
//! Every wait is bounded in time, every server is on loopback and is stopped when its test ends
//! (brokers and memcached on drop, child processes by `ChildGuard`). Message timeouts are 1-2 s
//! so that redelivery and lease expiry happen within the test's time.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nsq_dedupe::config::RawConfig;
use nsq_dedupe::sidecar::{RunError, RunReport};
use nsq_dedupe::sink::{Handler, HandlerError};
use nsq_dedupe::{Metrics, Settings, Sidecar};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::broker::Broker;
use crate::util::wait_until_or;

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
    pub(crate) metrics_addr: Option<SocketAddr>,
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
pub(crate) fn get_page(addr: SocketAddr, path: &str) -> (u16, String) {
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

pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

pub(crate) const UNIQUE_TOPIC: &str = "events.unique";

/// Kills the child process when dropped, so a failing test leaves nothing behind.
pub(crate) struct ChildGuard(pub(crate) Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn sidecar_binary() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("nsq-dedupe")
}

pub(crate) fn spawn_sidecar(config: &Path, log: &Path) -> Child {
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
