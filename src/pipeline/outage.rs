//! Tells the consumer when the store cannot decide a burst, so that it backs off instead of
//! taking message after message only to requeue each one ([`Message::outage`]), and when the
//! store decides again, so that it takes messages at full speed at once
//! ([`Message::outage_over`]).
//!
//! A store that is down fails a claim in microseconds (a refused connection): without this,
//! every message nsqd has is requeued and comes back as soon as its delay ends, thousands a
//! second, for as long as the outage lasts. With it, the messages in flight when the store
//! failed are requeued, then nsqd sends nothing (RDY 0) but one message now and then, whose
//! claim tests the store.
//!
//! A burst is an outage when its claims failed (by a cause other than contention on a set,
//! which is load, not an outage) and none was answered `New` or `InFlight`; the store is
//! answering again when one was. Only the store answers those two: a near-table in front of
//! it answers `Duplicate` alone (a copy of a digest this process committed), even while the
//! store is down. A burst whose claims partly fail and partly are new is one server of
//! several down: its requeues are as many as the messages on that server, and the others go
//! on at full speed. With `on_store_error = "process"` nothing is requeued for a store error,
//! and nothing backs off.

use super::{Dedupe, StoreErrorPolicy};
use crate::dedup::{Claim, Store};
use crate::error::StoreError;
use crate::nsq::Message;
use crate::sink::Handler;

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// Tells the consumer of `claimed`'s messages what the claims say of the store, and, for
    /// an outage, waits until it has lowered RDY, so that the burst's requeues make no room
    /// for more messages. A burst comes from one connection, so one message tells its
    /// consumer.
    pub(super) async fn tell_outage(
        &self,
        claimed: &[(usize, Message)],
        claims: &[Result<Claim, StoreError>],
    ) {
        let Some((_, message)) = claimed.first() else {
            return;
        };
        let mut failed = false;
        for claim in claims {
            match claim {
                Ok(Claim::New | Claim::InFlight) => return message.outage_over(),
                Ok(Claim::Duplicate) | Err(StoreError::Contended { .. }) => {}
                Err(_) => failed = true,
            }
        }
        if failed && self.inner.policy.on_store_error == StoreErrorPolicy::Requeue {
            message.outage().await;
        }
    }
}
