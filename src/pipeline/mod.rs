//! The de-duplicating pipeline: what happens to each message between nsqd and the handler.
//!
//! Messages move in bursts ([`Dedupe::process_batch`]; [`Dedupe::process`] is a burst of
//! one): the burst's digests are claimed in one call, every record to deliver is handed to
//! the handler at once ([`Handler::handle_batch`]), the pipeline waits once, commits what
//! succeeded, erases what failed, and answers the burst with one queued write per connection
//! ([`Message::answer_all`]); a handler that answers in parts
//! ([`Handler::handle_in_parts`]: the serve sink) has each part settled and answered as it
//! comes, and only its records not answered yet kept alive. Each message still gets its
//! own decision:
//!
//! 1. The key's digest is computed. A body without a key passes as unique (counted as
//!    `keyless`) and is delivered without touching the store.
//! 2. The digest is claimed in the store (two copies in one burst: the first is `New`, the
//!    second `InFlight`):
//!    - `Duplicate`: FIN. Nothing reaches the handler.
//!    - `InFlight`: another delivery of the same content is being handled. By default, when
//!      this process handles it, the copy waits beside it and is decided when it settles
//!      (`held.rs`); else REQ with a short delay, so the copy is decided once the first one
//!      finishes ([`InFlightPolicy::Requeue`]). Optionally FIN ([`InFlightPolicy::Finish`]),
//!      which is not safe when the "copy" is nsqd redelivering a message whose handler is
//!      still running.
//!    - A digest whose receiver asked for it later (`deferred.rs`) is not claimed: the
//!      message is requeued to come back when that delay ends.
//!    - `New`: the handler gets the body, with the burst's other records. While it runs, the
//!      messages are TOUCHed and the claims' leases renewed every `keepalive`. Success of its
//!      own record: `commit`, then FIN. For a handler whose accepted message is final
//!      ([`Handler::accepts_for_good`]: the null sink) the claim records a new digest as done
//!      at once ([`Store::claim_done_many`]): one store write per unique message, no lease to
//!      renew and no commit, and a copy in the same burst is a `Duplicate`. Failure of its own
//!      record (a sink whose write is
//!      all-or-nothing fails the records of that write together): `erase`, then REQ of that
//!      message alone, with a delay that grows with the attempts; a rejection, or a failure on
//!      the `max_attempts`-th delivery, sends the message to the dead-letter and FINs it only
//!      once the dead-letter accepted it. Without a dead-letter it is requeued with the longest
//!      delay instead: never dropped. The cause of a failure is logged at WARN, at most once
//!      a second per cause (`pipeline/failure_log.rs`). A record whose receiver asks for it
//!      later ([`HandlerError::Requeued`](crate::sink::HandlerError::Requeued)) is no
//!      failure: `erase`, then REQ with the delay it asked for, its digest deferred as long.
//!      Copies held beside a record are FINed once it is delivered, decided again otherwise.
//! 3. A store error at claim follows [`StoreErrorPolicy`]: `Requeue` (REQ, decided later) or
//!    `Process` (delivered without de-duplication). Each message has its own claim: where a
//!    burst's sets live on several servers and one fails, only its messages take the policy.
//!    A burst the store decided none of (down, not one server of several) is an outage: the
//!    consumer backs off, RDY 0 for a pause that doubles, then one message tests the store, and
//!    the first claim it answers ends the pause at once (`outage.rs`).
//!    Errors of `commit`, `erase` and `renew` are counted and logged, and the message goes on:
//!    a stale claim only delays or duplicates a later copy, it never drops one. Failed commits
//!    and erases, and the erases of requeued claims that got no answer, are sent again before
//!    the next bursts' claims (`unsettled`), so a store that
//!    answers again decides copies at once, not a lease later. Each cause of store errors is
//!    logged when it appears, then at most once a `STORE_ERROR_LOG_INTERVAL` while it lasts,
//!    with the count of those not logged (see `store_error_log`); every one is counted.
//!
//! Whatever nsqd no longer accepts (a FIN for a message that timed out) is counted as an
//! answer failure: nsqd redelivers that message, and the store decides it again.
//!
//! The steps, each in its file: `decide.rs` (key, claim, decide), `deliver.rs` (the handler
//! call and its keep-alive), `settle.rs` (commit, erase, and the writes sent again),
//! `answer.rs` (FIN, REQ, dead-letter), `outage.rs` (the consumer told of a store outage);
//! `held.rs` keeps the copies that wait beside their original, `deferred.rs` the digests
//! requeued at their receiver's request; `policy.rs` holds the decisions' settings.

mod answer;
mod decide;
mod deferred;
mod deliver;
mod failure_log;
mod handed;
mod held;
mod outage;
mod policy;
mod settle;
mod store_error_log;
mod unsettled;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::dedup::digest::Keyer;
use crate::dedup::{Digest, Store};
use crate::error::StoreError;
use crate::metrics::{add, Metrics};
use crate::nsq::Message;
use crate::sink::{DeadLetter, Handler};
use answer::requeue;
use deferred::Deferred;
use failure_log::FailureLog;
use held::Held;
use store_error_log::StoreErrorLog;
use unsettled::Unsettled;

pub use policy::{InFlightPolicy, Policy, StoreErrorPolicy};
pub(crate) use policy::{DEFAULT_IN_FLIGHT_REQUEUE_DELAY, DEFAULT_STORE_ERROR_REQUEUE_DELAY};

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered to the handler and finished.
    Delivered,
    /// A copy of something delivered before; finished.
    Duplicate,
    /// A copy of something being handled elsewhere, or deferred at its receiver's request;
    /// requeued (or finished, by policy).
    InFlight,
    /// A copy of something this process is handling: held, and answered when that one
    /// settles (finished as a copy once it is delivered, decided again if it is not).
    Held,
    /// The handler failed; requeued for a retry.
    Retried,
    /// Accepted by the dead-letter and finished.
    DeadLettered,
    /// Requeued without a failure of the handler: its receiver asked to have it later
    /// ([`HandlerError::Requeued`](crate::sink::HandlerError::Requeued)), or it could not be
    /// delivered nor dead-lettered, or the store failed.
    Requeued,
}

/// A store, a [`Keyer`] and a [`Handler`]: the de-duplicating step of a pipeline.
///
/// Cheap to clone (an `Arc`); process each burst (or message) in its own task.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use nsq_dedupe::nsq::{Consumer, ConsumerConfig};
/// use nsq_dedupe::pipeline::{Dedupe, Policy};
/// use nsq_dedupe::sink::HandlerError;
/// use nsq_dedupe::{Keyer, Metrics, Table};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let table = Table::with_slots(1 << 20, 8)?;
/// let handler = |body: Bytes| async move {
///     println!("{}", String::from_utf8_lossy(&body));
///     Ok::<(), HandlerError>(())
/// };
/// let dedupe = Dedupe::new(
///     table,
///     Keyer::new("json:/id".parse()?, Default::default()),
///     handler,
///     Policy::default(),
///     None,
///     Arc::new(Metrics::default()),
/// );
/// let mut config = ConsumerConfig::new("events", "dedupe");
/// config.nsqd_tcp_addresses = vec!["127.0.0.1:4150".into()];
/// config.max_attempts = 0; // the pipeline decides, never the consumer
/// let mut consumer = Consumer::new(config)?;
/// while let Some(message) = consumer.next().await {
///     let dedupe = dedupe.clone();
///     tokio::spawn(async move { dedupe.process(message).await });
/// }
/// # Ok(())
/// # }
/// ```
pub struct Dedupe<S, H> {
    inner: Arc<Inner<S, H>>,
}

impl<S, H> Clone for Dedupe<S, H> {
    fn clone(&self) -> Self {
        Dedupe {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S, H> {
    store: S,
    keyer: Keyer,
    handler: H,
    policy: Policy,
    dead_letter: Option<DeadLetter>,
    metrics: Arc<Metrics>,
    /// Which store errors are logged.
    store_error_log: StoreErrorLog,
    /// When each cause of handler failures was last logged.
    failure_log: FailureLog,
    /// Cancelled by [`Dedupe::abandon`]: running handlers are dropped and their claims erased.
    abandon: tokio_util::sync::CancellationToken,
    /// Records handed to the handler and not yet answered.
    handling: AtomicUsize,
    /// Commits and erases the store failed, sent again before the next burst's claims.
    unsettled: Unsettled,
    /// This process's originals in flight, and the copies that wait beside them.
    held: Held,
    /// Digests whose receiver asked for them later, and until when.
    deferred: Deferred,
}

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// A pipeline step over `store`, keying bodies with `keyer`, delivering to `handler`.
    pub fn new(
        store: S,
        keyer: Keyer,
        handler: H,
        policy: Policy,
        dead_letter: Option<DeadLetter>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Dedupe {
            inner: Arc::new(Inner {
                store,
                keyer,
                handler,
                dead_letter,
                metrics,
                store_error_log: StoreErrorLog::default(),
                failure_log: FailureLog::default(),
                abandon: tokio_util::sync::CancellationToken::new(),
                handling: AtomicUsize::new(0),
                unsettled: Unsettled::default(),
                held: Held::new(match policy.on_in_flight {
                    InFlightPolicy::Requeue => policy.max_held_copies,
                    InFlightPolicy::Finish => 0,
                }),
                deferred: Deferred::default(),
                policy,
            }),
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler
    }

    /// Records handed to the handler whose messages are not answered yet.
    pub fn handling(&self) -> usize {
        self.inner.handling.load(Ordering::Relaxed)
    }

    /// Copies held beside their original, to be answered when it settles.
    pub fn held_copies(&self) -> usize {
        self.inner.held.len()
    }

    /// Gives up on every running and future handler call: each is dropped, its claim erased
    /// (so that a redelivery is not held back as in flight until a lease expires) and its
    /// message requeued. For shutdown, after the grace period: the consumer has requeued
    /// those messages already.
    pub fn abandon(&self) {
        self.inner.abandon.cancel();
    }

    /// Decides one message and answers it (FIN or REQ) before returning. See the module docs.
    pub async fn process(&self, message: Message) -> Outcome {
        self.process_batch(vec![message])
            .await
            .pop()
            .unwrap_or(Outcome::Requeued)
    }

    /// Decides a burst of messages and answers every one (FIN or REQ) before returning; the
    /// outcomes are in the order of `messages`. See the module docs.
    pub async fn process_batch(&self, messages: Vec<Message>) -> Vec<Outcome> {
        count_received(&self.inner.metrics, &messages);
        self.decide_and_deliver(messages).await
    }

    /// Decides and delivers messages already counted as received: a burst, or the copies
    /// held beside an original that was not delivered.
    async fn decide_and_deliver(&self, messages: Vec<Message>) -> Vec<Outcome> {
        let mut outcomes = vec![Outcome::Requeued; messages.len()];
        let keyed = self.key(messages);
        let started = Instant::now();
        // Before the claims: an erase of an earlier claim that got no answer must not land
        // after this burst claims the same digest again.
        self.settle_unsettled().await;
        let decided = self.decide(keyed, started, &mut outcomes).await;
        // Copies are answered at once, not after the burst's records are handed on.
        self.answer(decided.answers);
        if decided.deliver.is_empty() {
            return outcomes;
        }
        let delivered = self.deliver_all(decided.deliver, decided.answered).await;
        for (index, outcome) in delivered {
            outcomes[index] = outcome;
        }
        outcomes
    }

    /// Whether copies in flight wait beside their original here: by policy, and not for a
    /// handler whose records are claimed done (their copies are duplicates at once).
    fn holds_copies(&self) -> bool {
        self.inner.held.is_enabled() && !self.inner.handler.accepts_for_good()
    }

    /// Counts one store error of `operation`, logging it as `store_errors` does.
    fn store_error(&self, operation: &'static str, error: &StoreError) {
        self.store_errors(operation, error, 1);
    }

    /// Counts `count` store errors of one failed call, and logs it when `store_error_log`
    /// lets it through (a new cause at once, then at most once an interval): the line's
    /// `errors` are the call's, its `suppressed` those not logged since the line before, so
    /// that the lines add up to `store_errors_total`.
    fn store_errors(&self, operation: &'static str, error: &StoreError, count: usize) {
        let inner = &*self.inner;
        add(&inner.metrics.store_errors, count);
        let now = inner.metrics.uptime();
        if let Some(suppressed) = inner.store_error_log.note(error, count as u64, now) {
            tracing::error!(operation, %error, errors = count, suppressed, policy = ?inner.policy.on_store_error, "Store error.");
        }
    }
}

/// A message of a burst on its way to the handler: its place in the burst, its claim's
/// digest (`None` when it has no claim: keyless, or delivered while the store fails), and
/// whether copies wait beside it.
struct Record {
    index: usize,
    message: Message,
    digest: Option<Digest>,
    /// The owner of its digest's entry in `held`, if copies wait beside it: it closes the
    /// entry when it settles.
    held_by: Option<held::Owner>,
}

/// Counts a burst's messages per nsqd (a burst usually comes from one).
fn count_received(metrics: &Metrics, messages: &[Message]) {
    let mut rest = messages;
    while let Some(first) = rest.first() {
        let source = first.nsqd_address();
        let run = rest
            .iter()
            .take_while(|m| m.nsqd_address() == source)
            .count();
        metrics.received_many(source, run);
        rest = &rest[run..];
    }
}

#[cfg(test)]
mod size_tests {
    use crate::dedup::backend::Backend;
    use crate::dedup::Store;

    fn size_of_output<A, Fut>(_: &impl Fn(A) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every burst is a spawned task whose future tokio copies when it spawns and completes
    /// it: at 6.6 KB (the Memcached store's and the network sinks' futures inlined) that copy
    /// was once the largest single cost of a task per message. Slow paths are boxed to keep it
    /// small.
    #[test]
    fn a_burst_task_stays_small() {
        let store = Backend::None(crate::NoStore);
        let d = crate::Digest::from_u128(1);
        assert!(std::mem::size_of_val(&store.claim(d)) <= 64);
        let dedupe = super::Dedupe::new(
            store,
            crate::Keyer::new(crate::KeySpec::Body, Default::default()),
            crate::sink::Sink::Null(crate::sink::NullSink),
            super::Policy::default(),
            None,
            Default::default(),
        );
        let process = |m: Vec<crate::nsq::Message>| {
            let dedupe = dedupe.clone();
            async move { dedupe.process_batch(m).await }
        };
        let size = size_of_output(&process);
        assert!(size <= 1536, "a burst's task future is {size} bytes");
    }
}
