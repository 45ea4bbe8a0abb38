//! A shared store that is down makes the sidecar back off, as go-nsq backs off on handler
//! failures, instead of requeueing every message at once for nsqd to send straight back: the
//! messages in flight when the store failed are requeued, then nsqd is asked for nothing
//! (RDY 0) but, after a pause that doubles, one message that tests the store. Over a fixed
//! outage the requeues nsqd sees stay about one window of messages in flight, however many
//! wait; once the store answers again, every message is delivered, once.

use std::time::Duration;

use crate::outage_logs::{assert_each_once, body, start_on, wait_delivered, TOPIC};
use crate::store_refusals::stop;
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;

/// Messages published while the store is down: ten windows of the default `max_in_flight`
/// (200).
const WAITING: usize = 2_000;

/// How long the store stays down.
const OUTAGE: Duration = Duration::from_secs(4);

/// The most requeues nsqd may see over [`OUTAGE`]: the default window of 200 messages in
/// flight when the store failed (RDY 0 is on the wire before their requeues make room for
/// more), and a test message per pause (1 s, 2 s, 4 s, ...: at most 3 in 4 s), with room to
/// spare.
const MOST_REQUEUES: u64 = 200 + 20;

/// A store server that a test takes down and brings back (on the same port, empty).
trait Server {
    fn down(&mut self);
    fn up(&mut self);
}

impl Server for MemcachedServer {
    fn down(&mut self) {
        self.stop();
    }
    fn up(&mut self) {
        self.restart();
    }
}

impl Server for RedisServer {
    fn down(&mut self) {
        self.kill();
    }
    fn up(&mut self) {
        self.restart();
    }
}

/// Runs a sidecar on `server` (the store of `store_args`), takes it down for [`OUTAGE`]
/// while [`WAITING`] messages are published, and brings it back: the requeues stay within
/// [`MOST_REQUEUES`], and every message is then delivered once.
async fn outage(store_args: &[&str], server: &mut impl Server) {
    let broker = Broker::start(BrokerConfig::default()).await;
    // The fleet's rounds, which read the table's descriptor, every half second: several fail
    // during the outage.
    let store_args = [store_args, &["--fleet-interval", "500ms"]].concat();
    let running = start_on(&broker, &store_args);
    broker.publish_many(TOPIC, (0..20).map(body));
    wait_delivered(&running, 20, Duration::from_secs(20)).await;
    assert_eq!(
        broker.stats().req_ok,
        0,
        "requeues while the store answered"
    );

    server.down();
    broker.publish_many(TOPIC, (20..20 + WAITING).map(body));
    tokio::time::sleep(OUTAGE).await;
    let stats = broker.stats();
    let requeues = stats.req_ok + stats.req_failed;
    assert_eq!(
        running.stdout().lines().count(),
        20,
        "delivered while the store was down"
    );
    assert!(
        requeues <= MOST_REQUEUES,
        "{requeues} requeues over a {OUTAGE:?} outage with {WAITING} messages waiting, at most \
         {MOST_REQUEUES} expected ({} deliveries)\n{}",
        stats.deliveries,
        running.stderr()
    );

    server.up();
    wait_delivered(&running, 20 + WAITING, Duration::from_secs(60)).await;
    let stopped = stop(running).await;
    assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
    assert_each_once(&stopped.stdout, 20 + WAITING);
    assert_eq!(broker.finished(TOPIC, "nsq-dedupe").len(), 20 + WAITING);
    assert_eq!(broker.depth(TOPIC, "nsq-dedupe"), (0, 0, 0), "left at nsqd");
    let back = stopped
        .stderr
        .lines()
        .filter(|line| line.contains("Store answers again."))
        .collect::<Vec<_>>();
    assert_eq!(back.len(), 1, "said once:\n{}", stopped.stderr);
    assert!(back[0].contains(" INFO "), "{}", back[0]);
    // The descriptor's failed reads are said once, and their end once.
    for (line, times) in [
        ("Reading the table's descriptor failed;", 1),
        ("The table's descriptor reads again.", 1),
    ] {
        assert_eq!(
            stopped.stderr.matches(line).count(),
            times,
            "{line}\n{}",
            stopped.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memcached_outage_pauses_consumption_and_loses_nothing() {
    let mut memcached = MemcachedServer::start();
    let addr = memcached.addr();
    let store = ["--store", "memcached", "--memcached-address", &addr];
    outage(&store, &mut memcached).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_pauses_consumption_and_loses_nothing() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    outage(&["--store", "redis", "--redis-url", &url], &mut redis).await;
}
