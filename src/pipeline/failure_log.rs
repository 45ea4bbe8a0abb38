//! Handler failures as they are logged: the cause at WARN, at most once a
//! [`FAILURE_LOG_INTERVAL`] per cause, with the count of that cause's failures not logged since.
//!
//! A failing sink fails every message it is handed, hundreds a second: a line each would bury
//! everything else, and only a debug line (with the message's ID) is written per failure. The
//! cause is what an operator needs to fix it (the http sink's is the URL without its secrets
//! and the status, or the connection error; see [`crate::redact`]), so each different cause is
//! logged as soon as it first happens and then once a second while it lasts:
//!
//! ```text
//! WARN nsq_dedupe::pipeline: Handler failed; messages requeued. cause=http://<redacted>@host/in answered HTTP 503 Service Unavailable suppressed=212
//! ```
//!
//! Up to [`MAX_CAUSES`] causes are told apart; past that (a handler whose errors name each
//! message), the others share one slot, logged once a second with whichever cause comes first.
//!
//! When the handler succeeds again, that is said once, at INFO, with how long it failed and
//! how many failures it had: at its first success once [`RECOVERY_QUIET`] has passed without
//! a failure (a handler that fails one record in a few is not said to be back between two
//! failures). The causes are then forgotten: a new failure is logged as soon as it happens.
//!
//! ```text
//! INFO nsq_dedupe::pipeline::failure_log: Handler succeeds again. failed_for=192.412s failures=57
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::sink::HandlerError;

/// How often one cause is logged at most.
pub(super) const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// How long the handler goes without a failure, after failures, before a success says that
/// it is back.
pub(super) const RECOVERY_QUIET: Duration = Duration::from_secs(1);

/// How many causes are throttled each on its own.
const MAX_CAUSES: usize = 64;

/// The slot the causes past [`MAX_CAUSES`] share (no cause is empty text).
const OTHER_CAUSES: &str = "";

/// The causes seen and when each was last logged, and the failures since the handler last
/// succeeded.
#[derive(Debug, Default)]
pub(super) struct FailureLog {
    /// A `std` mutex: held for a lookup, never across an `.await`.
    causes: Mutex<HashMap<String, Logged>>,
    /// Whether `spell` holds failures; read alone on every success, so that a handler that
    /// works takes no lock.
    failing: AtomicBool,
    /// The failures since the handler was last said to succeed.
    spell: Mutex<Option<Spell>>,
}

/// Failures in a row (successes between them that came too soon do not end it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spell {
    first: Instant,
    last: Instant,
    failures: u64,
}

#[derive(Debug)]
struct Logged {
    at: Instant,
    /// Failures of this cause since `at`, not logged.
    suppressed: u64,
}

impl FailureLog {
    /// Logs a handler failure that requeues its message, unless its cause was logged less than
    /// [`FAILURE_LOG_INTERVAL`] ago.
    pub(super) fn requeued(&self, error: &HandlerError) {
        // A `Retry-After` delay differs from one answer to the next; the cause does not.
        let cause = match error {
            HandlerError::Retry(reason)
            | HandlerError::Reject(reason)
            | HandlerError::RetryAfter { reason, .. } => reason.as_str(),
            // A receiver's requeue is not a failure.
            HandlerError::Requeued { .. } => return,
        };
        let now = Instant::now();
        self.failed(now);
        if let Some(suppressed) = self.admit(cause, now) {
            tracing::warn!(cause = %error, suppressed, "Handler failed; messages requeued.");
        }
    }

    /// Notes a record the handler took, and logs once, at INFO, that it succeeds again when
    /// it failed before and has gone [`RECOVERY_QUIET`] without a failure.
    pub(super) fn succeeded(&self) {
        // Relaxed: a log decision; the spell itself is read under its lock.
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        if let Some(spell) = self.recovered(Instant::now()) {
            tracing::info!(
                failed_for = ?spell.last.duration_since(spell.first),
                failures = spell.failures,
                "Handler succeeds again."
            );
        }
    }

    /// Counts a failure at `now` in the current spell.
    fn failed(&self, now: Instant) {
        let mut spell = self.spell.lock().unwrap_or_else(PoisonError::into_inner);
        let spell = spell.get_or_insert(Spell {
            first: now,
            last: now,
            failures: 0,
        });
        spell.last = spell.last.max(now);
        spell.failures += 1;
        self.failing.store(true, Ordering::Relaxed);
    }

    /// The spell that a success at `now` ends, if any: the one caller that ends it gets it,
    /// and the causes are forgotten, so that the next failure is logged at once.
    fn recovered(&self, now: Instant) -> Option<Spell> {
        let mut spell = self.spell.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(spell.as_ref()?.last) < RECOVERY_QUIET {
            return None;
        }
        self.failing.store(false, Ordering::Relaxed);
        self.causes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        spell.take()
    }

    /// Whether a failure of `cause` at `now` is logged, and if so how many of its failures
    /// were not since the last line.
    fn admit(&self, cause: &str, now: Instant) -> Option<u64> {
        let mut causes = self.causes.lock().unwrap_or_else(PoisonError::into_inner);
        let is_due = |logged: &Logged| now.duration_since(logged.at) >= FAILURE_LOG_INTERVAL;
        if !causes.contains_key(cause) && causes.len() >= MAX_CAUSES {
            // A cause not seen for an interval is logged afresh when it comes back.
            causes.retain(|_, logged| !is_due(logged));
        }
        let key = if causes.contains_key(cause) || causes.len() < MAX_CAUSES {
            cause
        } else {
            OTHER_CAUSES
        };
        match causes.get_mut(key) {
            None => {
                causes.insert(
                    key.to_owned(),
                    Logged {
                        at: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
            Some(logged) if is_due(logged) => {
                let suppressed = std::mem::take(&mut logged.suppressed);
                logged.at = now;
                Some(suppressed)
            }
            Some(logged) => {
                logged.suppressed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_logged_at_once_then_once_an_interval_with_the_count_not_logged() {
        let log = FailureLog::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(log.admit("a", at(0)), Some(0));
        assert_eq!(log.admit("a", at(10)), None);
        assert_eq!(log.admit("a", at(999)), None);
        // Another cause is not held back by the first.
        assert_eq!(log.admit("b", at(500)), Some(0));
        assert_eq!(log.admit("a", at(1000)), Some(2));
        assert_eq!(log.admit("a", at(1500)), None);
        assert_eq!(log.admit("b", at(1500)), Some(0));
        assert_eq!(log.admit("a", at(5000)), Some(1));
    }

    #[test]
    fn causes_past_the_limit_share_one_slot() {
        let log = FailureLog::default();
        let start = Instant::now();
        for n in 0..MAX_CAUSES {
            assert_eq!(log.admit(&format!("cause {n}"), start), Some(0));
        }
        assert_eq!(log.admit("one more", start), Some(0));
        assert_eq!(log.admit("and another", start), None);
        assert_eq!(log.admit("one more", start), None);
        let later = start + FAILURE_LOG_INTERVAL;
        // A second on, the stale causes make room again.
        assert_eq!(log.admit("and another", later), Some(0));
        assert!(log.causes.lock().unwrap().len() <= MAX_CAUSES);
    }

    #[test]
    fn a_spell_of_failures_ends_once_after_a_quiet_second_and_the_next_is_logged_at_once() {
        let log = FailureLog::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(log.recovered(at(0)), None, "no failure");
        for ms in [0, 200, 2_000] {
            log.failed(at(ms));
            log.admit("disk full", at(ms));
        }
        // A success too soon after a failure (one record of a few fails): not back yet.
        assert_eq!(log.recovered(at(2_500)), None);
        assert_eq!(
            log.recovered(at(3_000)),
            Some(Spell {
                first: at(0),
                last: at(2_000),
                failures: 3
            })
        );
        assert!(!log.failing.load(Ordering::Relaxed));
        assert_eq!(log.recovered(at(3_100)), None, "said once");
        // The same cause again, 200 ms on: logged at once.
        assert_eq!(log.admit("disk full", at(3_200)), Some(0));
    }
}
