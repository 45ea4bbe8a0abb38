//! A receiver's deferral against a copy claimed while its original settles: a copy from a
//! second nsqd must not reach the receiver that just asked for the content later, whatever
//! the order of the copy's claim and the original's erase. A store that pauses at the
//! original's erase, or holds the copy's claim until that erase, puts the copy in each gap
//! on purpose, where a loaded machine puts it now and then.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::error::StoreError;
use nsq_dedupe::pipeline::{Dedupe, Outcome};
use nsq_dedupe::sink::{Handler, HandlerError};
use nsq_dedupe::{Claim, Digest, Geometry, Keyer, Metrics, Store, Table};
use tokio::sync::{watch, Notify};

use crate::batch::{bodies, consumer, policy, take};
use crate::nsq::TOPIC;
use crate::support::broker::{Broker, BrokerConfig};

/// How long the receiver asks for the content to wait.
const DELAY: Duration = Duration::from_secs(3);

/// Where the store puts the copy's claim.
#[derive(Clone, Copy, PartialEq)]
enum Gap {
    /// The original's erase returns only once the test let it: the copy is claimed after
    /// the erase, before the original's answer is taken further.
    AfterTheErase,
    /// A second claim of the first digest waits for the original's erase: the copy is
    /// looked at before its original is answered and claimed after the erase.
    ClaimAfterTheErase,
}

/// The in-process table, with the pauses of `gap` around the first digest it claimed.
struct Pausing {
    table: Table,
    gap: Gap,
    first: Mutex<Option<Digest>>,
    /// Set once the first digest was erased.
    erased: watch::Sender<bool>,
    /// Lets the paused erase return.
    resume: Notify,
}

impl Pausing {
    fn new(gap: Gap) -> Self {
        Pausing {
            table: Table::with_slots(1024, 8).unwrap(),
            gap,
            first: Mutex::new(None),
            erased: watch::channel(false).0,
            resume: Notify::new(),
        }
    }

    fn is_first(&self, digest: Digest) -> bool {
        *self.first.lock().unwrap() == Some(digest)
    }
}

impl Store for Pausing {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        let again = {
            let mut first = self.first.lock().unwrap();
            let again = *first == Some(digest);
            first.get_or_insert(digest);
            again
        };
        if again && self.gap == Gap::ClaimAfterTheErase {
            let mut erased = self.erased.subscribe();
            tokio::time::timeout(Duration::from_secs(10), erased.wait_for(|e| *e))
                .await
                .expect("the original erased within 10 s")
                .unwrap();
        }
        Ok(self.table.claim(digest))
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(self.table.commit(digest))
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        let erased = self.table.erase(digest);
        // The first erase of the first digest only (`send_replace` gives the value before).
        if self.is_first(digest)
            && !self.erased.send_replace(true)
            && self.gap == Gap::AfterTheErase
        {
            self.resume.notified().await;
        }
        Ok(erased)
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        Ok(self.table.contains(digest))
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.table.geometry())
    }
}

/// A receiver that asks for every message again in [`DELAY`]; its first answer waits for
/// `answer` when asked to.
#[derive(Clone, Default)]
struct Later {
    calls: Arc<AtomicUsize>,
    answer: Option<Arc<Notify>>,
}

impl Handler for Later {
    async fn handle(&self, _body: Bytes) -> Result<(), HandlerError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            if let Some(answer) = &self.answer {
                answer.notified().await;
            }
        }
        Err(HandlerError::Requeued { after: DELAY })
    }
}

fn dedupe(store: Pausing, sink: Later) -> Dedupe<Pausing, Later> {
    Dedupe::new(
        store,
        Keyer::new("body".parse().unwrap(), Default::default()),
        sink,
        policy(),
        None,
        Arc::new(Metrics::default()),
    )
}

/// The copy claimed after the original's erase, before the pipeline answers the original:
/// the deferral is already there, and the copy waits with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_claimed_right_after_its_originals_erase_waits_for_the_delay() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a"]));
    let mut consumer = consumer(&broker);
    let sink = Later::default();
    let dedupe = dedupe(Pausing::new(Gap::AfterTheErase), sink.clone());
    let original = take(&mut consumer, 1).await;
    let handling = tokio::spawn({
        let dedupe = dedupe.clone();
        async move { dedupe.process_batch(original).await }
    });
    let mut erased = dedupe.store().erased.subscribe();
    tokio::time::timeout(Duration::from_secs(10), erased.wait_for(|e| *e))
        .await
        .expect("the original erased within 10 s")
        .unwrap();

    broker.publish_many(TOPIC, bodies(&["a"]));
    let copy = take(&mut consumer, 1).await;
    assert_eq!(dedupe.process_batch(copy).await, [Outcome::InFlight]);
    dedupe.store().resume.notify_one();
    assert_eq!(handling.await.unwrap(), [Outcome::Requeued]);
    assert_eq!(
        sink.calls.load(Ordering::SeqCst),
        1,
        "the copy reached the receiver"
    );
    assert_eq!(dedupe.metrics().deferred_copies.load(Ordering::SeqCst), 1);
}

/// The copy looked at before its original is answered, and claimed after the original's
/// erase: its claim is new, and it is deferred all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_claimed_new_after_its_originals_erase_waits_for_the_delay() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, bodies(&["a"]));
    let mut consumer = consumer(&broker);
    let answer = Arc::new(Notify::new());
    let sink = Later {
        answer: Some(answer.clone()),
        ..Later::default()
    };
    let dedupe = dedupe(Pausing::new(Gap::ClaimAfterTheErase), sink.clone());
    let original = take(&mut consumer, 1).await;
    let handling = tokio::spawn({
        let dedupe = dedupe.clone();
        async move { dedupe.process_batch(original).await }
    });
    crate::util::wait_until_or(
        "the original handed to the receiver",
        Duration::from_secs(10),
        || sink.calls.load(Ordering::SeqCst) == 1,
        || "not yet".into(),
    )
    .await;

    broker.publish_many(TOPIC, bodies(&["a"]));
    let copy = take(&mut consumer, 1).await;
    let deciding = tokio::spawn({
        let dedupe = dedupe.clone();
        async move { dedupe.process_batch(copy).await }
    });
    // The copy's claim waits in the store for the erase; let the receiver answer.
    answer.notify_one();
    assert_eq!(handling.await.unwrap(), [Outcome::Requeued]);
    assert_eq!(deciding.await.unwrap(), [Outcome::InFlight]);
    assert_eq!(
        sink.calls.load(Ordering::SeqCst),
        1,
        "the copy reached the receiver"
    );
    assert_eq!(dedupe.metrics().deferred_copies.load(Ordering::SeqCst), 1);
    // Its claim was taken back: the content comes back after the delay as new.
    let digest = dedupe
        .store()
        .first
        .lock()
        .unwrap()
        .expect("a digest was claimed");
    assert!(!dedupe.store().table.contains(digest));
}
