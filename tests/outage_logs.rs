//! What the sidecar's log says through a store outage, read from its stderr as an operator
//! reads it: the cause as it appears (a Redis out of memory named with its fix), then once, at
//! INFO, that the store answers again, with how long it failed and how many errors; and
//! nothing lost.

use std::time::Duration;

use bytes::Bytes;

use crate::store_refusals::{start, stop};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;
use crate::util::wait_until_or;

pub(crate) const TOPIC: &str = "events";

pub(crate) fn body(i: usize) -> Bytes {
    Bytes::from(format!("{{\"id\":{i}}}"))
}

/// `run` on `broker` with the store `store`, store errors requeued after 100 ms.
pub(crate) fn start_on(broker: &Broker, store: &[&str]) -> Child {
    let nsqd = broker.tcp_addr().to_string();
    let mut args = vec![
        "--topic",
        TOPIC,
        "--nsqd-tcp-address",
        &nsqd,
        "--metrics-address",
        "off",
        "--buckets",
        "65536",
        "--store-error-requeue-delay",
        "100ms",
    ];
    args.extend_from_slice(store);
    start(&args)
}

/// Waits (at most `limit`) until `running` has delivered `n` messages.
pub(crate) async fn wait_delivered(running: &Child, n: usize, limit: Duration) {
    wait_until_or(
        &format!("{n} delivered"),
        limit,
        || running.stdout().lines().count() == n,
        || running.stderr(),
    )
    .await;
}

/// Checks that `stdout` holds the bodies of `0..n`, each once.
pub(crate) fn assert_each_once(stdout: &str, n: usize) {
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    let mut expected: Vec<String> = (0..n)
        .map(|i| String::from_utf8(body(i).to_vec()).unwrap())
        .collect();
    expected.sort();
    assert_eq!(lines, expected, "each message once, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_is_named_with_its_fix_and_loses_nothing() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let broker = Broker::start(BrokerConfig::default()).await;
    let url = server.url();
    let running = start_on(&broker, &["--store", "redis", "--redis-url", &url]);
    broker.publish_many(TOPIC, (0..20).map(body));
    wait_delivered(&running, 20, Duration::from_secs(20)).await;

    // Redis may not grow: it refuses every write, as a server that is full and evicts nothing.
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    broker.publish_many(TOPIC, (20..40).map(body));
    let said = format!(
        "error=store at {} is out of memory: it answered \"OOM command not allowed when used \
         memory > 'maxmemory'.\"; raise its `maxmemory`, or let it evict with a policy such as \
         `maxmemory-policy allkeys-lru`, which only costs some copies being missed (an evicted \
         set forgets its digests)",
        server.addr()
    );
    wait_until_or(
        "the store error naming OOM and its fix",
        Duration::from_secs(10),
        || {
            running
                .stderr()
                .lines()
                .any(|line| line.contains(" ERROR ") && line.contains(&said))
        },
        || running.stderr(),
    )
    .await;
    assert_eq!(
        running.stdout().lines().count(),
        20,
        "delivered while Redis refused writes"
    );

    // Memory raised mid-stream: every message requeued meanwhile is delivered, once.
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_delivered(&running, 40, Duration::from_secs(30)).await;
    let stopped = stop(running).await;
    assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
    assert_each_once(&stopped.stdout, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_answers_again_is_said_once_at_info() {
    let mut memcached = MemcachedServer::start();
    let broker = Broker::start(BrokerConfig::default()).await;
    let addr = memcached.addr();
    let running = start_on(
        &broker,
        &[
            "--store",
            "memcached",
            "--memcached-address",
            &addr,
            "--store-timeout",
            "200ms",
        ],
    );
    broker.publish_many(TOPIC, (0..20).map(body));
    wait_delivered(&running, 20, Duration::from_secs(20)).await;

    memcached.stop();
    broker.publish_many(TOPIC, (20..40).map(body));
    wait_until_or(
        "the outage logged",
        Duration::from_secs(10),
        || running.stderr().contains("Store error."),
        || running.stderr(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    memcached.restart();

    // The stream goes on: a message every 100 ms until the log says the store is back.
    let mut published = 40;
    while !running.stderr().contains("Store answers again.") {
        assert!(
            published < 140,
            "no line said the store answers again:\n{}",
            running.stderr()
        );
        broker.publish(TOPIC, body(published));
        published += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_delivered(&running, published, Duration::from_secs(30)).await;
    let stopped = stop(running).await;
    assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
    assert_each_once(&stopped.stdout, published);

    let log: Vec<&str> = stopped.stderr.lines().collect();
    let back: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].contains("Store answers again."))
        .collect();
    assert_eq!(back.len(), 1, "said once: {}", stopped.stderr);
    let line = log[back[0]];
    assert!(line.contains(" INFO "), "{line}");
    let last_error = (0..log.len())
        .rev()
        .find(|&i| log[i].contains("Store error."))
        .unwrap();
    assert!(
        last_error < back[0],
        "a store error after the line that said the store is back:\n{}",
        stopped.stderr
    );
    // How long it failed and how many errors: as many as the sidecar counted.
    let field = |line: &str, name: &str| -> String {
        line.split(&format!(" {name}="))
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_owned()
    };
    // A `Duration` as `Debug` writes it: `42.113s`, `977.5ms`, `0ns` ...
    let seconds = |name: &str| -> f64 {
        let text = field(line, name);
        [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
            .iter()
            .find_map(|(unit, scale)| Some(text.strip_suffix(unit)?.parse::<f64>().ok()? * scale))
            .unwrap_or_else(|| panic!("{name} is no duration in {line}"))
    };
    // From the first error to the answer: at least from the first error to the last.
    assert!(seconds("answered_after") >= seconds("failed_for"), "{line}");
    let errors: u64 = field(line, "errors").parse().unwrap();
    let counted: u64 = field(
        log.iter().find(|l| l.contains("Sidecar stopped.")).unwrap(),
        "store_errors",
    )
    .parse()
    .unwrap();
    assert!(errors > 0 && errors == counted, "{line}: {counted} counted");
    // Each ERROR line gives the errors of the call it reports and those not logged since the
    // line before: together no more than counted, the rest came after the last line.
    let logged: u64 = log
        .iter()
        .filter(|l| l.contains("Store error."))
        .map(|l| {
            let reported: u64 = field(l, "errors").parse().unwrap();
            assert!(reported > 0, "{l}");
            reported + field(l, "suppressed").parse::<u64>().unwrap()
        })
        .sum();
    assert!(
        logged > 0 && logged <= counted,
        "{logged} logged, {counted} counted"
    );
}
