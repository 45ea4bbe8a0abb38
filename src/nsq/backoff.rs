//! Backing off, as a pure state machine the control task drives: the two causes that pause the
//! consumer and the phase they put it in ([`BackoffPhase`]).
//!
//! - **Handler failures**, as go-nsq: each failure outside a pause deepens the level by one
//!   (no deeper once the pause reaches `max_backoff`), and each success of a test message
//!   eases it by one, so a handler that works again is back at full speed after as many
//!   successes as it took failures to get there.
//! - **Outages** of something the handler needs (a shared store that does not answer, told by
//!   [`Message::outage`](super::Message::outage)): they deepen the same way, but the message
//!   that finds the store answering again ends the outage at once
//!   ([`Message::outage_over`](super::Message::outage_over)): nothing was wrong with the
//!   handler, and nothing is gained by easing back in.
//!
//! The pause at level `n` is `backoff_multiplier` doubled `n - 1` times, at most
//! `max_backoff`, and for an outage at most [`OUTAGE_MOST_PAUSE`] too: a test message every
//! few seconds costs one requeue, and a store that is back is used again within that pause,
//! not after minutes. With both causes, the longer pause is taken. A pause is RDY 0 everywhere; when
//! it ends, one connection gets RDY 1 and its next message tests what failed. Reports made
//! during a pause come from messages delivered before it and say nothing new: they are
//! ignored.

use std::time::Duration;

use tokio::time::Instant;

use super::rdy::BackoffPhase;

/// The longest pause an outage makes, whatever `max_backoff` is.
pub(crate) const OUTAGE_MOST_PAUSE: Duration = Duration::from_secs(10);

/// What the control task is told about a message's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A FIN while backing off on handler failures.
    HandlerSucceeded,
    /// A REQ that counts as a handler failure.
    HandlerFailed,
    /// A message could not be handled for an outage.
    Outage,
    /// What the handler needs answered again.
    OutageOver,
}

/// What a signal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// A pause of `delay` began; `level` is the signal's cause's.
    Paused {
        signal: Signal,
        level: u32,
        delay: Duration,
    },
    /// The signal's cause no longer holds the consumer back; `resumed` when nothing else does
    /// (full RDY).
    Ended { signal: Signal, resumed: bool },
}

/// The levels of both causes and the phase they put the consumer in.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    multiplier: Duration,
    max: Duration,
    handler_level: u32,
    outage_level: u32,
    phase: BackoffPhase,
}

impl Backoff {
    /// No backoff yet, pausing `multiplier` at level 1, at most `max`. A zero `multiplier`
    /// never backs off.
    pub(super) fn new(multiplier: Duration, max: Duration) -> Self {
        Backoff {
            multiplier,
            max,
            handler_level: 0,
            outage_level: 0,
            phase: BackoffPhase::Normal,
        }
    }

    pub(super) fn phase(&self) -> BackoffPhase {
        self.phase
    }

    /// Whether handler failures hold the consumer back: only then do FINs matter.
    pub(super) fn handler_active(&self) -> bool {
        self.handler_level > 0
    }

    /// Whether an outage holds the consumer back: only then does its end matter.
    pub(super) fn outage_active(&self) -> bool {
        self.outage_level > 0
    }

    /// The pause at `level`, at most `max`.
    fn delay(&self, level: u32, max: Duration) -> Duration {
        let exp = level.saturating_sub(1).min(30);
        self.multiplier.saturating_mul(1u32 << exp).min(max)
    }

    /// The most an outage pauses.
    fn outage_max(&self) -> Duration {
        self.max.min(OUTAGE_MOST_PAUSE)
    }

    /// Deepens `level` by one, unless its pause already reaches `max`: a cause that clears
    /// eases back from there, not from one level per test of a long outage.
    fn deepen(level: u32, delay: Duration, max: Duration) -> u32 {
        if level == 0 || delay < max {
            (level + 1).min(31)
        } else {
            level
        }
    }

    /// Applies `signal` at `now`; `None` when it changes nothing.
    pub(super) fn on(&mut self, signal: Signal, now: Instant) -> Option<Change> {
        if self.multiplier.is_zero() || matches!(self.phase, BackoffPhase::Waiting { .. }) {
            return None;
        }
        let testing = self.phase == BackoffPhase::Testing;
        let level = match signal {
            Signal::HandlerFailed => {
                let level = self.handler_level;
                self.handler_level = Self::deepen(level, self.delay(level, self.max), self.max);
                self.handler_level
            }
            Signal::Outage => {
                let level = self.outage_level;
                let max = self.outage_max();
                self.outage_level = Self::deepen(level, self.delay(level, max), max);
                self.outage_level
            }
            // Only a test message's success says the handler works again.
            Signal::HandlerSucceeded if testing && self.handler_level > 0 => {
                self.handler_level -= 1;
                if self.handler_level == 0 && self.outage_level == 0 {
                    self.phase = BackoffPhase::Normal;
                    return Some(Change::Ended {
                        signal,
                        resumed: true,
                    });
                }
                self.handler_level
            }
            Signal::HandlerSucceeded => return None,
            Signal::OutageOver if self.outage_level > 0 => {
                self.outage_level = 0;
                // The message that found the store answering goes on to the handler: if the
                // handler's backoff goes on, that message is its test.
                let resumed = self.handler_level == 0;
                if resumed {
                    self.phase = BackoffPhase::Normal;
                }
                return Some(Change::Ended { signal, resumed });
            }
            Signal::OutageOver => return None,
        };
        let delay = self
            .delay(self.handler_level, self.max)
            .max(self.delay(self.outage_level, self.outage_max()));
        self.phase = BackoffPhase::Waiting { until: now + delay };
        Some(Change::Paused {
            signal,
            level,
            delay,
        })
    }

    /// Ends a pause that is due at `now`: the consumer tests with one message. Returns whether
    /// it did.
    pub(super) fn tick(&mut self, now: Instant) -> bool {
        match self.phase {
            BackoffPhase::Waiting { until } if until <= now => {
                self.phase = BackoffPhase::Testing;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A backoff of 1 s doubling up to 8 s, its pause ended at once to test.
    fn backoff() -> Backoff {
        Backoff::new(SECOND, 8 * SECOND)
    }

    /// Ends the pause (whenever it was due).
    fn test(backoff: &mut Backoff, now: Instant) {
        assert!(backoff.tick(now + Duration::from_secs(3600)));
        assert_eq!(backoff.phase(), BackoffPhase::Testing);
    }

    fn paused(signal: Signal, level: u32, secs: u64) -> Option<Change> {
        Some(Change::Paused {
            signal,
            level,
            delay: Duration::from_secs(secs),
        })
    }

    #[test]
    fn an_outage_doubles_its_pause_up_to_the_most_and_ends_at_once() {
        let now = Instant::now();
        let mut b = backoff();
        assert_eq!(b.on(Signal::Outage, now), paused(Signal::Outage, 1, 1));
        // Reports of messages delivered before the pause are ignored.
        assert_eq!(b.on(Signal::Outage, now), None);
        assert_eq!(b.on(Signal::OutageOver, now), None);
        assert!(!b.tick(now), "paused for a second");
        for (level, secs) in [(2, 2), (3, 4), (4, 8), (4, 8), (4, 8)] {
            test(&mut b, now);
            assert_eq!(
                b.on(Signal::Outage, now),
                paused(Signal::Outage, level, secs)
            );
        }
        test(&mut b, now);
        // A FIN of a message that did not meet the store (keyless) says nothing.
        assert_eq!(b.on(Signal::HandlerSucceeded, now), None);
        assert_eq!(b.phase(), BackoffPhase::Testing);
        let over = Some(Change::Ended {
            signal: Signal::OutageOver,
            resumed: true,
        });
        assert_eq!(b.on(Signal::OutageOver, now), over);
        assert_eq!(b.phase(), BackoffPhase::Normal);
        assert!(!b.outage_active());
        // The next outage starts from the first level.
        assert_eq!(b.on(Signal::Outage, now), paused(Signal::Outage, 1, 1));
    }

    /// With go-nsq's `max_backoff` of two minutes, an outage's pauses stop at ten seconds,
    /// so a store that is back is used again within them; handler failures still go to two
    /// minutes, and with both the longer pause is taken.
    #[test]
    fn an_outage_pauses_at_most_ten_seconds() {
        let now = Instant::now();
        let mut b = Backoff::new(SECOND, 120 * SECOND);
        assert_eq!(b.on(Signal::Outage, now), paused(Signal::Outage, 1, 1));
        for (level, secs) in [(2, 2), (3, 4), (4, 8), (5, 10), (5, 10)] {
            test(&mut b, now);
            assert_eq!(
                b.on(Signal::Outage, now),
                paused(Signal::Outage, level, secs)
            );
        }
        let mut h = Backoff::new(SECOND, 120 * SECOND);
        for (level, secs) in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32)] {
            assert_eq!(
                h.on(Signal::HandlerFailed, now),
                paused(Signal::HandlerFailed, level, secs)
            );
            test(&mut h, now);
        }
        assert_eq!(h.on(Signal::Outage, now), paused(Signal::Outage, 1, 32));
    }

    #[test]
    fn handler_failures_ease_back_one_success_at_a_time_as_go_nsq() {
        let now = Instant::now();
        let mut b = backoff();
        assert_eq!(b.on(Signal::HandlerSucceeded, now), None, "not backing off");
        assert_eq!(
            b.on(Signal::HandlerFailed, now),
            paused(Signal::HandlerFailed, 1, 1)
        );
        test(&mut b, now);
        assert_eq!(
            b.on(Signal::HandlerFailed, now),
            paused(Signal::HandlerFailed, 2, 2)
        );
        test(&mut b, now);
        assert_eq!(
            b.on(Signal::HandlerSucceeded, now),
            paused(Signal::HandlerSucceeded, 1, 1)
        );
        test(&mut b, now);
        let ended = Some(Change::Ended {
            signal: Signal::HandlerSucceeded,
            resumed: true,
        });
        assert_eq!(b.on(Signal::HandlerSucceeded, now), ended);
        assert_eq!(b.phase(), BackoffPhase::Normal);
    }

    #[test]
    fn the_deeper_cause_sets_the_pause_and_an_outage_over_leaves_the_handlers() {
        let now = Instant::now();
        let mut b = backoff();
        b.on(Signal::HandlerFailed, now);
        test(&mut b, now);
        b.on(Signal::HandlerFailed, now);
        test(&mut b, now);
        // Handler at level 2 (2 s); the outage's first level pauses as long as the deeper.
        assert_eq!(b.on(Signal::Outage, now), paused(Signal::Outage, 1, 2));
        test(&mut b, now);
        let over = Some(Change::Ended {
            signal: Signal::OutageOver,
            resumed: false,
        });
        assert_eq!(b.on(Signal::OutageOver, now), over);
        assert_eq!(
            b.phase(),
            BackoffPhase::Testing,
            "the handler's test goes on"
        );
        assert!(b.handler_active() && !b.outage_active());
    }

    #[test]
    fn a_zero_multiplier_never_backs_off() {
        let mut b = Backoff::new(Duration::ZERO, 8 * SECOND);
        assert_eq!(b.on(Signal::Outage, Instant::now()), None);
        assert_eq!(b.on(Signal::HandlerFailed, Instant::now()), None);
        assert_eq!(b.phase(), BackoffPhase::Normal);
    }
}
