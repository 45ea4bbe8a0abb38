//! The pipeline's bursts against the test broker: a burst of messages taken from a consumer is
//! decided with [`Dedupe::process_batch`] by a handler made for batches, and the broker's
//! per-message records say what each message got (FIN, REQ, TOUCH, timeouts).
//!
//! Every wait is bounded; every test ends by checking that nothing was lost.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use nsq_dedupe::error::StoreError;
use nsq_dedupe::nsq::{Consumer, Message};
use nsq_dedupe::pipeline::{Dedupe, Outcome, Policy};
use nsq_dedupe::sink::{Delivery, Handler, HandlerError, Part};
use nsq_dedupe::{Claim, Digest, Geometry, Keyer, Metrics, Store, Table};

use crate::nsq::{config, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig, MsgRecord};

/// A handler made for batches that records what it was handed.
#[derive(Clone, Default)]
struct BatchSink {
    state: Arc<Mutex<SinkState>>,
    /// Fails the whole batch when one record fails, as an `MPUB` does.
    all_or_nothing: bool,
    /// How long each batch takes.
    delay: Duration,
    /// Checked while a batch is held: no message of the broker's channel may be finished.
    broker: Option<Arc<Broker>>,
}

#[derive(Default)]
struct SinkState {
    /// Each batch handed to the sink.
    batches: Vec<Vec<Bytes>>,
    /// Bodies whose records fail.
    failing: HashSet<Bytes>,
    /// Bodies whose records fail the first time only.
    failing_once: HashSet<Bytes>,
    /// Bodies taken (their batch succeeded), in order.
    taken: Vec<Bytes>,
    /// FINs the broker had when a batch was held.
    fins_while_held: u32,
}

impl BatchSink {
    fn batches(&self) -> Vec<Vec<Bytes>> {
        self.state.lock().unwrap().batches.clone()
    }

    fn taken(&self) -> Vec<Bytes> {
        self.state.lock().unwrap().taken.clone()
    }

    fn fail(&self, body: &Bytes, fail: bool) {
        let failing = &mut self.state.lock().unwrap().failing;
        if fail {
            failing.insert(body.clone());
        } else {
            failing.remove(body);
        }
    }
}

impl Handler for BatchSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.handle_batch(vec![body]).await.remove(0)
    }

    fn handles_batches(&self) -> bool {
        true
    }

    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        self.state.lock().unwrap().batches.push(bodies.clone());
        if let Some(broker) = &self.broker {
            // A FIN sent before the hand-off reaches the broker within a few milliseconds;
            // look for one for as long as the batch is held.
            for _ in 0..20 {
                let fins: u32 = broker
                    .records(TOPIC, CHANNEL)
                    .iter()
                    .map(|r| r.fin_ok)
                    .sum();
                self.state.lock().unwrap().fins_while_held += fins;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        tokio::time::sleep(self.delay).await;
        let mut state = self.state.lock().unwrap();
        let failed: Vec<bool> = bodies
            .iter()
            .map(|b| state.failing.contains(b) || state.failing_once.remove(b))
            .collect();
        let any_failed = failed.contains(&true);
        let mut results = Vec::new();
        for (body, failed) in bodies.into_iter().zip(failed) {
            if failed || (self.all_or_nothing && any_failed) {
                results.push(Err(HandlerError::Retry("the batch's write failed".into())));
            } else {
                state.taken.push(body);
                results.push(Ok(()));
            }
        }
        results
    }
}

pub(crate) fn policy() -> Policy {
    Policy {
        in_flight_requeue_delay: Duration::from_millis(10),
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        ..Policy::default()
    }
}

fn dedupe(sink: BatchSink, policy: Policy) -> Dedupe<Table, BatchSink> {
    Dedupe::new(
        Table::with_slots(1024, 8).unwrap(),
        Keyer::new("body".parse().unwrap(), Default::default()),
        sink,
        policy,
        None,
        Arc::new(Metrics::default()),
    )
}

/// A sink whose batches take 1.6 s, longer than the 1 s message timeout the test consumer
/// asks for, and a pipeline that keeps its messages alive every 400 ms.
fn slower_than_the_message_timeout() -> (BatchSink, Dedupe<Table, BatchSink>) {
    let sink = BatchSink {
        delay: Duration::from_millis(1600),
        ..BatchSink::default()
    };
    let policy = Policy {
        keepalive: Duration::from_millis(400),
        ..policy()
    };
    (sink.clone(), dedupe(sink, policy))
}

/// Takes the next message and hands it to `dedupe` in a task of its own, then, once it is
/// claimed, publishes a copy of "a", takes it and checks that it is held beside its original; the original's task.
async fn hold_a_copy(
    broker: &Broker,
    consumer: &mut Consumer,
    dedupe: &Dedupe<Table, BatchSink>,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    let original = take(consumer, 1).await;
    let handling = tokio::spawn({
        let dedupe = dedupe.clone();
        async move { dedupe.process_batch(original).await }
    });
    // The copy must find the original claimed: publish it only once the claim is made.
    let unique = || dedupe.metrics().unique.load(Ordering::Relaxed);
    crate::util::wait_until_or(
        "the original claimed",
        Duration::from_secs(5),
        || unique() == 1,
        || format!("{} claimed new", unique()),
    )
    .await;
    broker.publish_many(TOPIC, bodies(&["a"]));
    let copy = take(consumer, 1).await;
    assert_eq!(dedupe.process_batch(copy).await, [Outcome::Held]);
    handling
}

/// A consumer of `broker` that leaves every decision to the pipeline.
pub(crate) fn consumer(broker: &Broker) -> Consumer {
    let mut c = config(&[broker.tcp_addr()]);
    c.max_attempts = 0;
    c.max_in_flight = 100;
    Consumer::new(c).unwrap()
}

/// The next `n` messages, in arrival order: one burst for the pipeline.
pub(crate) async fn take(consumer: &mut Consumer, n: usize) -> Vec<Message> {
    let mut messages = Vec::new();
    while messages.len() < n {
        let message = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a message within 10 s")
            .expect("the consumer runs");
        messages.push(message);
    }
    messages
}

/// The broker's records of the bodies, in the order given (one record per body; bodies are
/// distinct).
fn records_of(broker: &Broker, bodies: &[Bytes]) -> Vec<MsgRecord> {
    let records = broker.records(TOPIC, CHANNEL);
    bodies
        .iter()
        .map(|b| {
            records
                .iter()
                .find(|r| r.body == b)
                .cloned()
                .unwrap_or_else(|| panic!("no record of {b:?}"))
        })
        .collect()
}

/// Waits until the broker has recorded `expected` (FIN, REQ) answers to the bodies, then
/// checks them (answers are written asynchronously).
async fn assert_answers(broker: &Broker, bodies: &[Bytes], expected: &[(u32, u32)]) {
    let answers = || -> Vec<(u32, u32)> {
        records_of(broker, bodies)
            .iter()
            .map(|r| (r.fin_ok, r.req_ok))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while answers() != expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(answers(), expected, "(FIN, REQ) of each");
}

/// Waits until the broker holds nothing of the channel (every message finished).
pub(crate) async fn drained(broker: &Broker) {
    crate::util::wait_until_or(
        "the channel drained",
        Duration::from_secs(10),
        || broker.depth(TOPIC, CHANNEL) == (0, 0, 0),
        || format!("{:?}", broker.depth(TOPIC, CHANNEL)),
    )
    .await;
}

pub(crate) fn bodies(names: &[&'static str]) -> Vec<Bytes> {
    names
        .iter()
        .map(|n| Bytes::from_static(n.as_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_body_twice_in_one_burst_reaches_the_sink_once() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "b", "a"]));
    let mut consumer = consumer(&broker);
    let sink = BatchSink::default();
    let dedupe = dedupe(sink.clone(), policy());
    let burst = take(&mut consumer, 3).await;
    let outcomes = dedupe.process_batch(burst).await;
    assert_eq!(
        outcomes,
        [Outcome::Delivered, Outcome::Delivered, Outcome::Held]
    );
    assert_eq!(sink.batches(), [bodies(&["a", "b"])]);
    // The copy waited beside its original and was finished as a copy once it was delivered:
    // never requeued.
    drained(&broker).await;
    assert_eq!(sink.taken(), bodies(&["a", "b"]));
    let records = broker.records(TOPIC, CHANNEL);
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r.fin_ok == 1), "{records:?}");
    assert_eq!(records.iter().map(|r| r.req_ok).sum::<u32>(), 0);
    let metrics = dedupe.metrics();
    assert_eq!(metrics.copies_held.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.duplicates.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.in_flight_requeues.load(Ordering::Relaxed), 0);
    assert_eq!(dedupe.held_copies(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_held_beside_a_failing_original_is_delivered_in_its_place() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a", "a"]));
    let mut consumer = consumer(&broker);
    let sink = BatchSink::default();
    sink.state
        .lock()
        .unwrap()
        .failing_once
        .insert(Bytes::from_static(b"a"));
    let dedupe = dedupe(sink.clone(), policy());
    let burst = take(&mut consumer, 2).await;
    // The original fails and is requeued; its claim erased, the copy that waited beside it
    // is decided again at once and delivered.
    assert_eq!(
        dedupe.process_batch(burst).await,
        [Outcome::Retried, Outcome::Held]
    );
    assert_eq!(sink.batches(), [bodies(&["a"]), bodies(&["a"])]);
    assert_eq!(sink.taken(), bodies(&["a"]));
    // The original's retry comes back a copy of what was delivered.
    let retry = take(&mut consumer, 1).await;
    assert_eq!(dedupe.process_batch(retry).await, [Outcome::Duplicate]);
    drained(&broker).await;
    assert_eq!(sink.taken(), bodies(&["a"]), "delivered once, nothing lost");
    let metrics = dedupe.metrics();
    assert_eq!(metrics.in_flight_requeues.load(Ordering::Relaxed), 0);
    assert_eq!(
        metrics.unique.load(Ordering::Relaxed),
        2,
        "claimed new twice"
    );
    assert_eq!(dedupe.held_copies(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_copy_is_touched_for_as_long_as_its_original_is_handled() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a"]));
    // The consumer asks for a 1 s message timeout; the original's batch takes 1.6 s.
    let mut consumer = consumer(&broker);
    let (sink, dedupe) = slower_than_the_message_timeout();
    let handling = hold_a_copy(&broker, &mut consumer, &dedupe).await;
    assert_eq!(dedupe.held_copies(), 1);
    assert_eq!(handling.await.unwrap(), [Outcome::Delivered]);
    drained(&broker).await;
    let records = broker.records(TOPIC, CHANNEL);
    assert_eq!(records.len(), 2);
    for record in &records {
        assert!(record.touch_ok >= 1, "{record:?}");
        assert_eq!(
            (
                record.timeouts,
                record.deliveries,
                record.fin_ok,
                record.req_ok
            ),
            (0, 1, 1, 0),
            "{record:?}"
        );
    }
    assert_eq!(sink.taken(), bodies(&["a"]));
    assert_eq!(dedupe.held_copies(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// A held copy stays in flight at nsqd but takes no new message's place: RDY rises by one
/// while it waits and falls back once it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_copy_does_not_count_toward_max_in_flight() {
    let broker = Broker::start(BrokerConfig {
        log_flow: true,
        ..BrokerConfig::default()
    })
    .await;
    broker.publish_many(TOPIC, bodies(&["a"]));
    let mut consumer = consumer(&broker);
    let sink = BatchSink {
        delay: Duration::from_millis(500),
        ..BatchSink::default()
    };
    let dedupe = dedupe(sink.clone(), policy());
    let handling = hold_a_copy(&broker, &mut consumer, &dedupe).await;
    let rdy = || broker.flow_log().last().map(|e| e.rdy);
    crate::util::wait_until_or(
        "RDY raised by the held copy",
        Duration::from_secs(5),
        || rdy() == Some(101),
        || format!("{:?}", broker.flow_log().last()),
    )
    .await;
    assert_eq!(handling.await.unwrap(), [Outcome::Delivered]);
    crate::util::wait_until_or(
        "RDY back to max_in_flight once the copy is answered",
        Duration::from_secs(5),
        || rdy() == Some(100),
        || format!("{:?}", broker.flow_log().last()),
    )
    .await;
    drained(&broker).await;
    assert_eq!(sink.taken(), bodies(&["a"]));
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_record_requeues_only_itself() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "bad", "c"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let sink = BatchSink::default();
    sink.fail(&sent[1], true);
    let dedupe = dedupe(sink.clone(), policy());
    let burst = take(&mut consumer, 3).await;
    let outcomes = dedupe.process_batch(burst).await;
    assert_eq!(
        outcomes,
        [Outcome::Delivered, Outcome::Retried, Outcome::Delivered]
    );
    assert_answers(&broker, &sent, &[(1, 0), (0, 1), (1, 0)]).await;
    // Nothing lost: its claim was erased, so the retry is delivered, not taken for a copy.
    sink.fail(&sent[1], false);
    let retry = take(&mut consumer, 1).await;
    assert_eq!(dedupe.process_batch(retry).await, [Outcome::Delivered]);
    drained(&broker).await;
    assert_eq!(sink.taken(), bodies(&["a", "c", "bad"]));
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_or_nothing_write_fails_its_records_together() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "bad", "c"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let sink = BatchSink {
        all_or_nothing: true,
        ..BatchSink::default()
    };
    sink.fail(&sent[1], true);
    let dedupe = dedupe(sink.clone(), policy());
    let burst = take(&mut consumer, 3).await;
    assert_eq!(dedupe.process_batch(burst).await, [Outcome::Retried; 3]);
    assert_answers(&broker, &sent, &[(0, 1); 3]).await;
    assert!(sink.taken().is_empty());
    // Every claim was erased: the retries are delivered, none is taken for a copy.
    sink.fail(&sent[1], false);
    let retries = take(&mut consumer, 3).await;
    assert_eq!(dedupe.process_batch(retries).await, [Outcome::Delivered; 3]);
    drained(&broker).await;
    let mut taken = sink.taken();
    taken.sort();
    assert_eq!(taken, sent);
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_slower_than_the_message_timeout_is_touched_not_redelivered() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "b"]);
    broker.publish_many(TOPIC, sent.clone());
    // The consumer asks for a 1 s message timeout; the batch takes 1.6 s.
    let mut consumer = consumer(&broker);
    let (sink, dedupe) = slower_than_the_message_timeout();
    let burst = take(&mut consumer, 2).await;
    assert_eq!(dedupe.process_batch(burst).await, [Outcome::Delivered; 2]);
    drained(&broker).await;
    for record in records_of(&broker, &sent) {
        assert!(record.touch_ok >= 2, "{record:?}");
        assert_eq!(
            (record.timeouts, record.deliveries, record.fin_ok),
            (0, 1, 1)
        );
    }
    assert_eq!(sink.taken(), sent);
    consumer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_is_finished_before_its_record_is_handed_on() {
    let broker = Arc::new(Broker::start(BrokerConfig::default()).await);
    let sent = bodies(&["a", "b", "c"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let sink = BatchSink {
        broker: Some(broker.clone()),
        ..BatchSink::default()
    };
    let dedupe = dedupe(sink.clone(), policy());
    let burst = take(&mut consumer, 3).await;
    assert_eq!(dedupe.process_batch(burst).await, [Outcome::Delivered; 3]);
    assert_eq!(
        sink.state.lock().unwrap().fins_while_held,
        0,
        "a message was finished while its record was still with the sink"
    );
    drained(&broker).await;
    assert!(records_of(&broker, &sent).iter().all(|r| r.fin_ok == 1));
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// The in-process table behind a switch that fails every commit and erase while it is on:
/// a shared store whose master died between a burst's claims and its commits.
struct FailingWrites {
    table: Table,
    failing: std::sync::atomic::AtomicBool,
}

impl FailingWrites {
    fn fail(&self, fail: bool) {
        self.failing
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            Err(StoreError::Timeout(Duration::from_millis(500)))
        } else {
            Ok(())
        }
    }
}

impl Store for FailingWrites {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        Ok(self.table.claim(digest))
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        self.check()?;
        Ok(self.table.commit(digest))
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        self.check()?;
        Ok(self.table.erase(digest))
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(self.table.contains(digest))
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.table.geometry())
    }
}

/// A commit and an erase that failed are sent again before the next burst's claims: once
/// the store answers, the copy of the delivered message is a duplicate at once, and the
/// retry of the failed one is delivered, instead of both being held back as in flight until
/// a lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_commits_and_erases_are_sent_again_with_the_next_burst() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "bad"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let sink = BatchSink::default();
    sink.fail(&sent[1], true);
    let store = FailingWrites {
        table: Table::with_slots(1024, 8).unwrap(),
        failing: Default::default(),
    };
    let dedupe = Dedupe::new(
        store,
        Keyer::new("body".parse().unwrap(), Default::default()),
        sink.clone(),
        policy(),
        None,
        Arc::new(Metrics::default()),
    );
    dedupe.store().fail(true);
    let burst = take(&mut consumer, 2).await;
    assert_eq!(
        dedupe.process_batch(burst).await,
        [Outcome::Delivered, Outcome::Retried]
    );

    // The store answers again; a copy of "a" arrives with the retry of "bad".
    dedupe.store().fail(false);
    sink.fail(&sent[1], false);
    broker.publish_many(TOPIC, bodies(&["a"]));
    let mut next = take(&mut consumer, 2).await;
    next.sort_by(|x, y| x.body().cmp(y.body()));
    assert_eq!(
        dedupe.process_batch(next).await,
        [Outcome::Duplicate, Outcome::Delivered],
        "the commit of a and the erase of bad were sent again first"
    );
    drained(&broker).await;
    assert_eq!(sink.taken(), bodies(&["a", "bad"]));
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// A handler that answers record "a" of its burst at once and holds the others until told to
/// answer them, as a serve consumer that FINs one message and keeps another does.
#[derive(Clone, Default)]
struct InParts {
    release: Arc<tokio::sync::Notify>,
}

impl Handler for InParts {
    async fn handle(&self, _body: Bytes) -> Result<(), HandlerError> {
        Ok(())
    }

    fn handles_batches(&self) -> bool {
        true
    }

    fn handle_in_parts(&self, deliveries: Vec<Delivery>) -> impl Stream<Item = Part> + Send {
        let (first, rest): (Vec<usize>, Vec<usize>) =
            (0..deliveries.len()).partition(|&place| deliveries[place].body == "a");
        let release = self.release.clone();
        let later = async move {
            release.notified().await;
            rest.into_iter().map(|place| (place, Ok(()))).collect()
        };
        futures::stream::iter([first.into_iter().map(|place| (place, Ok(()))).collect()])
            .chain(futures::stream::once(later))
    }
}

/// Hands a burst of "a" and "b" to an [`InParts`] handler that keeps alive every 200 ms, and
/// waits until "a" is finished upstream; the handler, the pipeline and the burst's task.
async fn answer_a_hold_b(
    broker: &Broker,
    consumer: &mut Consumer,
    sent: &[Bytes],
) -> (
    InParts,
    Dedupe<Table, InParts>,
    tokio::task::JoinHandle<Vec<Outcome>>,
) {
    let sink = InParts::default();
    let dedupe = Dedupe::new(
        Table::with_slots(1024, 8).unwrap(),
        Keyer::new("body".parse().unwrap(), Default::default()),
        sink.clone(),
        Policy {
            keepalive: Duration::from_millis(200),
            ..policy()
        },
        None,
        Arc::new(Metrics::default()),
    );
    let burst = take(consumer, 2).await;
    let handling = tokio::spawn({
        let dedupe = dedupe.clone();
        async move { dedupe.process_batch(burst).await }
    });
    crate::util::wait_until_or(
        "\"a\" finished upstream",
        Duration::from_secs(10),
        || records_of(broker, sent)[0].fin_ok == 1,
        || format!("{:?}", records_of(broker, sent)),
    )
    .await;
    (sink, dedupe, handling)
}

/// A record the handler answers early is settled and finished upstream at once, while the
/// record it still holds stays in flight and is the only one kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_answered_early_is_finished_while_the_rest_of_its_burst_is_held() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "b"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let (sink, dedupe, handling) = answer_a_hold_b(&broker, &mut consumer, &sent).await;
    // Held past two keep-alives: only "b" is TOUCHed.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let [a, b] = <[MsgRecord; 2]>::try_from(records_of(&broker, &sent)).unwrap();
    assert_eq!((b.fin_ok, b.req_ok), (0, 0), "\"b\" is still held: {b:?}");
    assert!(b.touch_ok >= 2, "\"b\" is kept alive: {b:?}");
    assert_eq!((a.touch_ok, a.touch_failed), (0, 0), "{a:?}");
    assert_eq!(dedupe.handling(), 1, "one record with the handler");
    sink.release.notify_one();
    let outcomes = tokio::time::timeout(Duration::from_secs(10), handling)
        .await
        .expect("the burst ends once \"b\" is answered")
        .unwrap();
    assert_eq!(outcomes, [Outcome::Delivered; 2]);
    drained(&broker).await;
    for record in records_of(&broker, &sent) {
        assert_eq!(
            (record.deliveries, record.fin_ok, record.timeouts),
            (1, 1, 0),
            "{record:?}"
        );
    }
    assert_eq!(dedupe.handling(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// Abandoned at shutdown, a burst requeues only the records the handler had not answered, and
/// erases only their claims: the record finished before stays finished, and delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_burst_requeues_only_the_records_not_answered_yet() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "b"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let (_sink, dedupe, handling) = answer_a_hold_b(&broker, &mut consumer, &sent).await;
    dedupe.abandon();
    let outcomes = tokio::time::timeout(Duration::from_secs(10), handling)
        .await
        .expect("an abandoned burst ends")
        .unwrap();
    assert_eq!(outcomes, [Outcome::Delivered, Outcome::Requeued]);
    assert_answers(&broker, &sent, &[(1, 0), (0, 1)]).await;
    let keyer = Keyer::new("body".parse().unwrap(), Default::default());
    let claimed = |body: &str| {
        dedupe
            .store()
            .contains(keyer.digest(body.as_bytes()).unwrap())
    };
    assert_eq!(
        (claimed("a"), claimed("b")),
        (true, false),
        "\"a\" committed, \"b\"'s claim erased"
    );
    assert_eq!(
        nsq_dedupe::metrics::get(&dedupe.metrics().abandoned),
        1,
        "only \"b\" abandoned"
    );
    assert_eq!(dedupe.handling(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// A handler that answers the second record of its burst twice (`Ok`, then an error), a place
/// beyond its burst, and never the first record.
struct Sloppy;

impl Handler for Sloppy {
    async fn handle(&self, _body: Bytes) -> Result<(), HandlerError> {
        Ok(())
    }

    fn handles_batches(&self) -> bool {
        true
    }

    fn handle_in_parts(&self, _deliveries: Vec<Delivery>) -> impl Stream<Item = Part> + Send {
        let twice = vec![(1, Ok(())), (1, Err(HandlerError::Reject("second".into())))];
        futures::stream::iter([twice, vec![(7, Ok(()))]])
    }
}

/// A record's first result counts, a result for a place beyond the burst is ignored, and a
/// record without a result when the handler's answer ends fails (requeued, not lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_a_result_fails_and_a_second_result_is_ignored() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let sent = bodies(&["a", "b"]);
    broker.publish_many(TOPIC, sent.clone());
    let mut consumer = consumer(&broker);
    let dedupe = Dedupe::new(
        Table::with_slots(1024, 8).unwrap(),
        Keyer::new("body".parse().unwrap(), Default::default()),
        Sloppy,
        policy(),
        None,
        Arc::new(Metrics::default()),
    );
    let burst = take(&mut consumer, 2).await;
    assert_eq!(
        dedupe.process_batch(burst).await,
        [Outcome::Retried, Outcome::Delivered]
    );
    assert_answers(&broker, &sent, &[(0, 1), (1, 0)]).await;
    assert_eq!(dedupe.handling(), 0);
    consumer.shutdown(Duration::from_secs(1)).await;
}
