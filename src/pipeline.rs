//! The de-duplicating pipeline: what happens to each message between nsqd and the handler.
//!
//! Messages move in bursts ([`Dedupe::process_batch`]; [`Dedupe::process`] is a burst of
//! one): the burst's digests are claimed in one call, every record to deliver is handed to
//! the handler at once ([`Handler::handle_batch`]), the pipeline waits once, commits what
//! succeeded, erases what failed, and answers the burst with one queued write per connection
//! ([`Message::answer_all`]). Each message still gets its own decision:
//!
//! 1. The key's digest is computed. A body without a key passes as unique (counted as
//!    `keyless`) and is delivered without touching the store.
//! 2. The digest is claimed in the store (two copies in one burst: the first is `New`, the
//!    second `InFlight`):
//!    - `Duplicate`: FIN. Nothing reaches the handler.
//!    - `InFlight`: another delivery of the same content is being handled. By default REQ with
//!      a short delay, so the copy is decided once the first one finishes
//!      ([`InFlightPolicy::Requeue`]); optionally FIN ([`InFlightPolicy::Finish`]), which is
//!      not safe when the "copy" is nsqd redelivering a message whose handler is still running.
//!    - `New`: the handler gets the body, with the burst's other records. While it runs, the
//!      messages are TOUCHed and the claims' leases renewed every `keepalive`. Success of its
//!      own record: `commit`, then FIN. Failure of its own record (a sink whose write is
//!      all-or-nothing fails the records of that write together): `erase`, then REQ of that
//!      message alone, with a delay that grows with the attempts; a rejection, or a failure on
//!      the `max_attempts`-th delivery, sends the message to the dead-letter and FINs it only
//!      once the dead-letter accepted it. Without a dead-letter it is requeued with the longest
//!      delay instead: never dropped. The cause of a failure is logged at WARN, at most once
//!      a second per cause (`pipeline/failure_log.rs`).
//! 3. A store error at claim follows [`StoreErrorPolicy`]: `Requeue` (REQ, decided later) or
//!    `Process` (delivered without de-duplication). Each message has its own claim: where a
//!    burst's sets live on several servers and one fails, only its messages take the policy.
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

mod store_error_log;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::dedup::digest::Keyer;
use crate::dedup::{Claim, Digest, Store};
use crate::error::StoreError;
use crate::metrics::{add, inc, Metrics};
use crate::nsq::{Answer, Message};
use crate::sink::{DeadLetter, Delivery, Handler, HandlerError};
use failure_log::FailureLog;
use store_error_log::StoreErrorLog;
use unsettled::Unsettled;

mod failure_log;
mod unsettled;

/// What to do with a copy whose original is still being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InFlightPolicy {
    /// REQ it with a short delay; it is decided once the original finished. The default.
    Requeue,
    /// FIN it at once. Loses the message if the "copy" was nsqd redelivering a message whose
    /// handler then fails.
    Finish,
}

impl InFlightPolicy {
    /// Every policy with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, InFlightPolicy); 2] = [
        ("requeue", InFlightPolicy::Requeue),
        ("finish", InFlightPolicy::Finish),
    ];
}

/// What to do with a message when the store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreErrorPolicy {
    /// REQ it and decide later: nothing lost, no extra duplicates. The default.
    Requeue,
    /// Deliver it without de-duplication: nothing lost, duplicates possible.
    Process,
}

impl StoreErrorPolicy {
    /// Every policy with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, StoreErrorPolicy); 2] = [
        ("requeue", StoreErrorPolicy::Requeue),
        ("process", StoreErrorPolicy::Process),
    ];
}

/// The pipeline's decisions. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Defaults to: [`InFlightPolicy::Requeue`].
    pub on_in_flight: InFlightPolicy,
    /// REQ delay of a copy found in flight. Defaults to: 1 s.
    pub in_flight_requeue_delay: Duration,
    /// Defaults to: [`StoreErrorPolicy::Requeue`].
    pub on_store_error: StoreErrorPolicy,
    /// REQ delay after a store error, times the attempts, capped at `max_backoff`.
    /// Defaults to: 1 s.
    pub store_error_requeue_delay: Duration,
    /// REQ delay after a handler failure, doubled per attempt, capped at `max_backoff`.
    /// Defaults to: 1 s.
    pub backoff: Duration,
    /// Longest REQ delay. Defaults to: 2 min.
    pub max_backoff: Duration,
    /// A handler failure on this delivery (or later) goes to the dead-letter. Defaults to: 5.
    pub max_attempts: u16,
    /// How often a running handler's message is TOUCHed and its claim renewed: keep it well
    /// under nsqd's message timeout and the store's lease. Defaults to: 30 s (half of NSQ's
    /// default 60 s timeout).
    pub keepalive: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            on_in_flight: InFlightPolicy::Requeue,
            in_flight_requeue_delay: Duration::from_secs(1),
            on_store_error: StoreErrorPolicy::Requeue,
            store_error_requeue_delay: Duration::from_secs(1),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(120),
            max_attempts: 5,
            keepalive: Duration::from_secs(30),
        }
    }
}

impl Policy {
    fn retry_delay(&self, attempts: u16) -> Duration {
        let doublings = u32::from(attempts.saturating_sub(1).min(20));
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }

    fn store_error_delay(&self, attempts: u16) -> Duration {
        self.store_error_requeue_delay
            .saturating_mul(u32::from(attempts.max(1)))
            .min(self.max_backoff)
    }
}

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered to the handler and finished.
    Delivered,
    /// A copy of something delivered before; finished.
    Duplicate,
    /// A copy of something being handled; requeued (or finished, by policy).
    InFlight,
    /// The handler failed; requeued for a retry.
    Retried,
    /// Accepted by the dead-letter and finished.
    DeadLettered,
    /// Could not be delivered nor dead-lettered (or the store failed): requeued.
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
}

/// Counts records as being handled for as long as it lives.
struct Handling<'a> {
    count: &'a AtomicUsize,
    records: usize,
}

impl<'a> Handling<'a> {
    fn new(count: &'a AtomicUsize, records: usize) -> Self {
        count.fetch_add(records, Ordering::Relaxed);
        Handling { count, records }
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.records, Ordering::Relaxed);
    }
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
                policy,
                dead_letter,
                metrics,
                store_error_log: StoreErrorLog::default(),
                failure_log: FailureLog::default(),
                abandon: tokio_util::sync::CancellationToken::new(),
                handling: AtomicUsize::new(0),
                unsettled: Unsettled::default(),
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
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        let mut outcomes = vec![Outcome::Requeued; messages.len()];
        count_received(metrics, &messages);
        let mut keyed = Vec::with_capacity(messages.len());
        let mut digests = Vec::with_capacity(messages.len());
        let mut deliver = Vec::new();
        for (index, message) in messages.into_iter().enumerate() {
            match inner.keyer.digest(message.body()) {
                Ok(digest) => {
                    digests.push(digest);
                    keyed.push((index, message));
                }
                Err(reason) => {
                    inc(&metrics.keyless);
                    tracing::debug!(id = %message.id(), %reason, "Body has no key; passed on as unique.");
                    deliver.push(Record {
                        index,
                        message,
                        digest: None,
                    });
                }
            }
        }
        let mut answers = Vec::new();
        let started = Instant::now();
        let claimed = !digests.is_empty();
        // Before the claims: an erase of an earlier claim that got no answer must not land
        // after this burst claims the same digest again.
        self.settle_unsettled().await;
        let claims = if claimed {
            inner.store.claim_many(&digests).await
        } else {
            Vec::new()
        };
        // One clock read ends the claim and starts the handler: at hundreds of thousands of
        // messages a second, reading the clock is a few percent of the work.
        let answered = Instant::now();
        let claims = if claims.len() == digests.len() {
            claims
        } else {
            let error = StoreError::Protocol(format!(
                "{} answers to {} claims",
                claims.len(),
                digests.len()
            ));
            vec![Err(error); digests.len()]
        };
        // Each message is decided by its own claim: where a burst's sets live on several
        // servers and one fails, the messages of the others go on as usual.
        let mut failed: Option<(StoreError, usize)> = None;
        for (((index, message), claim), digest) in keyed.into_iter().zip(claims).zip(digests) {
            match claim {
                Ok(Claim::Duplicate) => {
                    inc(&metrics.duplicates);
                    outcomes[index] = Outcome::Duplicate;
                    answers.push((message, Answer::Finish));
                }
                Ok(Claim::InFlight) => {
                    outcomes[index] = Outcome::InFlight;
                    let answer = match inner.policy.on_in_flight {
                        InFlightPolicy::Requeue => {
                            inc(&metrics.in_flight_requeues);
                            requeue(Some(inner.policy.in_flight_requeue_delay), false)
                        }
                        InFlightPolicy::Finish => {
                            inc(&metrics.in_flight_finished);
                            Answer::Finish
                        }
                    };
                    answers.push((message, answer));
                }
                Ok(Claim::New) => {
                    inc(&metrics.unique);
                    deliver.push(Record {
                        index,
                        message,
                        digest: Some(digest),
                    });
                }
                Err(error) => {
                    // The claim may have reached the store with its answer lost (a node that
                    // died mid-answer): such an entry would hold back every copy, this
                    // message's retry included, for a whole lease.
                    let unanswered = matches!(
                        error,
                        StoreError::Timeout(_) | StoreError::Unavailable { .. }
                    );
                    match &mut failed {
                        Some((_, count)) => *count += 1,
                        None => failed = Some((error, 1)),
                    }
                    match inner.policy.on_store_error {
                        StoreErrorPolicy::Requeue => {
                            if unanswered {
                                // Erased before a later burst claims it again (see
                                // `unsettled`).
                                inner.unsettled.keep(&[], &[digest]);
                            }
                            inc(&metrics.store_error_requeues);
                            let delay = inner.policy.store_error_delay(message.attempts());
                            answers.push((message, requeue(Some(delay), false)));
                        }
                        StoreErrorPolicy::Process => {
                            inc(&metrics.store_error_processed);
                            deliver.push(Record {
                                index,
                                message,
                                digest: None,
                            });
                        }
                    }
                }
            }
        }
        if claimed {
            metrics.store_answered(answered - started, failed.is_none());
        }
        if let Some((error, count)) = failed {
            self.store_errors("claim", &error, count);
        }
        // Copies are answered at once, not after the burst's records are handed on.
        self.answer(answers);
        if deliver.is_empty() {
            return outcomes;
        }
        // Keyless records came first: hand them on in arrival order.
        deliver.sort_unstable_by_key(|record| record.index);
        let delivered = if deliver.len() == 1 || inner.handler.handles_batches() {
            self.deliver(deliver, answered).await
        } else {
            // Each record on its own, all at once: one slow record holds back no other's
            // answer.
            let each = deliver
                .into_iter()
                .map(|record| self.deliver(vec![record], answered));
            futures::future::join_all(each)
                .await
                .into_iter()
                .flatten()
                .collect()
        };
        for (index, outcome) in delivered {
            outcomes[index] = outcome;
        }
        outcomes
    }

    /// Hands the records to the handler at once (keeping their messages and claims alive
    /// while it works), then commits or erases each record's claim and answers its message.
    /// `started` is now, as last read by the caller.
    async fn deliver(&self, records: Vec<Record>, started: Instant) -> Vec<(usize, Outcome)> {
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        let count = records.len();
        let _handling = Handling::new(&inner.handling, count);
        let mut outcomes = Vec::with_capacity(count);
        let deliveries = records.iter().map(|r| Delivery::of(&r.message)).collect();
        let results = {
            // A panicking handler is a failed delivery of the whole batch: its claims must be
            // erased, or the in-process table (which has no leases) would hold them in flight
            // for ever and requeue every redelivery as a copy.
            let handled = std::panic::AssertUnwindSafe(inner.handler.handle_deliveries(deliveries))
                .catch_unwind()
                .map(|outcome| {
                    outcome.unwrap_or_else(|panic| vec![crate::sink::panicked(panic); count])
                });
            tokio::pin!(handled);
            // Most handlers (stdout to a fast reader, null, in-memory work) finish on their
            // first poll or soon: only arm the keep-alive timer for those that do not.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(handled.as_mut(), cx))
            })
            .await;
            match first {
                std::task::Poll::Ready(results) => Some(results),
                std::task::Poll::Pending => Box::pin(self.keep_handling(handled, &records)).await,
            }
        };
        let Some(mut results) = results else {
            add(&metrics.abandoned, count);
            let digests: Vec<Digest> = records.iter().filter_map(|r| r.digest).collect();
            let erases = self.erase_all(&digests).await;
            self.keep_unsettled(&[], &[], &digests, &erases);
            for error in erases.into_iter().filter_map(Result::err) {
                self.store_error("erase", &error);
            }
            let answers = records
                .into_iter()
                .map(|r| {
                    outcomes.push((r.index, Outcome::Requeued));
                    (r.message, requeue(Some(Duration::ZERO), false))
                })
                .collect();
            self.answer(answers);
            return outcomes;
        };
        if results.len() != count {
            let error = HandlerError::Retry(format!(
                "the handler answered {} results for {count} records",
                results.len()
            ));
            results = vec![Err(error); count];
        }
        let handled = Instant::now();
        metrics
            .handler_duration
            .observe_many(handled - started, count as u64);
        // Claims of delivered records are committed and those of failed ones erased (before
        // the REQ, so the retry is not taken for a copy), all at once.
        let committed: Vec<Digest> = records
            .iter()
            .zip(&results)
            .filter(|(_, result)| result.is_ok())
            .filter_map(|(record, _)| record.digest)
            .collect();
        let erased: Vec<Digest> = records
            .iter()
            .zip(&results)
            .filter(|(_, result)| result.is_err())
            .filter_map(|(record, _)| record.digest)
            .collect();
        let (commits, erases) =
            futures::future::join(self.commit_all(&committed), self.erase_all(&erased)).await;
        if !committed.is_empty() || !erased.is_empty() {
            let ok = commits.iter().chain(&erases).all(Result::is_ok);
            metrics.store_answered(handled.elapsed(), ok);
            if !ok {
                self.keep_unsettled(&committed, &commits, &erased, &erases);
            }
        }
        for result in commits {
            // Delivered all the same: a later copy may be delivered again, but this message
            // is done.
            if let Err(error) = result {
                self.store_error("commit", &error);
            }
        }
        for result in erases {
            match result {
                Ok(true) => inc(&metrics.erased),
                Ok(false) => {}
                Err(error) => self.store_error("erase", &error),
            }
        }
        let mut answers = Vec::with_capacity(count);
        let mut undeliverable = Vec::new();
        for (record, result) in records.into_iter().zip(results) {
            let Record { index, message, .. } = record;
            match result {
                Ok(()) => {
                    inc(&metrics.handler_successes);
                    outcomes.push((index, Outcome::Delivered));
                    answers.push((message, Answer::Finish));
                }
                Err(error) => {
                    inc(&metrics.handler_failures);
                    let attempts = message.attempts();
                    let give_up = matches!(error, HandlerError::Reject(_))
                        || (inner.policy.max_attempts > 0 && attempts >= inner.policy.max_attempts);
                    if give_up {
                        undeliverable.push((index, message, error));
                        continue;
                    }
                    inc(&metrics.retries);
                    // The consumer caps the delay at its `max_requeue_delay`, as nsqd does.
                    let delay = inner
                        .policy
                        .retry_delay(attempts)
                        .max(error.retry_after().unwrap_or_default());
                    tracing::debug!(id = %message.id(), attempts, %error, delay_ms = delay.as_millis() as u64, "Handler failed; requeued.");
                    inner.failure_log.requeued(&error);
                    outcomes.push((index, Outcome::Retried));
                    answers.push((message, requeue(Some(delay), inner.handler.backs_off())));
                }
            }
        }
        self.answer(answers);
        for (index, message, error) in undeliverable {
            // Boxed: a rare path whose future (a publish) would otherwise enlarge every
            // burst's task.
            outcomes.push((index, Box::pin(self.dead_letter(message, &error)).await));
        }
        outcomes
    }

    /// Keeps the commits and erases that failed with a store error, to send them again with
    /// the next burst (see `unsettled`).
    fn keep_unsettled(
        &self,
        committed: &[Digest],
        commits: &[Result<bool, StoreError>],
        erased: &[Digest],
        erases: &[Result<bool, StoreError>],
    ) {
        let failed = |digests: &[Digest], answers: &[Result<bool, StoreError>]| -> Vec<Digest> {
            digests
                .iter()
                .zip(answers)
                .filter(|(_, answer)| answer.is_err())
                .map(|(digest, _)| *digest)
                .collect()
        };
        self.inner
            .unsettled
            .keep(&failed(committed, commits), &failed(erased, erases));
    }

    /// Sends again the commits and erases the store failed before; those that fail again are
    /// kept for the next burst. Their errors were counted when they first failed.
    async fn settle_unsettled(&self) {
        let writes = self.inner.unsettled.take();
        if writes.is_empty() {
            return;
        }
        let (commits, erases) = futures::future::join(
            self.commit_all(&writes.commits),
            self.erase_all(&writes.erases),
        )
        .await;
        self.keep_unsettled(&writes.commits, &commits, &writes.erases, &erases);
        tracing::debug!(
            commits = writes.commits.len(),
            erases = writes.erases.len(),
            still_unsettled = self.inner.unsettled.len(),
            "Sent failed store writes again."
        );
    }

    /// Commits each digest; the results are in the order of `digests`.
    async fn commit_all(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        if digests.is_empty() {
            return Vec::new();
        }
        self.inner.store.commit_many(digests).await
    }

    /// Erases each digest; the results are in the order of `digests`.
    async fn erase_all(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        if digests.is_empty() {
            return Vec::new();
        }
        self.inner.store.erase_many(digests).await
    }

    /// Waits for a handler that did not finish at once, TOUCHing its records' messages and
    /// renewing their claims every `keepalive`; `None` if abandoned at shutdown.
    async fn keep_handling<F>(
        &self,
        mut handled: std::pin::Pin<&mut F>,
        records: &[Record],
    ) -> Option<Vec<Result<(), HandlerError>>>
    where
        F: std::future::Future<Output = Vec<Result<(), HandlerError>>>,
    {
        let keepalive = self.inner.policy.keepalive;
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                result = &mut handled => return Some(result),
                _ = ticker.tick() => self.keep_alive(records).await,
                _ = self.inner.abandon.cancelled() => return None,
            }
        }
    }

    async fn keep_alive(&self, records: &[Record]) {
        let metrics = &*self.inner.metrics;
        for record in records {
            match record.message.touch() {
                Ok(()) => inc(&metrics.touches),
                Err(error) => {
                    inc(&metrics.answer_failures);
                    tracing::debug!(id = %record.message.id(), %error, "TOUCH failed; nsqd will redeliver the message.");
                }
            }
        }
        let digests: Vec<Digest> = records.iter().filter_map(|r| r.digest).collect();
        if digests.is_empty() {
            return;
        }
        let store = &self.inner.store;
        let t = Instant::now();
        let renewed =
            futures::future::join_all(digests.iter().map(|&digest| store.renew(digest))).await;
        metrics.store_answered(t.elapsed(), renewed.iter().all(Result::is_ok));
        for result in renewed {
            match result {
                Ok(true) => {}
                Ok(false) => inc(&metrics.renew_failures),
                Err(error) => {
                    inc(&metrics.renew_failures);
                    self.store_error("renew", &error);
                }
            }
        }
    }

    async fn dead_letter(&self, message: Message, error: &HandlerError) -> Outcome {
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        let reason = error.to_string();
        let Some(dead_letter) = &inner.dead_letter else {
            inc(&metrics.dead_letter_failures);
            tracing::warn!(id = %message.id(), attempts = message.attempts(), %reason, "Message undeliverable and no `dead_letter` is configured; requeued with the longest delay.");
            self.answered(message.requeue(Some(inner.policy.max_backoff)));
            return Outcome::Requeued;
        };
        let id = message.id().to_string();
        match dead_letter
            .accept(
                message.nsqd_address(),
                &id,
                message.attempts(),
                &reason,
                message.body(),
            )
            .await
        {
            Ok(()) => {
                inc(&metrics.dead_lettered);
                tracing::warn!(%id, attempts = message.attempts(), %reason, "Message sent to the dead-letter.");
                self.answered(message.finish());
                Outcome::DeadLettered
            }
            Err(dl_error) => {
                inc(&metrics.dead_letter_failures);
                tracing::error!(%id, error = %dl_error, "Dead-letter did not accept the message; requeued.");
                let delay = inner.policy.retry_delay(message.attempts());
                self.answered(message.requeue(Some(delay)));
                Outcome::Requeued
            }
        }
    }

    /// Answers every message of `answers` with one queued write per connection, counting
    /// the answers nsqd no longer takes.
    fn answer(&self, answers: Vec<(Message, Answer)>) {
        if answers.is_empty() {
            return;
        }
        for error in Message::answer_all(answers)
            .into_iter()
            .filter_map(Result::err)
        {
            self.answered(Err(error));
        }
    }

    /// Counts an answer nsqd no longer takes.
    fn answered(&self, result: Result<(), crate::nsq::Error>) {
        if let Err(error) = result {
            inc(&self.inner.metrics.answer_failures);
            tracing::debug!(%error, "nsqd did not take the answer; it will redeliver the message.");
        }
    }

    fn store_error(&self, operation: &'static str, error: &StoreError) {
        self.store_errors(operation, error, 1);
    }

    /// Counts `count` store errors of one failed call, logging it as `store_error` does.
    fn store_errors(&self, operation: &'static str, error: &StoreError, count: usize) {
        let inner = &*self.inner;
        add(&inner.metrics.store_errors, count);
        let now = inner.metrics.uptime();
        if let Some(suppressed) = inner.store_error_log.note(error, count as u64, now) {
            tracing::error!(operation, %error, suppressed, policy = ?inner.policy.on_store_error, "Store error.");
        }
    }
}

/// A message of a burst on its way to the handler: its place in the burst, and its claim's
/// digest (`None` when it has no claim: keyless, or delivered while the store fails).
struct Record {
    index: usize,
    message: Message,
    digest: Option<Digest>,
}

/// A REQ with `delay`; `backoff` when it counts as a handler failure.
fn requeue(delay: Option<Duration>, backoff: bool) -> Answer {
    Answer::Requeue { delay, backoff }
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
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_and_is_capped() {
        let p = Policy {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..Policy::default()
        };
        assert_eq!(p.retry_delay(1), Duration::from_millis(100));
        assert_eq!(p.retry_delay(2), Duration::from_millis(200));
        assert_eq!(p.retry_delay(4), Duration::from_millis(800));
        assert_eq!(p.retry_delay(5), Duration::from_secs(1));
        assert_eq!(p.retry_delay(u16::MAX), Duration::from_secs(1));
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
            crate::sink::Sink::Null,
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
