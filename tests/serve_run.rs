//! `nsq-dedupe run --sink serve` through the binary: test brokers upstream, the binary in the
//! middle, and the project's own NSQ consumer downstream on the port the binary serves, as any
//! NSQ client would use it.
//!
//! Every wait is bounded; the brokers are on loopback and the binary is stopped (or killed)
//! when its test ends.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use crate::serve::{consume, downstream, finished_once, Raw, Seen, NEGOTIATE};
use crate::sidecar::{drained, payload, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;
use crate::util::wait_until_or;

/// The binary under test, with the addresses it bound.
struct Served {
    child: Child,
    /// Where consumers connect.
    tcp: SocketAddr,
    /// Where `/metrics` answers.
    metrics: SocketAddr,
}

impl Served {
    /// The binary consuming `brokers` (keyed on `/id`), serving consumers on a free loopback
    /// port (unless `extra` names another), metrics on another; the ports are read from its
    /// log.
    fn start(brokers: &[&Broker], extra: &[&str]) -> Served {
        let mut args: Vec<String> = ["run", "--topic", TOPIC, "--channel", CHANNEL]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
        for broker in brokers {
            args.push("--nsqd-tcp-address".into());
            args.push(broker.tcp_addr().to_string());
        }
        args.extend(
            [
                "--key",
                "json:/id",
                "--buckets",
                "1048576",
                "--sink",
                "serve",
                "--metrics-address",
                "127.0.0.1:0",
            ]
            .iter()
            .chain(extra)
            .map(|arg| (*arg).to_owned()),
        );
        if !extra.contains(&"--serve-tcp-address") {
            args.extend(["--serve-tcp-address".into(), "127.0.0.1:0".into()]);
        }
        if !extra.contains(&"--serve-http-address") {
            args.extend(["--serve-http-address".into(), "off".into()]);
        }
        let mut child = Child::bin(&args);
        let tcp = logged_address(&mut child, "Serving consumers.", "tcp_address=");
        let metrics = logged_address(&mut child, "Serving /metrics", "addr=");
        Served {
            child,
            tcp,
            metrics,
        }
    }

    /// The serve sink's figures on the metrics page: messages, FINs, REQs, timeouts,
    /// disconnect requeues and consumers.
    fn figures(&self) -> [u64; 6] {
        let page = crate::sidecar::scrape(self.metrics);
        [
            "nsq_dedupe_serve_messages_total",
            "nsq_dedupe_serve_fins_total",
            "nsq_dedupe_serve_reqs_total",
            "nsq_dedupe_serve_timeouts_total",
            "nsq_dedupe_serve_disconnect_requeues_total",
            "nsq_dedupe_serve_consumers",
        ]
        .map(|name| {
            crate::sidecar::metric(&page, name).unwrap_or_else(|| panic!("no {name} in\n{page}"))
                as u64
        })
    }

    /// Waits, up to 60 s, until `seen` holds `n` distinct payloads and `brokers` are drained.
    async fn wait_all_finished(&self, seen: &Seen, brokers: &[&Broker], n: usize) {
        wait_until_or(
            "every payload finished downstream and the brokers drained",
            Duration::from_secs(60),
            || finished_once(seen) == n && brokers.iter().all(|b| drained(b)),
            || {
                format!(
                    "{} distinct downstream; the binary's log:\n{}",
                    finished_once(seen),
                    self.child.stderr()
                )
            },
        )
        .await;
    }

    /// Stops the binary with SIGTERM and checks that it stopped cleanly; its last status line.
    fn stop(self) -> String {
        let stderr = self.stop_log();
        stderr
            .lines()
            .rfind(|l| l.contains("Sidecar stopped."))
            .unwrap_or_else(|| panic!("no last status line in\n{stderr}"))
            .to_owned()
    }

    /// Stops the binary with SIGTERM and checks that it stopped cleanly; its whole log.
    fn stop_log(self) -> String {
        let finished =
            tokio::task::block_in_place(|| self.child.stop_within("TERM", Duration::from_secs(20)));
        assert!(finished.status.success(), "{}", finished.stderr);
        finished.stderr
    }
}

/// The address in the field `field` of the first log line with `text`, waiting up to 30 s.
fn logged_address(child: &mut Child, text: &str, field: &str) -> SocketAddr {
    let line = tokio::task::block_in_place(|| child.line_on_stderr(text, Duration::from_secs(30)))
        .unwrap_or_else(|| panic!("no {text:?} in the log: {}", child.stderr()));
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {line:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("the address in {line:?}: {e}"))
}

/// Each of the `n` payloads reached the downstream consumer exactly once, and every broker's
/// copy of each was answered (the first by the consumer's FIN, the others as duplicates).
fn assert_each_once(seen: &Seen, brokers: &[&Broker], n: usize) {
    let finished: usize = brokers
        .iter()
        .map(|b| b.finished(TOPIC, CHANNEL).len())
        .sum();
    assert_eq!(finished, brokers.len() * n, "messages FINished upstream");
    let seen = seen.lock().unwrap();
    for i in 0..n {
        assert_eq!(
            seen.get(&payload(i)).map(Vec::len),
            Some(1),
            "payload {i}: {:?}",
            seen.get(&payload(i))
        );
    }
    assert_eq!(seen.len(), n, "only the published payloads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_each_payload_of_two_replicated_brokers_to_a_consumer_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 1000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).rev().map(payload));
    let served = Served::start(&[&a, &b], &[]);
    let (seen, task) = consume(downstream(served.tcp, 50), |_| true);
    served.wait_all_finished(&seen, &[&a, &b], N).await;
    assert_each_once(&seen, &[&a, &b], N);
    let n = N as u64;
    assert_eq!(
        served.figures(),
        [n, n, 0, 0, 0, 1],
        "messages, FINs, REQs, timeouts, disconnect requeues, consumers"
    );
    let page = crate::sidecar::scrape(served.metrics);
    let held = crate::sidecar::metric(&page, "nsq_dedupe_copies_held_total").unwrap();
    task.abort();
    // The last status line counts the copies that waited beside their original, and the
    // consumer's requeues (none here).
    let last = served.stop();
    for field in [
        format!(" copies_held={held} "),
        " deferred_copies=0 ".to_owned(),
        " handler_requeues=0 ".to_owned(),
    ] {
        assert!(last.contains(&field), "no {field:?} in {last:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serve_loses_nothing_when_a_consumer_is_killed_mid_stream() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 300;
    const HELD: usize = 40;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let served = Served::start(&[&a, &b], &[]);
    // A consumer takes HELD messages, answers none, and its connection drops, as when its
    // process is killed.
    let mut doomed = Raw::subscribed(served.tcp, NEGOTIATE, HELD as u32).await;
    let mut held: HashSet<Bytes> = HashSet::new();
    for _ in 0..HELD {
        held.insert(doomed.expect_message().await.body);
    }
    assert_eq!(
        held.len(),
        HELD,
        "distinct payloads served to the doomed consumer"
    );
    drop(doomed);
    let (seen, task) = consume(downstream(served.tcp, 50), |_| true);
    served.wait_all_finished(&seen, &[&a, &b], N).await;
    // The second consumer got everything, the killed one's messages too, each once.
    assert_each_once(&seen, &[&a, &b], N);
    let (n, held) = (N as u64, HELD as u64);
    assert_eq!(
        served.figures(),
        [n + held, n, 0, 0, held, 1],
        "messages, FINs, REQs, timeouts, disconnect requeues, consumers"
    );
    task.abort();
    // A consumer that went away is not a failure of the sidecar: its messages count as
    // requeued by their receiver, as a REQ does, and no WARN says a handler failed.
    let stderr = served.stop_log();
    let last = stderr
        .lines()
        .rfind(|l| l.contains("Sidecar stopped."))
        .unwrap_or_else(|| panic!("no last status line in\n{stderr}"));
    for field in [
        " failures=0 ".to_owned(),
        format!(" handler_requeues={held} "),
    ] {
        assert!(last.contains(&field), "no {field:?} in {last:?}");
    }
    assert!(!stderr.contains("Handler failed"), "{stderr}");
    // Its close says it left, and how many messages it held went back.
    let closed = stderr
        .lines()
        .find(|l| l.contains("Consumer connection closed; the messages it held are handed back."))
        .unwrap_or_else(|| panic!("no close line in\n{stderr}"));
    assert!(
        closed.contains(&format!(
            " reason=the consumer closed the connection handed_back={held}"
        )),
        "{closed}"
    );
}

/// `run --sink serve` with `extra` flags, refused: its exit status and stderr.
fn refused(extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "--topic",
        TOPIC,
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        "off",
        "--sink",
        "serve",
    ];
    args.extend(extra);
    crate::cli_errors::run_refused(&[], &args)
}

#[test]
fn bad_serve_settings_name_the_flag_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("secret");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    for (extra, expected) in [
        (
            &["--serve-msg-timeout", "20m"][..],
            "error: invalid `--serve-msg-timeout` = 20m: must be from 1s to \
             `--serve-max-msg-timeout`, 15m\n",
        ),
        (
            &["--serve-heartbeat-interval", "2m"],
            "error: invalid `--serve-heartbeat-interval` = 2m: must be from 1s to 1m, the longest \
             heartbeat interval a consumer may ask for\n",
        ),
        (
            &["--serve-tcp-address", "4250"],
            "error: invalid `--serve-tcp-address` = \"4250\": invalid socket address; expected \
             host:port such as 127.0.0.1:4250, localhost:4250 or :4250 (every IPv4 interface)\n",
        ),
        (
            &["--serve-tls-cert", "/nonexistent/cert.pem"],
            "error: `sink.serve_tls_key` is required with `--serve-tls-cert`: set it in the config \
             file or pass `--serve-tls-key`\n",
        ),
        (
            &["--serve-tls-required"],
            "error: `sink.serve_tls_cert` is required with `--serve-tls-required`: set it in the \
             config file or pass `--serve-tls-cert`\n",
        ),
        (
            &["--serve-auth-secret-file", empty],
            &format!(
                "error: invalid `--serve-auth-secret-file` = {empty:?}: holds no secret (nothing \
                 but a line ending): write the secret consumers send with AUTH\n"
            ),
        ),
    ] {
        assert_eq!(refused(extra), (78, expected.to_owned()), "{extra:?}");
    }
    // The serve settings belong to the serve sink.
    assert_eq!(
        crate::cli_errors::run_refused(
            &[],
            &[
                "--topic",
                TOPIC,
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--serve-max-rdy-count",
                "10"
            ]
        ),
        (
            78,
            "error: `--serve-max-rdy-count` is used only with `--sink serve`: remove it, or set \
             that too\n"
                .to_owned()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_port_beyond_loopback_without_tls_or_auth_is_warned_about() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut served = Served::start(&[&broker], &["--serve-tcp-address", "0.0.0.0:0"]);
    let warning = tokio::task::block_in_place(|| {
        served
            .child
            .line_on_stderr("beyond loopback", Duration::from_secs(10))
    })
    .unwrap_or_else(|| panic!("no warning: {}", served.child.stderr()));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("setting=--serve-tcp-address address=0.0.0.0:0"),
        "{warning}"
    );
    served.stop();
}

/// The start line names the served ports as addresses, as they are typed back into a
/// consumer's flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_ports_are_logged_as_addresses() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut served = Served::start(&[&broker], &["--serve-http-address", "127.0.0.1:0"]);
    let http = logged_address(&mut served.child, "Serving consumers.", "http_address=");
    assert!(http.ip().is_loopback() && http.port() != 0, "{http}");
    served.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_sidecar_stopped_with_no_consumer_hands_its_messages_back_at_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    const N: usize = 50;
    a.publish_many(TOPIC, (0..N).map(payload));
    // A grace longer than the stop is given: records no consumer can take must not wait it out.
    let served = Served::start(&[&a], &["--shutdown-grace", "60s"]);
    wait_until_or(
        "the sidecar holds every message",
        Duration::from_secs(30),
        || a.depth(TOPIC, CHANNEL) == (0, 0, N),
        || {
            format!(
                "{:?}; the binary's log:\n{}",
                a.depth(TOPIC, CHANNEL),
                served.child.stderr()
            )
        },
    )
    .await;
    let port = served.tcp;
    let stopped =
        tokio::task::block_in_place(|| served.child.stop_within("TERM", Duration::from_secs(10)));
    assert!(stopped.status.success(), "{}", stopped.stderr);
    // The port is free at once for a restart, and nothing is lost: every message is back
    // upstream, none finished.
    std::net::TcpListener::bind(port).expect("the served port is free once the sidecar stopped");
    let (queued, deferred, in_flight) = a.depth(TOPIC, CHANNEL);
    assert_eq!((queued + deferred, in_flight), (N, 0), "{}", stopped.stderr);
    assert!(a.finished(TOPIC, CHANNEL).is_empty());
}
