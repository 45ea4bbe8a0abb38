//! The first steps of a burst: each message's key ([`Dedupe::key`]), then its claim and what
//! the claim decides ([`Dedupe::decide`]): a copy is answered at once, a copy of a message this
//! process is handling waits beside it (`held.rs`), a copy of a message deferred at its
//! receiver's request comes back later (`deferred.rs`), and a new message (or one the store
//! could not decide, by policy) goes on to the handler.

use std::time::Instant;

use super::{held, requeue, Dedupe, InFlightPolicy, Outcome, Record, StoreErrorPolicy};
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
                        held_by: None,
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
            keyless: deliver,
        } = keyed;
        let mut decided = Decided {
            answers: Vec::new(),
            deliver,
            answered: started,
        };
        let (claimed, digests) = self.defer(claimed, digests, &mut decided, outcomes);
        let unheld = self
            .claim_and_apply(claimed, digests, Some(started), &mut decided, outcomes)
            .await;
        if unheld.is_empty() {
            return decided;
        }
        // Copies found in flight that could not wait here: their original here settled
        // between their claim and now, or it is in flight elsewhere. One more claim tells
        // which; what is still in flight then is requeued.
        let (claimed, digests): (Vec<_>, Vec<_>) = unheld.into_iter().unzip();
        let unheld = self
            .claim_and_apply(claimed, digests, None, &mut decided, outcomes)
            .await;
        for ((index, message), _) in unheld {
            outcomes[index] = Outcome::InFlight;
            decided.answers.push((message, self.in_flight()));
        }
        decided
    }

    /// Joins the digests where copies are held (see `held.rs`), claims them and applies
    /// the claims; returns the copies in flight that could not be held. `started`, for the
    /// first claims of a burst, is when its store work began: the claims' latency is
    /// observed, and `decided.answered` set.
    async fn claim_and_apply(
        &self,
        claimed: Vec<(usize, Message)>,
        digests: Vec<Digest>,
        started: Option<Instant>,
        decided: &mut Decided,
        outcomes: &mut [Outcome],
    ) -> Vec<((usize, Message), Digest)> {
        // Before the claims: a copy whose claim comes after one of them finds the entry.
        let owner = match self.holds_copies() {
            true => Some(self.inner.held.join(&digests)),
            false => None,
        };
        let claims = self.claim(&digests).await;
        let (claimed, digests, claims) = self
            .defer_late(claimed, digests, claims, owner.is_some(), decided, outcomes)
            .await;
        // Before the answers: the consumer lowers RDY before the requeues free its window.
        self.tell_outage(&claimed, &claims).await;
        if let Some(started) = started {
            // One clock read ends the claim and starts the handler: at hundreds of thousands
            // of messages a second, reading the clock is a few percent of the work.
            decided.answered = Instant::now();
            if !digests.is_empty() {
                let ok = claims.iter().all(Result::is_ok);
                let metrics = &self.inner.metrics;
                metrics.store_answered(decided.answered - started, ok);
                if ok {
                    self.inner.store_error_log.answered(|| metrics.uptime());
                }
            }
        }
        self.apply(claimed, digests, owner, claims, decided, outcomes)
    }

    /// Takes out the messages whose digest is deferred at its receiver's request (see
    /// `deferred.rs`): each is requeued to come back when the deferral ends, without a
    /// claim. Returns the others, to claim.
    fn defer(
        &self,
        claimed: Vec<(usize, Message)>,
        digests: Vec<Digest>,
        decided: &mut Decided,
        outcomes: &mut [Outcome],
    ) -> (Vec<(usize, Message)>, Vec<Digest>) {
        let Some(remaining) = self.inner.deferred.remaining(&digests, Instant::now()) else {
            return (claimed, digests);
        };
        let mut kept = (
            Vec::with_capacity(claimed.len()),
            Vec::with_capacity(digests.len()),
        );
        for (((index, message), digest), remaining) in
            claimed.into_iter().zip(digests).zip(remaining)
        {
            match remaining {
                Some(delay) => {
                    inc(&self.inner.metrics.deferred_copies);
                    outcomes[index] = Outcome::InFlight;
                    decided.answers.push((message, requeue(Some(delay), false)));
                }
                None => {
                    kept.0.push((index, message));
                    kept.1.push(digest);
                }
            }
        }
        kept
    }

    /// Takes out the new claims whose digest was deferred after `defer` looked (its
    /// original's receiver asked for it later, and the original's claim was erased while
    /// this burst claimed): their claims are erased again and the messages requeued as
    /// `defer` would have. Returns the others, to apply.
    async fn defer_late(
        &self,
        claimed: Vec<(usize, Message)>,
        digests: Vec<Digest>,
        claims: Vec<Result<Claim, StoreError>>,
        holding: bool,
        decided: &mut Decided,
        outcomes: &mut [Outcome],
    ) -> (
        Vec<(usize, Message)>,
        Vec<Digest>,
        Vec<Result<Claim, StoreError>>,
    ) {
        let Some(remaining) = self.inner.deferred.remaining(&digests, Instant::now()) else {
            return (claimed, digests, claims);
        };
        let mut kept = (Vec::new(), Vec::new(), Vec::new());
        let mut erased = Vec::new();
        let entries = claimed.into_iter().zip(digests).zip(claims).zip(remaining);
        for ((((index, message), digest), claim), remaining) in entries {
            match (claim, remaining) {
                (Ok(Claim::New), Some(delay)) => {
                    if holding {
                        // Its entry was joined for this claim: left as a claim in flight.
                        self.leave(digest, &Ok(Claim::InFlight), decided);
                    }
                    inc(&self.inner.metrics.deferred_copies);
                    outcomes[index] = Outcome::InFlight;
                    decided.answers.push((message, requeue(Some(delay), false)));
                    erased.push(digest);
                }
                (claim, _) => {
                    kept.0.push((index, message));
                    kept.1.push(digest);
                    kept.2.push(claim);
                }
            }
        }
        let erases = self.erase_all(&erased).await;
        let failed = erases.iter().filter(|erase| erase.is_err()).count();
        if let Some(error) = erases.iter().find_map(|erase| erase.as_ref().err()) {
            // Each failed erase counted, as `settle` counts its own.
            self.store_errors("erase", error, failed);
            self.keep_unsettled(&[], &[], &erased, &erases);
        }
        kept
    }

    /// Decides each message by its claim: a new one goes on to the handler (its digest open
    /// for copies, if the claims have an owner in `held`), a copy is finished, a copy in
    /// flight here is held beside its original. A claim that was not new leaves its digest's
    /// entry, and copies held on an entry that ends so are answered as that claim says. Returns
    /// the copies in flight that were not held, with their digests, for the caller to decide.
    fn apply(
        &self,
        claimed: Vec<(usize, Message)>,
        digests: Vec<Digest>,
        owner: Option<held::Owner>,
        claims: Vec<Result<Claim, StoreError>>,
        decided: &mut Decided,
        outcomes: &mut [Outcome],
    ) -> Vec<((usize, Message), Digest)> {
        let inner = &*self.inner;
        let holding = owner.is_some();
        let mut unheld = Vec::new();
        let mut failed: Option<(StoreError, usize)> = None;
        // The new digests, opened together once every claim is applied: until then, the
        // claim of each still counts among its entry's claimers, so that no `leave` of a copy
        // in the same burst ends the entry meanwhile.
        let mut opened = Vec::new();
        let decisions = claimed.into_iter().zip(claims).zip(digests);
        for (((index, message), claim), digest) in decisions {
            if holding && !matches!(claim, Ok(Claim::New)) {
                self.leave(digest, &claim, decided);
            }
            match claim {
                Ok(Claim::New) => {
                    inc(&inner.metrics.unique);
                    if owner.is_some() {
                        opened.push(digest);
                    }
                    decided.deliver.push(Record {
                        index,
                        message,
                        digest: Some(digest),
                        held_by: owner,
                    });
                }
                Ok(Claim::Duplicate) => {
                    inc(&inner.metrics.duplicates);
                    outcomes[index] = Outcome::Duplicate;
                    decided.answers.push((message, Answer::Finish));
                }
                Ok(Claim::InFlight) if holding => match inner.held.hold(digest, message) {
                    Ok(()) => {
                        inc(&inner.metrics.copies_held);
                        outcomes[index] = Outcome::Held;
                    }
                    Err(message) => unheld.push(((index, message), digest)),
                },
                Ok(Claim::InFlight) => {
                    outcomes[index] = Outcome::InFlight;
                    decided.answers.push((message, self.in_flight()));
                }
                Err(error) => {
                    let answer = self.claim_failed(&error, digest, &message);
                    match &mut failed {
                        Some((_, count)) => *count += 1,
                        None => failed = Some((error, 1)),
                    }
                    match answer {
                        Some(answer) => decided.answers.push((message, answer)),
                        None => decided.deliver.push(Record {
                            index,
                            message,
                            digest: None,
                            held_by: None,
                        }),
                    }
                }
            }
        }
        if let Some(owner) = owner.filter(|_| !opened.is_empty()) {
            inner.held.open_many(&opened, owner);
        }
        if let Some((error, count)) = failed {
            self.store_errors("claim", &error, count);
        }
        unheld
    }

    /// Leaves `digest`, whose claim was not new: if that ends its entry, the copies held on
    /// it meanwhile are finished if the claim found a copy, else requeued as copies in flight
    /// elsewhere (it is not this process that delivers their content).
    fn leave(&self, digest: Digest, claim: &Result<Claim, StoreError>, decided: &mut Decided) {
        let copies = self.inner.held.leave(digest);
        if copies.is_empty() {
            return;
        }
        let metrics = &self.inner.metrics;
        for copy in copies {
            let answer = match claim {
                Ok(Claim::Duplicate) => {
                    inc(&metrics.duplicates);
                    Answer::Finish
                }
                _ => self.in_flight(),
            };
            decided.answers.push((copy, answer));
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
