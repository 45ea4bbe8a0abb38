//! Hands a burst's records to the handler ([`Dedupe::deliver_all`], [`Dedupe::deliver`]),
//! keeping their messages and claims alive while it works, and settles each part of its answer
//! as it comes: commits or erases the claims, answers the copies held beside them and the
//! messages. Only the records not answered yet are kept alive, and requeued if the call is
//! abandoned at shutdown.

use std::pin::Pin;
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};

use super::handed::{Answered, Handed};
use super::{requeue, Dedupe, Outcome, Record};
use crate::dedup::{Digest, Store};
use crate::metrics::{add, inc};
use crate::nsq::Answer;
use crate::sink::{Delivery, Handler, HandlerError, Part};

/// A part of the handler's answer, or the panic that ended it.
type Caught = Result<Part, Box<dyn std::any::Any + Send>>;

/// What the wait for the handler's next part brought.
enum Next {
    Part(Part),
    Panicked(Box<dyn std::any::Any + Send>),
    /// The handler's answer ended.
    Ended,
    /// Abandoned at shutdown.
    Abandoned,
}

impl From<Option<Caught>> for Next {
    fn from(item: Option<Caught>) -> Self {
        match item {
            Some(Ok(part)) => Next::Part(part),
            Some(Err(panic)) => Next::Panicked(panic),
            None => Next::Ended,
        }
    }
}

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// Delivers a burst's records: in one handler call if the handler takes batches (or
    /// there is one record), else each in its own call, all at once, so one slow record
    /// holds back no other's answer. `started` is now, as last read by the caller.
    pub(super) async fn deliver_all(
        &self,
        mut records: Vec<Record>,
        started: Instant,
    ) -> Vec<(usize, Outcome)> {
        // Keyless records came first: hand them on in arrival order.
        records.sort_unstable_by_key(|record| record.index);
        if records.len() == 1 || self.inner.handler.handles_batches() {
            return self.deliver(records, started).await;
        }
        let each = records
            .into_iter()
            .map(|record| self.deliver(vec![record], started));
        futures::future::join_all(each)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Hands the records to the handler at once, then settles each part of its answer as it
    /// comes: each record's claim (commit or erase), the copies held beside it, and its
    /// message. `started` is now, as last read by the caller.
    async fn deliver(&self, records: Vec<Record>, started: Instant) -> Vec<(usize, Outcome)> {
        let inner = &*self.inner;
        let mut handed = Handed::new(&inner.held, &inner.handling, records);
        let deliveries = handed.unanswered().map(|r| Delivery::of(&r.message));
        // A panicking handler fails the records it had not answered: their claims must be
        // erased, or the in-process table (which has no leases) would hold them in flight for
        // ever and requeue every redelivery as a copy.
        let parts =
            std::panic::AssertUnwindSafe(inner.handler.handle_in_parts(deliveries.collect()))
                .catch_unwind();
        // Boxed: it lives beside each part's settling, and both inline would make every
        // burst's task larger than a box costs (`size_tests`).
        let mut parts = Box::pin(parts);
        let mut outcomes = Vec::with_capacity(handed.left());
        // The copies held beside records that were not delivered, decided again meanwhile.
        let mut again = FuturesUnordered::new();
        let mut ticker = None;
        while handed.left() > 0 {
            let next = self
                .next_part(parts.as_mut(), &handed, &mut ticker, &mut again)
                .await;
            let answered = match next {
                Next::Part(part) => handed.take(part),
                Next::Panicked(panic) => handed.fail_rest(&crate::sink::panicked(panic)),
                Next::Ended => handed.fail_rest(&Err(HandlerError::Retry(
                    "the handler answered no result for the record".into(),
                ))),
                Next::Abandoned => {
                    outcomes.extend(self.abandoned(handed.abandon()).await);
                    self.requeue_held(handed.close_all());
                    break;
                }
            };
            let count = answered.records.len();
            let (settled, copies) = self.settle_part(&mut handed, answered, started).await;
            handed.answered(count);
            outcomes.extend(settled);
            if !copies.is_empty() {
                // Boxed: a path of failures whose future would otherwise enlarge every burst's
                // task; beside the call, so the other records' parts are settled meanwhile.
                again.push(Box::pin(self.decide_and_deliver(copies)));
            }
        }
        while again.next().await.is_some() {}
        outcomes
    }

    /// Settles one part of the handler's answer: commits or erases the claims, then answers
    /// the copies held beside the records and the records' messages. The outcomes, and the
    /// copies to decide again.
    async fn settle_part(
        &self,
        handed: &mut Handed<'_>,
        answered: Answered,
        started: Instant,
    ) -> (Vec<(usize, Outcome)>, Vec<crate::nsq::Message>) {
        let handled = Instant::now();
        self.inner
            .metrics
            .handler_duration
            .observe_many(handled - started, answered.records.len() as u64);
        // Before the erases: a copy claimed new once its original's claim is erased finds
        // the deferral its receiver asked for.
        self.defer_requested(&answered.records, &answered.results);
        self.settle(&answered.records, &answered.results, handled)
            .await;
        // Settled: a copy decided again now finds its original's entry committed or erased.
        let again = self.answer_held(handed, &answered);
        let outcomes = self
            .answer_results(answered.records, answered.results)
            .await;
        (outcomes, again)
    }

    /// Answers the copies held beside the records, now that their claims are settled: a
    /// delivered record's copies are finished as copies; those of a record that was not
    /// delivered are returned, to be decided again (one of them is then delivered, unless
    /// the record's receiver asked for it later: see `deferred.rs`).
    fn answer_held(
        &self,
        handed: &mut Handed<'_>,
        answered: &Answered,
    ) -> Vec<crate::nsq::Message> {
        let mut finished = Vec::new();
        let mut again = Vec::new();
        if !handed.any_open() {
            return again;
        }
        let closed = handed.close_many(&answered.places);
        for (copies, result) in closed.into_iter().zip(&answered.results) {
            match result {
                Ok(()) => finished.extend(copies.into_iter().map(|c| (c, Answer::Finish))),
                Err(_) => again.extend(copies),
            }
        }
        add(&self.inner.metrics.duplicates, finished.len());
        self.answer(finished);
        again
    }

    /// Requeues copies whose original was abandoned at shutdown, as their original is.
    fn requeue_held(&self, copies: Vec<crate::nsq::Message>) {
        add(&self.inner.metrics.in_flight_requeues, copies.len());
        self.answer(
            copies
                .into_iter()
                .map(|c| (c, requeue(Some(std::time::Duration::ZERO), false)))
                .collect(),
        );
    }

    /// Waits for the handler's next part. A handler that did not answer at once gets its
    /// unanswered records' messages TOUCHed and claims renewed every `keepalive` from then on
    /// (`ticker`), while the copies decided `again` go on. A part that is ready (a handler
    /// that answers at once, or parts that came while the last one was settled) is taken
    /// without arming a timer.
    async fn next_part<P, A>(
        &self,
        mut parts: Pin<&mut P>,
        handed: &Handed<'_>,
        ticker: &mut Option<tokio::time::Interval>,
        again: &mut FuturesUnordered<A>,
    ) -> Next
    where
        P: Stream<Item = Caught>,
        A: std::future::Future<Output = Vec<Outcome>>,
    {
        // Most handlers (stdout to a fast reader, null, in-memory work) answer on their first
        // poll or soon: only arm the keep-alive timer for those that do not.
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(parts.as_mut().poll_next(cx))).await;
        if let std::task::Poll::Ready(item) = first {
            return Next::from(item);
        }
        let keepalive = self.inner.policy.keepalive;
        let ticker = ticker.get_or_insert_with(|| {
            let mut ticker =
                tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker
        });
        // Boxed: the path of handlers that take their time, whose future would otherwise
        // enlarge every burst's task.
        Box::pin(self.keep_handling(parts, handed, ticker, again)).await
    }

    /// Waits for the handler's next part, keeping the unanswered records alive every tick of
    /// `ticker`, while the copies decided `again` go on; abandoned at shutdown.
    async fn keep_handling<P, A>(
        &self,
        mut parts: Pin<&mut P>,
        handed: &Handed<'_>,
        ticker: &mut tokio::time::Interval,
        again: &mut FuturesUnordered<A>,
    ) -> Next
    where
        P: Stream<Item = Caught>,
        A: std::future::Future<Output = Vec<Outcome>>,
    {
        loop {
            tokio::select! {
                biased;
                item = parts.next() => return Next::from(item),
                _ = ticker.tick() => self.keep_alive(handed).await,
                _ = self.inner.abandon.cancelled() => return Next::Abandoned,
                Some(_) = again.next(), if !again.is_empty() => {}
            }
        }
    }

    /// Requeues the records of a handler call abandoned at shutdown, erasing their claims
    /// first.
    async fn abandoned(&self, records: Vec<Record>) -> Vec<(usize, Outcome)> {
        add(&self.inner.metrics.abandoned, records.len());
        let mut outcomes = Vec::with_capacity(records.len());
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
                (r.message, requeue(Some(std::time::Duration::ZERO), false))
            })
            .collect();
        self.answer(answers);
        outcomes
    }

    /// TOUCHes the messages of the records not answered yet and the copies held beside them,
    /// and renews their claims (those claimed done have no lease).
    async fn keep_alive(&self, handed: &Handed<'_>) {
        let metrics = &*self.inner.metrics;
        for record in handed.unanswered() {
            match record.message.touch() {
                Ok(()) => inc(&metrics.touches),
                Err(error) => {
                    inc(&metrics.answer_failures);
                    tracing::debug!(id = %record.message.id(), %error, "TOUCH failed; nsqd will redeliver the message.");
                }
            }
        }
        if self.inner.handler.accepts_for_good() {
            // Claimed done: no lease to renew, and no copy held.
            return;
        }
        let digests: Vec<Digest> = handed.unanswered().filter_map(|r| r.digest).collect();
        if digests.is_empty() {
            return;
        }
        let (touched, failed) = self.inner.held.touch(&digests);
        add(&metrics.touches, touched);
        add(&metrics.answer_failures, failed);
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
}
