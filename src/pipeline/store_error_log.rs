//! When a store error is logged: each cause (a timeout, an unreachable server, a refusal, ...)
//! as soon as it appears, then at most once a [`STORE_ERROR_LOG_INTERVAL`] while it lasts,
//! with the count of errors not logged since the line before.
//!
//! A store that fails fails every message, thousands a second: a line per error would bury
//! the log. One limit for all causes would hide a new cause behind the old one for up to an
//! interval (a password changed on a Redis that was restarting looked like the restart), so
//! each cause has its own. Two causes that alternate (one server down, another slow) still
//! give at most a line per cause and interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::StoreError;

/// How often one cause of store errors is logged at most, after its first.
pub(super) const STORE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

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
}

impl StoreErrorLog {
    /// Notes `count` errors of one failed call at `now` (the caller's monotonic clock).
    /// Returns `Some(suppressed)` when this one is to be logged, with the count of errors not
    /// logged since the last line; `None` when it is only counted.
    pub(super) fn note(&self, error: &StoreError, count: u64, now: Duration) -> Option<u64> {
        let logged_at = &self.logged_at[cause(error)];
        let now = u64::try_from(now.as_millis()).unwrap_or(u64::MAX - 1) + 1;
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
}
