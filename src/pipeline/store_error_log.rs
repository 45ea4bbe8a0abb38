//! When a store error is logged: each cause (a timeout, an unreachable server, a refusal, ...)
//! as soon as it appears, then at most once a [`STORE_ERROR_LOG_INTERVAL`] while it lasts,
//! with the count of errors not logged since the line before.
//!
//! A store that fails fails every message, thousands a second: a line per error would bury
//! the log. One limit for all causes would hide a new cause behind the old one for up to an
//! interval (a password changed on a Redis that was restarting looked like the restart), so
//! each cause has its own. Two causes that alternate (one server down, another slow) still
//! give at most a line per cause and interval.
//!
//! When the store answers again, that is said once, at INFO, with how long it failed and how
//! many errors it gave: at the first burst of claims it answers in full once
//! [`STORE_RECOVERY_QUIET`] has passed without an error, so that the errors of calls sent
//! before it came back (a timeout that ends after the server answers again) belong to the
//! outage they come from, and a store that fails one call in a few (one server of several
//! down) is not said to be back between two failures. The causes are then forgotten: a new
//! outage is logged as soon as it appears.
//!
//! ```text
//! INFO nsq_dedupe::pipeline::store_error_log: Store answers again. failed_for=42.113s answered_after=43.2s errors=12873
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::StoreError;

/// How often one cause of store errors is logged at most, after its first.
pub(super) const STORE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How long the store goes without an error, after errors, before a burst it answers in full
/// says that it is back.
pub(super) const STORE_RECOVERY_QUIET: Duration = Duration::from_secs(1);

/// The causes told apart: one per [`StoreError`] variant.
const CAUSES: usize = 7;

/// Which errors to log; shared by every task of a pipeline, lock-free.
#[derive(Debug, Default)]
pub(super) struct StoreErrorLog {
    /// Per cause: when it was last logged, in milliseconds of the caller's clock plus one
    /// (0: never).
    logged_at: [AtomicU64; CAUSES],
    /// Errors not logged since the last line.
    unlogged: AtomicU64,
    /// The first error since the store was last said to answer, in milliseconds of the
    /// caller's clock plus one (0: no error since). Read alone by every burst the store
    /// answers, and written only by errors and by the burst that says the store is back.
    failing_since: AtomicU64,
    /// The latest error, in the same milliseconds.
    last_error: AtomicU64,
    /// Errors since `failing_since`.
    errors: AtomicU64,
}

/// An outage that ended: how long the store failed (from its first error to its last), how
/// long from its first error to the answer that ended it (under an outage's backoff, the last
/// error is that of the last failed test, well before the store came back), and how many
/// errors it gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovered {
    pub(super) failed_for: Duration,
    pub(super) answered_after: Duration,
    pub(super) errors: u64,
}

impl StoreErrorLog {
    /// Notes `count` errors of one failed call at `now` (the caller's monotonic clock).
    /// Returns `Some(suppressed)` when this one is to be logged, with the count of errors not
    /// logged since the last line; `None` when it is only counted.
    pub(super) fn note(&self, error: &StoreError, count: u64, now: Duration) -> Option<u64> {
        let logged_at = &self.logged_at[cause(error)];
        let now = millis(now);
        // Relaxed: counts and times for the log, which no other memory depends on.
        self.last_error.fetch_max(now, Ordering::Relaxed);
        if self.failing_since.load(Ordering::Relaxed) == 0 {
            let _ =
                self.failing_since
                    .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.errors.fetch_add(count, Ordering::Relaxed);
        let last = logged_at.load(Ordering::Relaxed);
        let interval = STORE_ERROR_LOG_INTERVAL.as_millis() as u64;
        // Relaxed: a log decision; a race between two tasks lets exactly one of them log.
        let due = last == 0 || now.saturating_sub(last) >= interval;
        if due
            && logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.unlogged.swap(0, Ordering::Relaxed))
        } else {
            self.unlogged.fetch_add(count, Ordering::Relaxed);
            None
        }
    }

    /// Notes a burst of claims the store answered in full, and logs once, at INFO, that it
    /// answers again when it failed before and has gone [`STORE_RECOVERY_QUIET`] without an
    /// error. `now` (the caller's monotonic clock, as [`StoreErrorLog::note`]'s) is read only
    /// then: while the store works, this is one read of a counter.
    pub(super) fn answered(&self, now: impl FnOnce() -> Duration) {
        if self.failing_since.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(Recovered {
            failed_for,
            answered_after,
            errors,
        }) = self.recovered(now())
        {
            tracing::info!(?failed_for, ?answered_after, errors, "Store answers again.");
        }
    }

    /// The outage that a burst answered in full at `now` ends, if any: the one caller that
    /// ends it gets it, and the causes are forgotten, so that the next error is logged at once.
    fn recovered(&self, now: Duration) -> Option<Recovered> {
        let since = self.failing_since.load(Ordering::Relaxed);
        let last = self.last_error.load(Ordering::Relaxed);
        let quiet = STORE_RECOVERY_QUIET.as_millis() as u64;
        if since == 0 || millis(now).saturating_sub(last) < quiet {
            return None;
        }
        self.failing_since
            .compare_exchange(since, 0, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        for logged_at in &self.logged_at {
            logged_at.store(0, Ordering::Relaxed);
        }
        self.unlogged.store(0, Ordering::Relaxed);
        Some(Recovered {
            failed_for: Duration::from_millis(last.saturating_sub(since)),
            answered_after: Duration::from_millis(millis(now).saturating_sub(since)),
            errors: self.errors.swap(0, Ordering::Relaxed),
        })
    }
}

/// `now` in milliseconds plus one, so that 0 can mean never.
fn millis(now: Duration) -> u64 {
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX - 1) + 1
}

/// The cause of `error`, below [`CAUSES`].
fn cause(error: &StoreError) -> usize {
    match error {
        StoreError::Timeout(_) => 0,
        StoreError::Unavailable { .. } => 1,
        StoreError::Contended { .. } => 2,
        StoreError::Protocol(_) => 3,
        StoreError::Config(_) => 4,
        StoreError::Refused { .. } => 5,
        StoreError::OutOfMemory { .. } => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_new_cause_is_logged_at_once_and_each_cause_once_an_interval() {
        let log = StoreErrorLog::default();
        let down = StoreError::Unavailable {
            addr: "127.0.0.1:6379".into(),
            detail: "Connection refused".into(),
        };
        let refused = StoreError::Refused {
            addr: "127.0.0.1:6379".into(),
            detail: "AUTH failed".into(),
        };
        assert_eq!(log.note(&down, 1, at(0.0)), Some(0));
        assert_eq!(log.note(&down, 5, at(1.0)), None);
        // The cause changed: logged at once, with the errors not logged before it.
        assert_eq!(log.note(&refused, 1, at(1.5)), Some(5));
        // Alternating causes: each at most once an interval.
        for i in 0..100 {
            let t = 2.0 + f64::from(i) * 0.05;
            assert_eq!(log.note(&down, 1, at(t)), None);
            assert_eq!(log.note(&refused, 1, at(t)), None);
        }
        assert_eq!(log.note(&down, 1, at(10.0)), Some(200));
        assert_eq!(log.note(&refused, 1, at(11.4)), None);
        assert_eq!(log.note(&refused, 1, at(11.5)), Some(1));
    }

    #[test]
    fn an_outage_ends_once_after_a_quiet_second_and_the_next_is_logged_at_once() {
        let log = StoreErrorLog::default();
        let down = StoreError::Unavailable {
            addr: "127.0.0.1:11211".into(),
            detail: "Connection refused".into(),
        };
        assert_eq!(log.recovered(at(0.5)), None, "no outage");
        assert_eq!(log.note(&down, 3, at(1.0)), Some(0));
        assert_eq!(log.note(&down, 2, at(4.0)), None);
        // A burst answered while calls sent before still fail: not back yet.
        assert_eq!(log.recovered(at(4.5)), None);
        assert_eq!(log.note(&down, 1, at(4.9)), None);
        assert_eq!(log.recovered(at(5.8)), None);
        assert_eq!(
            log.recovered(at(5.9)),
            Some(Recovered {
                failed_for: Duration::from_millis(3_900),
                answered_after: Duration::from_millis(4_900),
                errors: 6
            })
        );
        assert_eq!(log.recovered(at(6.0)), None, "said once");
        // A new outage 2 s later is logged at once, not 10 s after the last line.
        assert_eq!(log.note(&down, 1, at(8.0)), Some(0));
        assert_eq!(
            log.recovered(at(9.0)),
            Some(Recovered {
                failed_for: Duration::ZERO,
                answered_after: Duration::from_millis(1_000),
                errors: 1
            })
        );
    }
}
