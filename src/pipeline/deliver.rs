//! Hands a burst's records to the handler ([`Dedupe::deliver_all`], [`Dedupe::deliver`]),
//! keeping their messages and claims alive while it works, then settles their claims and
//! answers their messages.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::FutureExt;

use super::held::{Held, Owner};
use super::{requeue, Dedupe, Outcome, Record};
use crate::dedup::{Digest, Store};
use crate::metrics::{add, inc};
use crate::nsq::Answer;
use crate::sink::{Delivery, Handler, HandlerError};

/// The handler's result for each record of a call, in the records' order.
type Results = Vec<Result<(), HandlerError>>;

/// The digests the records opened in [`Held`], open for as long as it lives: whatever is not closed when
/// it drops (a handler call dropped mid-way) is closed then, and its copies, dropped, requeue
/// themselves.
struct Originals<'a> {
    held: &'a Held,
    open: Vec<(Digest, Owner)>,
}

impl<'a> Originals<'a> {
    /// The digests the records opened when they were claimed.
    fn new(held: &'a Held, records: &[Record]) -> Self {
        let open = records
            .iter()
            .filter_map(|r| Some((r.digest?, r.held_by?)))
            .collect();
        Originals { held, open }
    }

    /// Hands the closing of every digest to the caller, who closes each in turn; whether
    /// any was open.
    fn take(&mut self) -> bool {
        !std::mem::take(&mut self.open).is_empty()
    }

    /// Closes every digest still open: the copies held beside them.
    fn close_all(&mut self) -> Vec<crate::nsq::Message> {
        let held = self.held;
        self.open
            .drain(..)
            .flat_map(|(digest, owner)| held.close(digest, owner))
            .collect()
    }
}

impl Drop for Originals<'_> {
    fn drop(&mut self) {
        drop(self.close_all());
    }
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

    /// Hands the records to the handler at once, then settles each record's claim (commit
    /// or erase) and answers its message. `started` is now, as last read by the caller.
    async fn deliver(&self, records: Vec<Record>, started: Instant) -> Vec<(usize, Outcome)> {
        let count = records.len();
        let _handling = Handling::new(&self.inner.handling, count);
        let mut originals = Originals::new(&self.inner.held, &records);
        let Some(results) = self.handle(&records).await else {
            let outcomes = self.abandoned(records).await;
            self.requeue_held(originals.close_all());
            return outcomes;
        };
        let handled = Instant::now();
        self.inner
            .metrics
            .handler_duration
            .observe_many(handled - started, count as u64);
        self.settle(&records, &results, handled).await;
        // Settled: a copy decided again now finds its original's entry committed or erased.
        let again = self.answer_held(&mut originals, &records, &results);
        let outcomes = self.answer_results(records, results).await;
        if !again.is_empty() {
            // Boxed: a path of failures whose future would otherwise enlarge every burst's task.
            Box::pin(self.decide_and_deliver(again)).await;
        }
        outcomes
    }

    /// Answers the copies held beside the records, now that their claims are settled: a
    /// delivered record's copies are finished as copies; those of a record that was not
    /// delivered are returned, to be decided again (one of them is then delivered, unless
    /// the record's receiver asked for it later: see `deferred.rs`).
    fn answer_held(
        &self,
        originals: &mut Originals<'_>,
        records: &[Record],
        results: &Results,
    ) -> Vec<crate::nsq::Message> {
        let mut finished = Vec::new();
        let mut again = Vec::new();
        if !originals.take() {
            return again;
        }
        for (record, result) in records.iter().zip(results) {
            let (Some(digest), Some(owner)) = (record.digest, record.held_by) else {
                continue;
            };
            let copies = self.inner.held.close(digest, owner);
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

    /// Calls the handler, keeping the records' messages and claims alive while it works;
    /// one result per record, or `None` if abandoned at shutdown.
    async fn handle(&self, records: &[Record]) -> Option<Results> {
        let count = records.len();
        let deliveries = records.iter().map(|r| Delivery::of(&r.message)).collect();
        // A panicking handler is a failed delivery of the whole batch: its claims must be
        // erased, or the in-process table (which has no leases) would hold them in flight
        // for ever and requeue every redelivery as a copy.
        let handled =
            std::panic::AssertUnwindSafe(self.inner.handler.handle_deliveries(deliveries))
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
        let results = match first {
            std::task::Poll::Ready(results) => results,
            std::task::Poll::Pending => Box::pin(self.keep_handling(handled, records)).await?,
        };
        if results.len() == count {
            return Some(results);
        }
        let error = HandlerError::Retry(format!(
            "the handler answered {} results for {count} records",
            results.len()
        ));
        Some(vec![Err(error); count])
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

    /// Waits for a handler that did not finish at once, TOUCHing its records' messages and
    /// renewing their claims every `keepalive`; `None` if abandoned at shutdown.
    async fn keep_handling<F>(
        &self,
        mut handled: std::pin::Pin<&mut F>,
        records: &[Record],
    ) -> Option<Results>
    where
        F: std::future::Future<Output = Results>,
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

    /// TOUCHes the records' messages and the copies held beside them, and renews their
    /// claims (those claimed done have no lease).
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
        if self.inner.handler.accepts_for_good() {
            // Claimed done: no lease to renew, and no copy held.
            return;
        }
        let digests: Vec<Digest> = records.iter().filter_map(|r| r.digest).collect();
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
