//! What `run` says as it starts and when nsqd refuses it: the start line names only the
//! sources given, and a refusal's advice names the setting to change as it was given.

use std::time::Duration;

use crate::cli_errors::run_until_exit;
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;
use crate::support::memcached::MemcachedServer;

/// The "Sidecar started." line of `run` with `source` flags (nothing answers at those
/// addresses; the line comes before any connection).
fn start_line(source: &[&str]) -> String {
    let args = [
        "run",
        "--topic",
        "t",
        "--metrics-address",
        "off",
        "--sink",
        "null",
    ];
    let mut child = Child::bin(args.iter().chain(source));
    // The line, or none when the process exits without it.
    let line = child.line_on_stderr("Sidecar started.", Duration::from_secs(60));
    line.expect("run logs its start line")
}

#[test]
fn the_start_line_names_only_the_sources_given() {
    let lookupd = start_line(&["--lookupd-http-address", "127.0.0.1:1"]);
    assert!(!lookupd.contains("nsqd="), "{lookupd}");
    assert!(lookupd.contains("lookupd=127.0.0.1:1"), "{lookupd}");
    let nsqd = start_line(&["--nsqd-tcp-address", "127.0.0.1:1"]);
    assert!(nsqd.contains("nsqd=127.0.0.1:1"), "{nsqd}");
    assert!(!nsqd.contains("lookupd="), "{nsqd}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refused_by_nsqd_says_to_remove_the_flag() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let addr = broker.tcp_addr();
    let (code, stderr) = tokio::task::spawn_blocking(move || {
        run_until_exit(&[addr], &["--tls"], Duration::from_secs(60))
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!(
            "error: stopped: nsqd {addr} refused IDENTIFY: nsqd did not agree to TLS (it has no \
             --tls-cert and --tls-key); give nsqd a certificate, or remove `--tls`"
        )
    );
}

/// With a shared store, the start line names the table's namespace: the one the sidecars of
/// a topic and channel share by default, so that `resize --namespace` can be given it.
#[test]
fn the_start_line_names_a_shared_tables_namespace() {
    let memcached = MemcachedServer::start();
    let line = start_line(&[
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--channel",
        "c",
        "--store",
        "memcached",
        "--memcached-address",
        &memcached.addr(),
    ]);
    assert!(line.contains("store=\"memcached\""), "{line}");
    assert!(line.contains("namespace=nsq-dedupe.t.c"), "{line}");
}

/// `--rate` alone sizes the table for the default target probability (0.99) over the window,
/// as the "too small" warning would hold it to, rather than take the default size.
#[test]
fn a_rate_alone_sizes_the_table_for_the_default_target() {
    let line = start_line(&["--nsqd-tcp-address", "127.0.0.1:1", "--rate", "1000"]);
    assert!(line.contains(" buckets=9910168 ways=8 "), "{line}");
}
