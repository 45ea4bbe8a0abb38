//! Ejecting a Memcached server that has failed for `eject_after`, and taking it back.
//!
//! Without this, the sets that hash to a dead server have nowhere to go: every message whose
//! digest lands there fails at claim and is requeued, again and again, for as long as the
//! server is down. Like twemproxy's `server_failure_limit` and auto-eject, a server whose
//! operations have failed (connection refused, reset or timed out) with no success in between
//! for [`MemcachedConfig::eject_after`](super::MemcachedConfig::eject_after) is ejected: its
//! sets go to the next server in their rendezvous order, where they start empty (copies of
//! what the dead server remembered may pass; nothing is lost). While it is out, a task asks it
//! for its `version` every `probe_interval`; when it answers, it is back and its sets return
//! to it (with whatever it still holds, or empty after a restart).
//!
//! Each consumer decides for itself. While one has ejected a server and another has not yet,
//! the second one's operations on those sets still fail (requeued, decided later), the first
//! one's go to the next server; once both have ejected it they agree again. A server that
//! comes back is also taken back at slightly different moments: in between, the two may
//! claim one digest on two servers, so a copy may pass. Neither loses a message.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often an ejected server is asked whether it is back: `eject_after`, between 100 ms and
/// a second.
pub(super) fn probe_interval(eject_after: Duration) -> Duration {
    eject_after.clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// One server's failures and whether it is ejected. Lock-free: every operation's outcome
/// passes here, and most only read.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// Milliseconds (of the store's clock) of the first failure since the last success, plus
    /// one; 0 while the last operation succeeded.
    failing_since: AtomicU64,
    ejected: AtomicBool,
}

/// What a failure did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Failed {
    /// The server is still in (or already out).
    Counted,
    /// This failure ejected the server: start probing it.
    Ejected,
}

impl Health {
    /// Whether the server is out.
    pub(super) fn is_ejected(&self) -> bool {
        // Relaxed: a routing hint; a stale answer sends one batch to the old choice.
        self.ejected.load(Ordering::Relaxed)
    }

    /// An operation succeeded.
    pub(super) fn succeeded(&self) {
        // Written only when it changes, so that the common case only reads the line.
        if self.failing_since.load(Ordering::Relaxed) != 0 {
            self.failing_since.store(0, Ordering::Relaxed);
        }
    }

    /// An operation failed at `now_ms`; `eject_after` is the bound (`None`: never eject).
    pub(super) fn failed(&self, now_ms: u64, eject_after: Option<Duration>) -> Failed {
        let since = match self.failing_since.load(Ordering::Relaxed) {
            0 => {
                let _ = self.failing_since.compare_exchange(
                    0,
                    now_ms + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                now_ms + 1
            }
            since => since,
        };
        let Some(after) = eject_after else {
            return Failed::Counted;
        };
        let failing_for = (now_ms + 1).saturating_sub(since);
        if u128::from(failing_for) >= after.as_millis()
            && self
                .ejected
                .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Failed::Ejected;
        }
        Failed::Counted
    }

    /// The server answered a probe: it is back, its failures forgotten.
    pub(super) fn returned(&self) {
        self.failing_since.store(0, Ordering::Relaxed);
        self.ejected.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_ejected_once_it_failed_for_the_bound_without_a_success() {
        let health = Health::default();
        let after = Some(Duration::from_secs(10));
        assert_eq!(health.failed(1_000, after), Failed::Counted);
        assert_eq!(health.failed(9_000, after), Failed::Counted);
        // A success in between starts the count again.
        health.succeeded();
        assert_eq!(health.failed(12_000, after), Failed::Counted);
        assert!(!health.is_ejected());
        assert_eq!(health.failed(22_000, after), Failed::Ejected);
        assert!(health.is_ejected());
        // Ejected once, not at every later failure.
        assert_eq!(health.failed(23_000, after), Failed::Counted);
        health.returned();
        assert!(!health.is_ejected());
        assert_eq!(health.failed(24_000, after), Failed::Counted);
        // Without a bound, never.
        assert_eq!(health.failed(1_000_000, None), Failed::Counted);
    }
}
