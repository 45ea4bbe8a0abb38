//! The narrow interface a [`Message`](super::Message) calls back through when it is answered,
//! so that messages need not know the consumer (go-nsq's `MessageDelegate`).

use std::time::Duration;

/// What a message tells, and asks of, the consumer that delivered it.
pub(crate) trait MessageDelegate: Send + Sync {
    /// The delay of a `requeue(None)` on the given delivery.
    fn default_requeue_delay(&self, attempts: u16) -> Duration;
    /// An explicit requeue delay, capped as nsqd requires.
    fn clamp_requeue_delay(&self, delay: Duration) -> Duration;
    /// `count` FINs were queued: handler successes.
    fn on_finished(&self, count: u64);
    /// A REQ was queued; `backoff` when it counts as a handler failure.
    fn on_requeued(&self, backoff: bool);
    /// A message could not be handled for an outage of something its handler needs;
    /// `lowered` is dropped once RDY is set for it.
    fn on_outage(&self, lowered: tokio::sync::oneshot::Sender<()>);
    /// What the handler needs answered again for a message.
    fn on_outage_over(&self);
    /// A TOUCH was queued.
    fn on_touched(&self);
    /// A message of `conn` was set aside or taken back (see `Message::park`): its RDY is due
    /// again.
    fn on_parked(&self);
}

/// A consumer that does nothing, for the unit tests of messages and connections.
#[cfg(test)]
pub(crate) struct Nobody;

#[cfg(test)]
impl MessageDelegate for Nobody {
    fn default_requeue_delay(&self, _: u16) -> Duration {
        Duration::ZERO
    }
    fn clamp_requeue_delay(&self, delay: Duration) -> Duration {
        delay
    }
    fn on_finished(&self, _: u64) {}
    fn on_requeued(&self, _: bool) {}
    fn on_outage(&self, _: tokio::sync::oneshot::Sender<()>) {}
    fn on_outage_over(&self) {}
    fn on_touched(&self) {}
    fn on_parked(&self) {}
}
