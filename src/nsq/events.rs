//! What the consumer reports: its events ([`ConsumerEvent`]), counters ([`ConsumerStats`]) and
//! what a shutdown did ([`ShutdownReport`]).

use std::time::Duration;

/// Something that happened to the consumer, for logs, metrics and tests. New kinds of event
/// may be added: a `match` on it needs a catch-all arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// A connection was established and subscribed.
    Connected {
        /// The nsqd address.
        addr: String,
    },
    /// A connection ended; `in_flight` messages on it will be redelivered by nsqd.
    Disconnected {
        /// The nsqd address.
        addr: String,
        /// Why.
        error: String,
        /// Messages that were unanswered when it ended.
        in_flight: usize,
    },
    /// Connecting failed.
    ConnectFailed {
        /// The nsqd address.
        addr: String,
        /// Why.
        error: String,
    },
    /// nsqd refused this client in a way no retry changes; the consumer stopped reconnecting
    /// to it. See [`Consumer::refused`](super::Consumer::refused).
    Refused {
        /// The nsqd address.
        addr: String,
        /// nsqd's answer and the setting to change.
        error: String,
    },
    /// A reconnect is scheduled.
    ReconnectScheduled {
        /// The nsqd address.
        addr: String,
        /// Failed attempts so far.
        attempt: u32,
        /// Wait before the next attempt.
        delay: Duration,
    },
    /// nsqd reported a non-fatal error; the connection stays up.
    NonFatalError {
        /// The nsqd address.
        addr: String,
        /// The error text.
        text: String,
    },
    /// nsqlookupd reported a new nsqd.
    NsqdDiscovered {
        /// The nsqd address.
        addr: String,
    },
    /// An nsqd vanished from nsqlookupd; its connection is drained and closed.
    NsqdRemoved {
        /// The nsqd address.
        addr: String,
    },
    /// Querying an nsqlookupd failed.
    LookupdFailed {
        /// The lookupd address.
        addr: String,
        /// Why.
        error: String,
    },
    /// Handler failures started or deepened backoff (or, at the deepest level, the level
    /// whose pause reaches `max_backoff`, kept it).
    BackoffStarted {
        /// Backoff level (1 = first failure).
        level: u32,
        /// Pause before testing with RDY 1.
        delay: Duration,
    },
    /// A success of the test message eased backoff by one level; it ends at level 0
    /// ([`ConsumerEvent::BackoffEnded`]).
    BackoffEased {
        /// Backoff level left.
        level: u32,
        /// Pause before the next test with RDY 1.
        delay: Duration,
    },
    /// Backoff ended; full RDY is restored.
    BackoffEnded,
    /// A message could not be handled for an outage ([`Message::outage`](super::Message::outage))
    /// and started or deepened the outage's backoff (or, at the level whose pause reaches its
    /// most, 10 s or `max_backoff` if lower, kept it).
    OutageBackoff {
        /// The outage's backoff level (1 = its first pause).
        level: u32,
        /// Pause before testing with RDY 1.
        delay: Duration,
    },
    /// What the handler needs answered again ([`Message::outage_over`](super::Message::outage_over)):
    /// the outage's backoff ended at once ([`ConsumerEvent::BackoffEnded`] follows unless
    /// handler failures still hold the consumer back).
    OutageEnded,
    /// A message exceeded `max_attempts` and was finished without being handed out.
    MaxAttemptsExceeded {
        /// The message ID.
        id: String,
        /// Its attempts.
        attempts: u16,
    },
}

/// Counters since the consumer started. See [`Consumer::stats`](super::Consumer::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Message frames received (including those finished for exceeding `max_attempts`).
    pub messages_received: u64,
    /// FINs queued.
    pub finished: u64,
    /// REQs queued (by handlers, drops and shutdown).
    pub requeued: u64,
    /// TOUCHes queued.
    pub touched: u64,
    /// Non-fatal error frames received.
    pub non_fatal_errors: u64,
    /// Heartbeats answered with NOP.
    pub heartbeats: u64,
    /// Successful connects (first ones and reconnects).
    pub connects: u64,
    /// Connections that ended other than by shutdown or removal.
    pub disconnects: u64,
    /// Messages finished without being handed out because of `max_attempts`.
    pub max_attempts_exceeded: u64,
    /// Connections up now.
    pub connections: u64,
    /// Sum of the RDY last sent over live connections.
    pub rdy_total: u64,
}

/// What [`Consumer::shutdown`](super::Consumer::shutdown) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Messages received but never handed out, requeued with no delay.
    pub requeued_unseen: usize,
    /// Messages still unanswered when the grace period ended, requeued with no delay.
    pub requeued_at_deadline: usize,
    /// Whether every connection closed before the grace period (plus a second) ran out.
    pub clean: bool,
}
