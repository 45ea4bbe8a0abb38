//! Handlers whose accepted message is final (`Handler::accepts_for_good`: the null sink, or a
//! library handler that declares it): the pipeline claims each unique message done in one
//! store write and never commits it, copies are still dropped, and a handler that can fail
//! keeps its claim (held in flight under a lease) and its commit. Checked with a store that
//! counts its calls, and end to end against a real memcached and redis by their own command
//! counters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::{RawConfig, SinkKind, StoreKind, StoreSettings};
use nsq_dedupe::error::StoreError;
use nsq_dedupe::metrics::get;
use nsq_dedupe::nsq::Message;
use nsq_dedupe::pipeline::{Dedupe, Outcome};
use nsq_dedupe::sink::{Handler, HandlerError, NullSink, Sink};
use nsq_dedupe::{
    Claim, Descriptor, Digest, Generation, Geometry, KeySpec, Keyer, Metrics, RedisStore, Shape,
    Store, Table,
};

use crate::batch::{bodies, consumer, drained, policy, take};
use crate::nsq::TOPIC;
use crate::sidecar::{raw_config, Running};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;
use crate::util::wait_until_or;

/// The in-process table, counting the digests of each kind of call.
struct Counting {
    table: Table,
    claimed: AtomicUsize,
    claimed_done: AtomicUsize,
    committed: AtomicUsize,
    erased: AtomicUsize,
}

impl Counting {
    fn new() -> Self {
        Counting {
            table: Table::with_slots(1024, 8).unwrap(),
            claimed: AtomicUsize::new(0),
            claimed_done: AtomicUsize::new(0),
            committed: AtomicUsize::new(0),
            erased: AtomicUsize::new(0),
        }
    }

    /// Digests claimed in flight, claimed done, committed, erased.
    fn counts(&self) -> [usize; 4] {
        [
            &self.claimed,
            &self.claimed_done,
            &self.committed,
            &self.erased,
        ]
        .map(|count| count.load(Ordering::SeqCst))
    }
}

fn add(count: &AtomicUsize, n: usize) {
    count.fetch_add(n, Ordering::SeqCst);
}

impl Store for Counting {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        add(&self.claimed, 1);
        Ok(self.table.claim(digest))
    }

    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        add(&self.claimed, digests.len());
        Store::claim_many(&self.table, digests).await
    }

    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        add(&self.claimed_done, digests.len());
        Store::claim_done_many(&self.table, digests).await
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        add(&self.committed, 1);
        Ok(self.table.commit(digest))
    }

    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        add(&self.committed, digests.len());
        Store::commit_many(&self.table, digests).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        add(&self.erased, 1);
        Ok(self.table.erase(digest))
    }

    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        add(&self.erased, digests.len());
        Store::erase_many(&self.table, digests).await
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(self.table.contains(digest))
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.table.geometry())
    }
}

/// A handler that records the bodies it took, declares finality or not, and fails the
/// bodies it is told to (once each): a final one that fails breaks its promise.
#[derive(Clone, Default)]
struct Taking {
    accepts_for_good: bool,
    taken: Arc<Mutex<Vec<Bytes>>>,
    fail_once: Arc<Mutex<Vec<Bytes>>>,
}

impl Taking {
    fn new(accepts_for_good: bool) -> Self {
        Taking {
            accepts_for_good,
            ..Taking::default()
        }
    }

    fn taken(&self) -> Vec<Bytes> {
        self.taken.lock().unwrap().clone()
    }
}

impl Handler for Taking {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        let mut fail_once = self.fail_once.lock().unwrap();
        if let Some(at) = fail_once.iter().position(|b| b == &body) {
            fail_once.remove(at);
            return Err(HandlerError::Retry("told to fail".into()));
        }
        self.taken.lock().unwrap().push(body);
        Ok(())
    }

    fn accepts_for_good(&self) -> bool {
        self.accepts_for_good
    }
}

fn pipeline(handler: Taking) -> Dedupe<Counting, Taking> {
    Dedupe::new(
        Counting::new(),
        Keyer::new(KeySpec::Body, Default::default()),
        handler,
        policy(),
        None,
        Arc::new(Metrics::default()),
    )
}

/// The next `n` messages of `consumer`, in the order of their bodies.
async fn burst(consumer: &mut nsq_dedupe::Consumer, n: usize) -> Vec<Message> {
    let mut messages = take(consumer, n).await;
    messages.sort_by(|x, y| x.body().cmp(y.body()));
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_handler_costs_one_store_write_per_unique_message_and_no_commit() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "a", "b", "c"]));
    let mut consumer = consumer(&broker);
    let handler = Taking::new(true);
    let dedupe = pipeline(handler.clone());
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 4).await).await,
        [
            Outcome::Delivered,
            Outcome::Duplicate,
            Outcome::Delivered,
            Outcome::Delivered
        ],
        "the copy within the burst is finished: its original is done already"
    );
    broker.publish_many(TOPIC, bodies(&["a", "d"]));
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 2).await).await,
        [Outcome::Duplicate, Outcome::Delivered]
    );
    assert_eq!(
        dedupe.store().counts(),
        [0, 6, 0, 0],
        "[claimed, claimed done, committed, erased]: one write per message, no commit"
    );
    let metrics = dedupe.metrics();
    assert_eq!(
        [
            &metrics.unique,
            &metrics.duplicates,
            &metrics.handler_successes
        ]
        .map(get),
        [4, 2, 4]
    );
    assert_eq!(handler.taken(), bodies(&["a", "b", "c", "d"]));
    drained(&broker).await;
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_can_fail_still_gets_a_claim_and_a_commit() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "a", "b", "c"]));
    let mut consumer = consumer(&broker);
    let handler = Taking::new(false);
    let dedupe = pipeline(handler.clone());
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 4).await).await,
        [
            Outcome::Delivered,
            Outcome::Held,
            Outcome::Delivered,
            Outcome::Delivered
        ],
        "the copy within the burst waits beside its original"
    );
    assert_eq!(
        dedupe.store().counts(),
        [4, 0, 3, 0],
        "[claimed, claimed done, committed, erased]"
    );
    // The held copy was finished as a copy once its original was committed.
    assert_eq!(get(&dedupe.metrics().duplicates), 1);
    assert_eq!(handler.taken(), bodies(&["a", "b", "c"]));
    drained(&broker).await;
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// A handler that declares finality and fails a record all the same: the record's entry is
/// erased and its message requeued, and the retry is delivered. Nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_handler_that_fails_all_the_same_gets_the_message_again() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "b"]));
    let mut consumer = consumer(&broker);
    let handler = Taking::new(true);
    handler.fail_once.lock().unwrap().push(Bytes::from("b"));
    let dedupe = pipeline(handler.clone());
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 2).await).await,
        [Outcome::Delivered, Outcome::Retried]
    );
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 1).await).await,
        [Outcome::Delivered],
        "the retry is not taken for a copy"
    );
    assert_eq!(dedupe.store().counts(), [0, 3, 0, 1]);
    assert_eq!(handler.taken(), bodies(&["a", "b"]));
    drained(&broker).await;
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// The same with Memcached behind a near-table, which remembers a digest claimed done at
/// once: the erase of the failed record must make the near-table forget it too, or the
/// retry would be taken there for a copy and finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_handler_that_fails_behind_a_near_table_gets_the_message_again() {
    let memcached = MemcachedServer::start();
    let geometry = Geometry::new(1 << 16, 8).unwrap();
    let store = nsq_dedupe::MemcachedStore::connect(
        nsq_dedupe::MemcachedConfig {
            servers: vec![memcached.addr()],
            namespace: crate::store_contract::unique_namespace("near-final"),
            ..nsq_dedupe::MemcachedConfig::default()
        },
        geometry,
    )
    .await
    .unwrap();
    let near = nsq_dedupe::dedup::NearTable::new(geometry, None).unwrap();
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "b"]));
    let mut consumer = consumer(&broker);
    let handler = Taking::new(true);
    handler.fail_once.lock().unwrap().push(Bytes::from("b"));
    let dedupe = Dedupe::new(
        nsq_dedupe::Backend::Memcached(nsq_dedupe::Generations::new(store), Some(near)),
        Keyer::new(KeySpec::Body, Default::default()),
        handler.clone(),
        policy(),
        None,
        Arc::new(Metrics::default()),
    );
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 2).await).await,
        [Outcome::Delivered, Outcome::Retried]
    );
    assert_eq!(
        dedupe.process_batch(burst(&mut consumer, 1).await).await,
        [Outcome::Delivered],
        "the retry is not taken for a copy"
    );
    assert_eq!(handler.taken(), bodies(&["a", "b"]));
    drained(&broker).await;
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn only_the_null_sink_accepts_for_good() {
    assert!(Sink::Null(NullSink).accepts_for_good());
    let closure = |_: Bytes| async { Ok::<(), HandlerError>(()) };
    assert!(!closure.accepts_for_good(), "a handler may fail by default");
}

// ---------------------------------------------------------------------------------------------
// End to end, counted by the store's server.

/// Unique messages of the end-to-end runs; their digests fall in distinct sets of the table
/// (checked), so each write the store sends is one message's.
const N: usize = 120;

/// Buckets of the end-to-end runs' table: 131,072 sets of 8 ways.
const BUCKETS: u64 = 1 << 20;

fn unique_bodies() -> Vec<Bytes> {
    let bodies: Vec<Bytes> = (0..N).map(|i| Bytes::from(format!("m{i:04}"))).collect();
    let keyer = Keyer::new(KeySpec::Body, Default::default());
    let geometry = Geometry::new(BUCKETS, 8).unwrap();
    let sets: std::collections::HashSet<u64> = bodies
        .iter()
        .map(|b| geometry.set_of(keyer.digest(b).unwrap()))
        .collect();
    assert_eq!(sets.len(), N, "the test's bodies share a set: pick others");
    bodies
}

/// Where the end-to-end runs' sinks go.
enum To {
    Null,
    File(std::path::PathBuf),
}

/// Runs the sidecar over `store` (set on `raw` by the caller) into `to`: the unique bodies,
/// then each of them again once they are all handled. Returns the store's writes, as
/// `writes` counts them, over the run.
async fn writes_of_a_run(
    mut raw: RawConfig,
    broker: &Broker,
    to: To,
    writes: impl Fn() -> u64,
) -> u64 {
    raw.store.buckets = Some(BUCKETS);
    match to {
        To::Null => raw.sink.kind = Some(SinkKind::Null),
        To::File(dir) => {
            raw.sink.kind = Some(SinkKind::File);
            raw.sink.output_dir = Some(dir);
        }
    }
    let before = writes();
    let running = Running::start_configured(raw.validate().unwrap()).await;
    let metrics = running.metrics.clone();
    broker.publish_many(TOPIC, unique_bodies());
    wait_until_or(
        "every unique message handled",
        Duration::from_secs(30),
        || get(&metrics.handler_successes) == N as u64 && crate::sidecar::drained(broker),
        || format!("{} handled", get(&metrics.handler_successes)),
    )
    .await;
    broker.publish_many(TOPIC, unique_bodies());
    wait_until_or(
        "every copy finished",
        Duration::from_secs(30),
        || get(&metrics.duplicates) == N as u64 && crate::sidecar::drained(broker),
        || format!("{} duplicates", get(&metrics.duplicates)),
    )
    .await;
    running.stop().await;
    assert_eq!(
        [
            &metrics.unique,
            &metrics.duplicates,
            &metrics.handler_successes,
            &metrics.store_errors
        ]
        .map(get),
        [N as u64, N as u64, N as u64, 0],
        "[unique, duplicates, handled, store errors]"
    );
    writes() - before
}

/// Runs the sidecar on the store that `store` sets, once into the `null` sink and once into a
/// file, and checks the store's writes (as `writes` counts them, `what`): one per unique
/// message into the `null` sink, a claim and a commit into a file.
async fn one_write_per_unique_message_into_the_null_sink(
    store: impl Fn(&mut RawConfig, &str),
    writes: impl Fn() -> u64,
    what: &str,
) {
    let out = tempfile::tempdir().unwrap();
    for (to, per_message) in [(To::Null, 1), (To::File(out.path().to_owned()), 2)] {
        let sink = match to {
            To::Null => "null",
            To::File(_) => "file",
        };
        let broker = Broker::start(BrokerConfig::default()).await;
        let mut raw = raw_config(&[broker.tcp_addr()]);
        store(&mut raw, &crate::store_contract::unique_namespace(sink));
        let written = writes_of_a_run(raw, &broker, to, &writes).await;
        // At most that many: a Memcached item holds several sets, and the operations of one
        // burst on one item are one write (with 120 messages in 16,384 items, two of a burst
        // share one now and then).
        let most = per_message * N as u64;
        assert!(
            (most - most / 20..=most).contains(&written),
            "{sink} sink: {what} for {N} unique messages and {N} copies: {written}, not {most} \
             (or up to 5% fewer)"
        );
    }
}

/// The table's descriptor as the first consumer of a namespace writes it, once: its key and
/// value, for the shared store `raw` names at [`BUCKETS`]. Written before a run whose store
/// writes are counted, so that the count is of the messages' writes alone.
fn descriptor(raw: &mut RawConfig) -> (String, String) {
    raw.store.buckets = Some(BUCKETS);
    let (key, format, geometry) = match raw.validate_store().unwrap() {
        StoreSettings::Redis(config, geometry) => {
            let store = RedisStore::new_lazy(config, geometry).unwrap();
            (store.descriptor_key(), store.format(), geometry)
        }
        StoreSettings::Memcached(config, geometry) => {
            let store = nsq_dedupe::MemcachedStore::new_lazy(config, geometry).unwrap();
            (store.descriptor_key(), store.format(), geometry)
        }
        other => panic!("not a shared store: {other:?}"),
    };
    let table = Descriptor {
        current: Shape { format, geometry },
        previous: None,
    };
    (key, table.encode())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_memcached_the_null_sink_costs_one_write_per_unique_message() {
    let memcached = MemcachedServer::start();
    one_write_per_unique_message_into_the_null_sink(
        |raw, namespace| {
            raw.store.kind = Some(StoreKind::Memcached);
            raw.store.memcached_addresses = Some(vec![memcached.addr()]);
            raw.store.namespace = Some(namespace.to_owned());
            let (key, value) = descriptor(raw);
            let mut conn = std::net::TcpStream::connect(memcached.addr()).unwrap();
            let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
            std::io::Write::write_all(&mut conn, set.as_bytes()).unwrap();
            let mut answer = [0u8; 8];
            std::io::Read::read_exact(&mut conn, &mut answer).unwrap();
            assert_eq!(&answer, b"STORED\r\n");
        },
        // Every `ms` memcached was sent, stored or not.
        || crate::memcached::stat(&memcached.addr(), "cmd_set"),
        "memcached writes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_the_null_sink_costs_one_write_per_unique_message() {
    let redis = RedisServer::start();
    one_write_per_unique_message_into_the_null_sink(
        |raw, namespace| {
            raw.store.kind = Some(StoreKind::Redis);
            raw.store.redis_urls = Some(vec![redis.url()]);
            raw.store.namespace = Some(namespace.to_owned());
            let (key, value) = descriptor(raw);
            redis.cli(&["SET", &key, &value]);
        },
        // Calls of the commands that write a Redis set (from the store's script, too).
        || {
            let calls = crate::redis::command_calls(&redis);
            ["set", "setrange"]
                .iter()
                .filter_map(|c| calls.get(*c))
                .sum()
        },
        "Redis set writes",
    )
    .await;
}

/// Records each body, after a short while, as a final handler: accepted is delivered.
#[derive(Clone, Default)]
struct FinalRecorder(crate::sidecar::Recorder);

impl Handler for FinalRecorder {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.0.deliver(body);
        Ok(())
    }

    fn accepts_for_good(&self) -> bool {
        true
    }
}

/// A fleet as deployed: two sidecars with a final handler share one memcached and both
/// consume two replicated nsqd, so each payload reaches the fleet twice, while bursts flow.
/// Memcached is stopped mid-stream and started again (empty). Every payload is delivered:
/// a claim-done that fails is requeued like any claim, never taken for a copy; copies are
/// dropped across the fleet while the store is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_final_handlers_loses_nothing_through_a_memcached_outage() {
    let mut memcached = MemcachedServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    a.publish_many(TOPIC, (0..N).map(crate::sidecar::payload));
    b.publish_many(TOPIC, (0..N).map(crate::sidecar::payload));
    let recorder = FinalRecorder::default();
    let mut fleet = Vec::new();
    for _ in 0..2 {
        let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
        raw.source.max_in_flight = Some(20);
        raw.source.max_attempts = Some(1000);
        raw.store.kind = Some(StoreKind::Memcached);
        raw.store.memcached_addresses = Some(vec![memcached.addr()]);
        raw.store.namespace = Some("final-fleet".into());
        raw.store.buckets = Some(1 << 16);
        raw.store.timeout = Some(nsq_dedupe::config::Dur(Duration::from_millis(200)));
        let settings = raw.validate().unwrap();
        fleet.push(Running::start(settings, recorder.clone()).await);
    }
    let delivered = || recorder.0.distinct_delivered();
    wait_until_or(
        "300 payloads delivered before the outage",
        Duration::from_secs(30),
        || delivered() >= 300,
        String::new,
    )
    .await;
    memcached.stop();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    memcached.restart();
    crate::sidecar::wait_all_delivered(&recorder.0, &[&a, &b], N, " after memcached came back")
        .await;
    let metrics: Vec<_> = fleet.iter().map(|s| s.metrics.clone()).collect();
    for sidecar in fleet {
        sidecar.stop().await;
    }
    let bodies = recorder.0.delivered();
    for i in 0..N {
        let body = crate::sidecar::payload(i);
        assert!(bodies.contains_key(&body), "payload {i} lost");
    }
    let total = |f: fn(&Metrics) -> u64| metrics.iter().map(|m| f(m)).sum::<u64>();
    assert!(
        total(|m| get(&m.store_errors)) > 0,
        "the outage was not noticed"
    );
    assert!(
        total(|m| get(&m.duplicates)) > 0,
        "the fleet dropped no copy"
    );
}
