//! Stopping the sidecar: handlers waited for within the grace period and the rest requeued, a
//! batch stopped midway requeued whole; through the binary, SIGTERM, SIGINT and SIGHUP stop it
//! gracefully (also while the store is being opened), and a second signal exits at once with
//! nsqd keeping the message.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::Dur;
use nsq_dedupe::metrics::get;
use nsq_dedupe::sink::{Handler, HandlerError};

use crate::sidecar::{
    drained, payload, raw_config, sidecar_binary, spawn_sidecar, ChildGuard, Recorder, Running,
    CHANNEL, TOPIC,
};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::http::{Answer as HttpAnswer, HttpServer};
use crate::util::{signal_and_wait, wait_until_or};

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
    // The handler has the message once its POST connects: in flight at nsqd alone, it may
    // still be on its way to the handler, and a stop then hands it back at once.
    black_hole.set_nonblocking(true).unwrap();
    let mut posts = Vec::new();
    wait_until_or(
        "the handler's POST",
        Duration::from_secs(20),
        || {
            if let Ok((post, _)) = black_hole.accept() {
                posts.push(post);
            }
            !posts.is_empty()
        },
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
    assert!(
        log_text().contains(
            "Shutting down: taking no new messages; waiting for the sink to settle those in \
             hand. grace=30s messages_in_hand=1"
        ),
        "{}",
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
