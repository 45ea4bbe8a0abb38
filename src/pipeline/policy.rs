//! The pipeline's decisions: what to do with a copy in flight, with a message when the store
//! fails, and how long a requeued message waits.

use std::time::Duration;

use crate::nsq::{DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF};

/// The REQ delay of a copy found in flight when none is given.
pub(crate) const DEFAULT_IN_FLIGHT_REQUEUE_DELAY: Duration = Duration::from_secs(1);

/// The REQ delay after a store error, before it is multiplied by the attempts, when none is
/// given.
pub(crate) const DEFAULT_STORE_ERROR_REQUEUE_DELAY: Duration = Duration::from_secs(1);

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
    /// The most copies held at once beside their original in flight in this process (see
    /// `held.rs`); past it a copy in flight is requeued with `in_flight_requeue_delay`. 0:
    /// never hold, requeue every copy in flight. Held copies do not count toward the
    /// consumer's `max_in_flight` (its RDY rises by as many). Defaults to: 1,024.
    pub max_held_copies: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            on_in_flight: InFlightPolicy::Requeue,
            in_flight_requeue_delay: DEFAULT_IN_FLIGHT_REQUEUE_DELAY,
            on_store_error: StoreErrorPolicy::Requeue,
            store_error_requeue_delay: DEFAULT_STORE_ERROR_REQUEUE_DELAY,
            // The sidecar's handler-failure backoff and attempts are go-nsq's.
            backoff: DEFAULT_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            keepalive: Duration::from_secs(30),
            max_held_copies: 1024,
        }
    }
}

impl Policy {
    /// The REQ delay after the `attempts`-th delivery failed: `backoff`, doubled per attempt,
    /// at most `max_backoff`.
    pub(super) fn retry_delay(&self, attempts: u16) -> Duration {
        let doublings = u32::from(attempts.saturating_sub(1).min(20));
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }

    /// The REQ delay after a store error on the `attempts`-th delivery:
    /// `store_error_requeue_delay` times the attempts, at most `max_backoff`.
    pub(super) fn store_error_delay(&self, attempts: u16) -> Duration {
        self.store_error_requeue_delay
            .saturating_mul(u32::from(attempts.max(1)))
            .min(self.max_backoff)
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
