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

/// The binary consuming `brokers` (keyed on `/id`), serving consumers on a free loopback port
/// (unless `extra` names another); returns it and the port, read from its "Serving
/// consumers." log line.
fn run_serve(brokers: &[&Broker], extra: &[&str]) -> (Child, SocketAddr) {
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
            "--serve-http-address",
            "off",
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
    let mut child = Child::bin(&args);
    let line = tokio::task::block_in_place(|| {
        child.line_on_stderr("Serving consumers.", Duration::from_secs(30))
    })
    .unwrap_or_else(|| panic!("the binary serves no consumers: {}", child.stderr()));
    let address = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("tcp_address="))
        .unwrap_or_else(|| panic!("no tcp_address in {line:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("the served address in {line:?}: {e}"));
    (child, address)
}

/// Waits, up to 60 s, until `seen` holds `n` distinct payloads and `brokers` are drained.
async fn wait_all_finished(seen: &Seen, brokers: &[&Broker], n: usize, child: &Child) {
    wait_until_or(
        "every payload finished downstream and the brokers drained",
        Duration::from_secs(60),
        || finished_once(seen) == n && brokers.iter().all(|b| drained(b)),
        || {
            format!(
                "{} distinct downstream; the binary's log:\n{}",
                finished_once(seen),
                child.stderr()
            )
        },
    )
    .await;
}

/// Each of the `n` payloads reached the downstream consumer exactly once.
fn assert_each_once(seen: &Seen, n: usize) {
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

/// Stops the binary with SIGTERM and checks that it stopped cleanly.
fn stop(child: Child) {
    let finished =
        tokio::task::block_in_place(|| child.stop_within("TERM", Duration::from_secs(20)));
    assert!(finished.status.success(), "{}", finished.stderr);
    assert!(
        finished.stderr.contains("Sidecar stopped."),
        "{}",
        finished.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_each_payload_of_two_replicated_brokers_to_a_consumer_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 1000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).rev().map(payload));
    let (child, served) = run_serve(&[&a, &b], &[]);
    let (seen, task) = consume(downstream(served, 50), |_| true);
    wait_all_finished(&seen, &[&a, &b], N, &child).await;
    task.abort();
    assert_each_once(&seen, N);
    // Each broker's copy answered: the first by the consumer's FIN, the other as a duplicate.
    assert_eq!(
        a.finished(TOPIC, CHANNEL).len() + b.finished(TOPIC, CHANNEL).len(),
        2 * N
    );
    stop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serve_loses_nothing_when_a_consumer_is_killed_mid_stream() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 300;
    const HELD: usize = 40;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let (child, served) = run_serve(&[&a, &b], &[]);
    // A consumer takes HELD messages, answers none, and its connection drops, as when its
    // process is killed.
    let mut doomed = Raw::subscribed(served, NEGOTIATE, HELD as u32).await;
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
    let (seen, task) = consume(downstream(served, 50), |_| true);
    wait_all_finished(&seen, &[&a, &b], N, &child).await;
    task.abort();
    // The second consumer got everything, the killed one's messages too, each once.
    assert_each_once(&seen, N);
    assert_eq!(
        a.finished(TOPIC, CHANNEL).len() + b.finished(TOPIC, CHANNEL).len(),
        2 * N
    );
    stop(child);
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
    let (mut child, _) = run_serve(&[&broker], &["--serve-tcp-address", "0.0.0.0:0"]);
    let warning = tokio::task::block_in_place(|| {
        child.line_on_stderr("beyond loopback", Duration::from_secs(10))
    })
    .unwrap_or_else(|| panic!("no warning: {}", child.stderr()));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("setting=--serve-tcp-address address=0.0.0.0:0"),
        "{warning}"
    );
    stop(child);
}
