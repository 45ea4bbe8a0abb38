//! The last step: FIN or REQ for each message, one queued write per connection for a burst
//! ([`Dedupe::answer`]); a record the handler failed for good goes to the dead-letter first.

use std::time::Duration;

use super::{Dedupe, Outcome, Record};
use crate::dedup::Store;
use crate::metrics::inc;
use crate::nsq::{Answer, Message};
use crate::sink::{Handler, HandlerError};

/// A REQ with `delay`; `backoff` when it counts as a handler failure.
pub(super) fn requeue(delay: Option<Duration>, backoff: bool) -> Answer {
    Answer::Requeue { delay, backoff }
}

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// Answers the messages of handled records: FIN for a delivered record, REQ with a
    /// growing delay for a failed one; a rejected record, or one failed on its
    /// `max_attempts`-th delivery, goes to the dead-letter.
    pub(super) async fn answer_results(
        &self,
        records: Vec<Record>,
        results: Vec<Result<(), HandlerError>>,
    ) -> Vec<(usize, Outcome)> {
        let inner = &*self.inner;
        let metrics = &*inner.metrics;
        let count = records.len();
        let mut outcomes = Vec::with_capacity(count);
        let mut answers = Vec::with_capacity(count);
        let mut undeliverable = Vec::new();
        for (record, result) in records.into_iter().zip(results) {
            let Record { index, message, .. } = record;
            match result {
                Ok(()) => {
                    inc(&metrics.handler_successes);
                    inner.failure_log.succeeded();
                    outcomes.push((index, Outcome::Delivered));
                    answers.push((message, Answer::Finish));
                }
                Err(HandlerError::Requeued { after }) => {
                    inc(&metrics.handler_requeues);
                    let delay = message.requeue_delay(Some(after));
                    tracing::debug!(id = %message.id(), delay_ms = delay.as_millis() as u64, "Requeued at its receiver's request.");
                    outcomes.push((index, Outcome::Requeued));
                    answers.push((message, requeue(Some(delay), false)));
                }
                Err(error) => {
                    inc(&metrics.handler_failures);
                    if self.gives_up(&message, &error) {
                        undeliverable.push((index, message, error));
                        continue;
                    }
                    inc(&metrics.retries);
                    let attempts = message.attempts();
                    let delay = self.retry_delay(&message, &error);
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

    /// Defers the digests whose receiver asked for their content later (see `deferred.rs`):
    /// a REQ from the receiver, or a failure that said when to come back. Called before the
    /// records' claims are erased, so that a copy claimed new after the erase finds the
    /// deferral (see `decide.rs`).
    pub(super) fn defer_requested(&self, records: &[Record], results: &[Result<(), HandlerError>]) {
        for (record, result) in records.iter().zip(results) {
            let (Some(digest), Err(error)) = (record.digest, result) else {
                continue;
            };
            let message = &record.message;
            let delay = match error {
                HandlerError::Requeued { after } => message.requeue_delay(Some(*after)),
                // A server that said when to come back gets the content no sooner, copies
                // included.
                error if error.retry_after().is_some() && !self.gives_up(message, error) => {
                    message.requeue_delay(Some(self.retry_delay(message, error)))
                }
                _ => continue,
            };
            self.inner.deferred.defer(digest, delay);
        }
    }

    /// Whether a failed record is undeliverable: rejected, or failed on its
    /// `max_attempts`-th delivery.
    fn gives_up(&self, message: &Message, error: &HandlerError) -> bool {
        let max_attempts = self.inner.policy.max_attempts;
        matches!(error, HandlerError::Reject(_))
            || (max_attempts > 0 && message.attempts() >= max_attempts)
    }

    /// The delay of a failed record's retry: the policy's, or later if the handler said when
    /// to come back. The consumer caps it at its `max_requeue_delay`, as nsqd does.
    fn retry_delay(&self, message: &Message, error: &HandlerError) -> Duration {
        self.inner
            .policy
            .retry_delay(message.attempts())
            .max(error.retry_after().unwrap_or_default())
    }

    /// Sends an undeliverable message to the dead-letter, and FINs it once the dead-letter
    /// accepted it; without a dead-letter, or when it refuses, the message is requeued.
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
    pub(super) fn answer(&self, answers: Vec<(Message, Answer)>) {
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
}
