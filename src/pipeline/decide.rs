//! The first steps of a burst: each message's key ([`Dedupe::key`]), then its claim and what
//! the claim decides ([`Dedupe::decide`]): a copy is answered at once, a new message (or one
//! the store could not decide, by policy) goes on to the handler.

use std::time::Instant;

use super::{requeue, Dedupe, InFlightPolicy, Outcome, Record, StoreErrorPolicy};
use crate::dedup::{Claim, Digest, Store};
use crate::error::StoreError;
use crate::metrics::inc;
use crate::nsq::{Answer, Message};
use crate::sink::Handler;

/// A burst's messages by key: those with one, to claim, and the keyless, to deliver.
pub(super) struct Keyed {
    /// Messages with a key, with their place in the burst.
    claimed: Vec<(usize, Message)>,
    /// Their digests, in the same order.
    digests: Vec<Digest>,
    /// The keyless, passed on as unique.
    keyless: Vec<Record>,
}

/// What the claims decided.
pub(super) struct Decided {
    /// The answers of copies (and of messages requeued on a store error).
    pub(super) answers: Vec<(Message, Answer)>,
    /// The records for the handler, keyless ones first.
    pub(super) deliver: Vec<Record>,
    /// When the store answered the claims.
    pub(super) answered: Instant,
}

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// Computes each message's digest. A body without a key passes as unique (counted as
    /// `keyless`) and is delivered without touching the store.
    pub(super) fn key(&self, messages: Vec<Message>) -> Keyed {
        let inner = &*self.inner;
        let mut claimed = Vec::with_capacity(messages.len());
        let mut digests = Vec::with_capacity(messages.len());
        let mut keyless = Vec::new();
        for (index, message) in messages.into_iter().enumerate() {
            match inner.keyer.digest(message.body()) {
                Ok(digest) => {
                    digests.push(digest);
                    claimed.push((index, message));
                }
                Err(reason) => {
                    inc(&inner.metrics.keyless);
                    tracing::debug!(id = %message.id(), %reason, "Body has no key; passed on as unique.");
                    keyless.push(Record {
                        index,
                        message,
                        digest: None,
                    });
                }
            }
        }
        Keyed {
            claimed,
            digests,
            keyless,
        }
    }

    /// Claims the keyed messages' digests in one call and decides each message by its own
    /// claim: where a burst's sets live on several servers and one fails, the messages of the
    /// others go on as usual. `started` is when the burst's store work began; `outcomes`
    /// gets the copies' outcomes.
    pub(super) async fn decide(
        &self,
        keyed: Keyed,
        started: Instant,
        outcomes: &mut [Outcome],
    ) -> Decided {
        let Keyed {
            claimed,
            digests,
            keyless: mut deliver,
        } = keyed;
        let claims = self.claim(&digests).await;
        // One clock read ends the claim and starts the handler: at hundreds of thousands of
        // messages a second, reading the clock is a few percent of the work.
        let answered = Instant::now();
        let mut answers = Vec::new();
        let mut failed: Option<(StoreError, usize)> = None;
        let any_claimed = !digests.is_empty();
        for (((index, message), claim), digest) in claimed.into_iter().zip(claims).zip(digests) {
            match claim {
                Ok(Claim::New) => {
                    inc(&self.inner.metrics.unique);
                    deliver.push(Record {
                        index,
                        message,
                        digest: Some(digest),
                    });
                }
                Ok(Claim::Duplicate) => {
                    inc(&self.inner.metrics.duplicates);
                    outcomes[index] = Outcome::Duplicate;
                    answers.push((message, Answer::Finish));
                }
                Ok(Claim::InFlight) => {
                    outcomes[index] = Outcome::InFlight;
                    answers.push((message, self.in_flight()));
                }
                Err(error) => {
                    let answer = self.claim_failed(&error, digest, &message);
                    match &mut failed {
                        Some((_, count)) => *count += 1,
                        None => failed = Some((error, 1)),
                    }
                    match answer {
                        Some(answer) => answers.push((message, answer)),
                        None => deliver.push(Record {
                            index,
                            message,
                            digest: None,
                        }),
                    }
                }
            }
        }
        if any_claimed {
            let metrics = &self.inner.metrics;
            metrics.store_answered(answered - started, failed.is_none());
            if failed.is_none() {
                self.inner.store_error_log.answered(|| metrics.uptime());
            }
        }
        if let Some((error, count)) = failed {
            self.store_errors("claim", &error, count);
        }
        Decided {
            answers,
            deliver,
            answered,
        }
    }

    /// Claims every digest, a store error for each when the store answers a different
    /// number of claims. For a handler whose accepted message is final, the new digests are
    /// recorded done at once (no lease, and no commit follows: see `settle`).
    async fn claim(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        if digests.is_empty() {
            return Vec::new();
        }
        let store = &self.inner.store;
        let claims = if self.inner.handler.accepts_for_good() {
            store.claim_done_many(digests).await
        } else {
            store.claim_many(digests).await
        };
        if claims.len() == digests.len() {
            return claims;
        }
        let error = StoreError::Protocol(format!(
            "{} answers to {} claims",
            claims.len(),
            digests.len()
        ));
        vec![Err(error); digests.len()]
    }

    /// The answer to a copy whose original is being handled: REQ with a short delay, so
    /// the copy is decided once the original finishes, or FIN, by policy.
    fn in_flight(&self) -> Answer {
        let inner = &*self.inner;
        match inner.policy.on_in_flight {
            InFlightPolicy::Requeue => {
                inc(&inner.metrics.in_flight_requeues);
                requeue(Some(inner.policy.in_flight_requeue_delay), false)
            }
            InFlightPolicy::Finish => {
                inc(&inner.metrics.in_flight_finished);
                Answer::Finish
            }
        }
    }

    /// What `on_store_error` makes of a message whose claim failed: its answer (REQ), or
    /// `None` to deliver it without de-duplication.
    fn claim_failed(
        &self,
        error: &StoreError,
        digest: Digest,
        message: &Message,
    ) -> Option<Answer> {
        let inner = &*self.inner;
        match inner.policy.on_store_error {
            StoreErrorPolicy::Requeue => {
                // The claim may have reached the store with its answer lost (a node that
                // died mid-answer): such an entry would hold back every copy, this
                // message's retry included, for a whole lease. It is erased before a later
                // burst claims it again (see `unsettled`).
                if matches!(
                    error,
                    StoreError::Timeout(_) | StoreError::Unavailable { .. }
                ) {
                    inner.unsettled.keep(&[], &[digest]);
                }
                inc(&inner.metrics.store_error_requeues);
                let delay = inner.policy.store_error_delay(message.attempts());
                Some(requeue(Some(delay), false))
            }
            StoreErrorPolicy::Process => {
                inc(&inner.metrics.store_error_processed);
                None
            }
        }
    }
}
