//! The de-duplicating pipeline: what happens to each message between nsqd and the handler.
//!
//! Per message ([`Dedupe::process`]):
//!
//! 1. The key's digest is computed. A body without a key passes as unique (counted as
//!    `keyless`) and is delivered without touching the store.
//! 2. The digest is claimed in the store:
//!    - `Duplicate`: FIN. Nothing reaches the handler.
//!    - `InFlight`: another delivery of the same content is being handled. By default REQ with
//!      a short delay, so the copy is decided once the first one finishes
//!      ([`InFlightPolicy::Requeue`]); optionally FIN ([`InFlightPolicy::Finish`]), which is
//!      not safe when the "copy" is nsqd redelivering a message whose handler is still running.
//!    - `New`: the handler gets the body. While it runs, the message is TOUCHed and the claim's
//!      lease renewed every `keepalive`. Success: `commit`, then FIN. Failure: `erase`, then
//!      REQ with a delay that grows with the attempts; a rejection, or a failure on the
//!      `max_attempts`-th delivery, sends the message to the dead-letter and FINs it only once
//!      the dead-letter accepted it. Without a dead-letter it is requeued with the longest
//!      delay instead: never dropped.
//! 3. A store error at claim follows [`StoreErrorPolicy`]: `Requeue` (REQ, decided later) or
//!    `Process` (delivered without de-duplication). Errors of `commit`, `erase` and `renew` are
//!    counted and logged, and the message goes on: a stale claim only delays or duplicates a
//!    later copy, it never drops one. The first store error is logged, then at most one a
//!    `STORE_ERROR_LOG_INTERVAL`, with the count of those not logged; every one is counted.
//!
//! Whatever nsqd no longer accepts (a FIN for a message that timed out) is counted as an
//! answer failure: nsqd redelivers that message, and the store decides it again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt};

use crate::dedup::digest::Keyer;
use crate::dedup::{Claim, Digest, Store};
use crate::error::StoreError;
use crate::metrics::{inc, Metrics};
use crate::nsq::Message;
use crate::sink::{DeadLetter, Handler, HandlerError};

/// How often store errors are logged at most, after the first.
const STORE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

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
/// Cheap to clone (an `Arc`); process each message in its own task.
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
    /// Milliseconds since `metrics`' start of the last logged store error, plus one (0: none).
    store_error_logged_at: AtomicU64,
    /// Store errors not logged since the last one that was.
    store_errors_unlogged: AtomicU64,
    /// Cancelled by [`Dedupe::abandon`]: running handlers are dropped and their claims erased.
    abandon: tokio_util::sync::CancellationToken,
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
                store_error_logged_at: AtomicU64::new(0),
                store_errors_unlogged: AtomicU64::new(0),
                abandon: tokio_util::sync::CancellationToken::new(),
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

    /// Gives up on every running and future handler call: each is dropped, its claim erased
    /// (so that a redelivery is not held back as in flight until a lease expires) and its
    /// message requeued. For shutdown, after the grace period: the consumer has requeued
    /// those messages already.
    pub fn abandon(&self) {
        self.inner.abandon.cancel();
    }

    /// Decides one message and answers it (FIN or REQ) before returning. See the module docs.
    pub async fn process(&self, message: Message) -> Outcome {
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        metrics.received_from(message.nsqd_address());
        let digest = match inner.keyer.digest(message.body()) {
            Ok(digest) => digest,
            Err(reason) => {
                inc(&metrics.keyless);
                tracing::debug!(id = %message.id(), %reason, "Body has no key; passed on as unique.");
                return self.deliver(message, None, Instant::now()).await;
            }
        };
        let started = Instant::now();
        let claim = inner.store.claim(digest).await;
        // One clock read ends the claim and starts the handler: at hundreds of thousands of
        // messages a second, reading the clock is a few percent of the work.
        let answered = Instant::now();
        metrics.store_answered(answered - started, claim.is_ok());
        match claim {
            Ok(Claim::Duplicate) => {
                inc(&metrics.duplicates);
                self.answer(message.finish());
                Outcome::Duplicate
            }
            Ok(Claim::InFlight) => {
                match inner.policy.on_in_flight {
                    InFlightPolicy::Requeue => {
                        inc(&metrics.in_flight_requeues);
                        let delay = inner.policy.in_flight_requeue_delay;
                        self.answer(message.requeue_without_backoff(Some(delay)));
                    }
                    InFlightPolicy::Finish => {
                        inc(&metrics.in_flight_finished);
                        self.answer(message.finish());
                    }
                }
                Outcome::InFlight
            }
            Ok(Claim::New) => {
                inc(&metrics.unique);
                self.deliver(message, Some(digest), answered).await
            }
            Err(error) => {
                self.store_error("claim", &error);
                match inner.policy.on_store_error {
                    StoreErrorPolicy::Requeue => {
                        inc(&metrics.store_error_requeues);
                        let delay = inner.policy.store_error_delay(message.attempts());
                        self.answer(message.requeue_without_backoff(Some(delay)));
                        Outcome::Requeued
                    }
                    StoreErrorPolicy::Process => {
                        inc(&metrics.store_error_processed);
                        self.deliver(message, None, answered).await
                    }
                }
            }
        }
    }

    /// Runs the handler (keeping the message and the claim alive), then answers. `started` is
    /// now, as last read by the caller.
    async fn deliver(&self, message: Message, digest: Option<Digest>, started: Instant) -> Outcome {
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        let result = {
            // A panicking handler is a failed delivery: its claim must be erased, or the
            // in-process table (which has no leases) would hold it in flight for ever and
            // requeue every redelivery as a copy.
            let handled =
                std::panic::AssertUnwindSafe(inner.handler.handle(message.body().clone()))
                    .catch_unwind()
                    .map(|outcome| {
                        outcome.unwrap_or_else(|panic| {
                            let what = panic
                                .downcast_ref::<&str>()
                                .map(|s| (*s).to_owned())
                                .or_else(|| panic.downcast_ref::<String>().cloned())
                                .unwrap_or_default();
                            Err(HandlerError::Retry(format!("handler panicked: {what}")))
                        })
                    });
            tokio::pin!(handled);
            // Most handlers (stdout, null, in-memory work) finish on their first poll: only
            // arm the keep-alive timer for those that do not.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(handled.as_mut(), cx))
            })
            .await;
            match first {
                std::task::Poll::Ready(result) => Some(result),
                // Boxed, like the other slow paths, to keep every message's task small.
                std::task::Poll::Pending => {
                    Box::pin(self.keep_handling(handled, &message, digest)).await
                }
            }
        };
        let Some(result) = result else {
            inc(&metrics.abandoned);
            if let Some(digest) = digest {
                if let Err(error) = inner.store.erase(digest).await {
                    self.store_error("erase", &error);
                }
            }
            self.answer(message.requeue_without_backoff(Some(Duration::ZERO)));
            return Outcome::Requeued;
        };
        let handled = Instant::now();
        metrics.handler_duration.observe(handled - started);
        match result {
            Ok(()) => {
                inc(&metrics.handler_successes);
                if let Some(digest) = digest {
                    let committed = inner.store.commit(digest).await;
                    metrics.store_answered(handled.elapsed(), committed.is_ok());
                    if let Err(error) = committed {
                        // Delivered all the same: a later copy may be delivered again, but
                        // this message is done.
                        self.store_error("commit", &error);
                    }
                }
                self.answer(message.finish());
                Outcome::Delivered
            }
            Err(error) => {
                inc(&metrics.handler_failures);
                if let Some(digest) = digest {
                    // Erase before the REQ, so the retry is not taken for a copy.
                    let erased = inner.store.erase(digest).await;
                    metrics.store_answered(handled.elapsed(), erased.is_ok());
                    match erased {
                        Ok(true) => inc(&metrics.erased),
                        Ok(false) => {}
                        Err(error) => self.store_error("erase", &error),
                    }
                }
                let attempts = message.attempts();
                let give_up = matches!(error, HandlerError::Reject(_))
                    || (inner.policy.max_attempts > 0 && attempts >= inner.policy.max_attempts);
                if give_up {
                    // Boxed: a rare path whose future (a publish) would otherwise enlarge
                    // every message's task.
                    return Box::pin(self.dead_letter(message, &error)).await;
                }
                inc(&metrics.retries);
                let delay = inner.policy.retry_delay(attempts);
                tracing::debug!(id = %message.id(), attempts, %error, delay_ms = delay.as_millis() as u64, "Handler failed; requeued.");
                self.answer(message.requeue(Some(delay)));
                Outcome::Retried
            }
        }
    }

    /// Waits for a handler that did not finish at once, TOUCHing the message and renewing its
    /// claim every `keepalive`; `None` if abandoned at shutdown.
    async fn keep_handling<F>(
        &self,
        mut handled: std::pin::Pin<&mut F>,
        message: &Message,
        digest: Option<Digest>,
    ) -> Option<Result<(), HandlerError>>
    where
        F: std::future::Future<Output = Result<(), HandlerError>>,
    {
        let keepalive = self.inner.policy.keepalive;
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                result = &mut handled => return Some(result),
                _ = ticker.tick() => self.keep_alive(message, digest).await,
                _ = self.inner.abandon.cancelled() => return None,
            }
        }
    }

    async fn keep_alive(&self, message: &Message, digest: Option<Digest>) {
        let metrics = &*self.inner.metrics;
        match message.touch() {
            Ok(()) => inc(&metrics.touches),
            Err(error) => {
                inc(&metrics.answer_failures);
                tracing::debug!(id = %message.id(), %error, "TOUCH failed; nsqd will redeliver the message.");
            }
        }
        if let Some(digest) = digest {
            let t = Instant::now();
            let renewed = self.inner.store.renew(digest).await;
            metrics.store_answered(t.elapsed(), renewed.is_ok());
            match renewed {
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
            self.answer(message.requeue(Some(inner.policy.max_backoff)));
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
                self.answer(message.finish());
                Outcome::DeadLettered
            }
            Err(dl_error) => {
                inc(&metrics.dead_letter_failures);
                tracing::error!(%id, error = %dl_error, "Dead-letter did not accept the message; requeued.");
                let delay = inner.policy.retry_delay(message.attempts());
                self.answer(message.requeue(Some(delay)));
                Outcome::Requeued
            }
        }
    }

    fn answer(&self, result: Result<(), crate::nsq::Error>) {
        if let Err(error) = result {
            inc(&self.inner.metrics.answer_failures);
            tracing::debug!(%error, "nsqd did not take the answer; it will redeliver the message.");
        }
    }

    fn store_error(&self, operation: &'static str, error: &StoreError) {
        let inner = &*self.inner;
        inc(&inner.metrics.store_errors);
        let now = inner.metrics.uptime().as_millis() as u64 + 1;
        let last = inner.store_error_logged_at.load(Ordering::Relaxed);
        let due =
            last == 0 || now.saturating_sub(last) >= STORE_ERROR_LOG_INTERVAL.as_millis() as u64;
        if due
            && inner
                .store_error_logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = inner.store_errors_unlogged.swap(0, Ordering::Relaxed);
            tracing::error!(operation, %error, suppressed, policy = ?inner.policy.on_store_error, "Store error.");
        } else {
            inner.store_errors_unlogged.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Filters a stream of records: yields each record whose key was not seen before, drops the
/// copies. Keyless records, and records met while the store fails, are yielded (nothing is
/// lost; a store error may let a copy through). A record whose key another consumer of a
/// shared store is handling right now (`InFlight`) counts as a copy.
///
/// Claims are committed at once: a plain stream has no acknowledgement to wait for.
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use futures::StreamExt;
/// use nsq_dedupe::{pipeline::filter_stream, Keyer, Table};
///
/// # tokio_test_block_on(async {
/// let table = std::sync::Arc::new(Table::with_slots(1024, 8).unwrap());
/// let records = futures::stream::iter(["a", "b", "a", "c", "b"].map(Bytes::from));
/// let unique: Vec<Bytes> = filter_stream(table, Keyer::new("body".parse().unwrap(), Default::default()), records)
///     .collect()
///     .await;
/// assert_eq!(unique, ["a", "b", "c"].map(Bytes::from));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub fn filter_stream<S, R>(store: Arc<S>, keyer: Keyer, records: R) -> impl Stream<Item = Bytes>
where
    S: Store + 'static,
    R: Stream<Item = Bytes>,
{
    let keyer = Arc::new(keyer);
    records.filter_map(move |record| {
        let store = store.clone();
        let keyer = keyer.clone();
        async move {
            let Ok(digest) = keyer.digest(&record) else {
                return Some(record);
            };
            match store.claim(digest).await {
                Ok(Claim::New) => {
                    let _ = store.commit(digest).await;
                    Some(record)
                }
                Ok(Claim::Duplicate | Claim::InFlight) => None,
                Err(_) => Some(record),
            }
        }
    })
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

    /// Every message is a spawned task whose future tokio copies when it spawns and completes
    /// it: at 6.6 KB (the Memcached store's and the network sinks' futures inlined) that copy
    /// was the largest single cost of the whole pipeline. Slow paths are boxed to keep it small.
    #[test]
    fn a_message_task_stays_small() {
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
        let process = |m: crate::nsq::Message| {
            let dedupe = dedupe.clone();
            async move { dedupe.process(m).await }
        };
        let size = size_of_output(&process);
        assert!(size <= 1536, "a message's task future is {size} bytes");
    }
}
