//! The RDY budget: how many messages each connection may be sent, as pure functions.
//!
//! The sum over connections never exceeds `max_in_flight`. With at least as many slots as
//! connections, each gets an equal share (the first ones one more); with more connections
//! than slots, `max_in_flight` of them get 1 each and the window rotates (go-nsq's
//! `rdy_redistribute_interval`). While backing off on handler failures, all get 0, and then one
//! connection at a time gets 1 to test the handler.

use std::time::Duration;

use tokio::time::Instant;

/// How long a lowered RDY keeps counting at its old value before its budget is given to
/// another connection: the time for nsqd to read the lower RDY, which the writer sends at once
/// (it holds answers, never a RDY). Loopback and LAN deliver it well within this.
/// With replicated input, copies set aside on one connection and taken back on another lower
/// one RDY and raise another for every batch a consumer answers, and the raise waits this
/// long: a batching consumer behind the serve sink waited 50 to 100 ms a batch when it was
/// 50 ms, checked on a 50 ms tick (see docs/benchmarks.md). Should nsqd read the lower RDY
/// later, it may send that connection up to the difference more than `max_in_flight` for
/// that moment.
pub(super) const RDY_SETTLE: Duration = Duration::from_millis(5);

/// How often the control task looks at backoff's pause and RDY's rotation.
pub(super) const CONTROL_TICK: Duration = Duration::from_millis(50);

/// Where the consumer is in go-nsq's handler-failure backoff.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum BackoffPhase {
    /// No backoff: full RDY.
    Normal,
    /// Paused until `until`: RDY 0 everywhere.
    Waiting { until: Instant },
    /// One message tests the handler: RDY 1 on one connection.
    Testing,
}

/// The RDY each of `active` connections (in a stable order) should have.
///
/// `test_rotor` picks the testing connection; `rotation_offset` the first of the connections
/// that get RDY when there are more connections than `max_in_flight`.
pub(super) fn targets(
    max_in_flight: u32,
    active: usize,
    phase: BackoffPhase,
    test_rotor: usize,
    rotation_offset: usize,
) -> Vec<u32> {
    let mut targets = vec![0; active];
    if active == 0 {
        return targets;
    }
    match phase {
        BackoffPhase::Waiting { .. } => {}
        BackoffPhase::Testing => targets[test_rotor % active] = 1,
        BackoffPhase::Normal if active as u64 <= u64::from(max_in_flight) => {
            let n = active as u32;
            let (share, extra) = (max_in_flight / n, (max_in_flight % n) as usize);
            for (i, target) in targets.iter_mut().enumerate() {
                *target = share + u32::from(i < extra);
            }
        }
        BackoffPhase::Normal => {
            for k in 0..max_in_flight as usize {
                targets[(rotation_offset + k) % active] = 1;
            }
        }
    }
    targets
}

/// How much of a raise to `target` a connection may have when the other connections may
/// still hold `others` messages: the budget left under `max_in_flight`, at most `target`.
pub(super) fn grant(target: u32, max_in_flight: u32, others: u64) -> u32 {
    let allowed = u64::from(max_in_flight).saturating_sub(others);
    target.min(u32::try_from(allowed).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn normal(max: u32, active: usize, offset: usize) -> Vec<u32> {
        targets(max, active, BackoffPhase::Normal, 0, offset)
    }

    #[test]
    fn shares_are_equal_but_for_one() {
        assert_eq!(normal(10, 3, 0), vec![4, 3, 3]);
        assert_eq!(normal(2500, 1, 0), vec![2500]);
        assert_eq!(normal(3, 3, 7), vec![1, 1, 1]);
        assert!(normal(5, 0, 0).is_empty());
    }

    #[test]
    fn more_connections_than_slots_take_turns() {
        assert_eq!(normal(2, 5, 0), vec![1, 1, 0, 0, 0]);
        assert_eq!(normal(2, 5, 2), vec![0, 0, 1, 1, 0]);
        assert_eq!(normal(2, 5, 4), vec![1, 0, 0, 0, 1]);
    }

    #[test]
    fn backoff_pauses_then_tests_one_connection() {
        let waiting = BackoffPhase::Waiting {
            until: Instant::now(),
        };
        assert_eq!(targets(100, 3, waiting, 0, 0), vec![0, 0, 0]);
        assert_eq!(targets(100, 3, BackoffPhase::Testing, 4, 0), vec![0, 1, 0]);
    }

    #[test]
    fn a_raise_never_exceeds_the_budget() {
        assert_eq!(grant(100, 100, 0), 100);
        assert_eq!(grant(100, 100, 60), 40);
        assert_eq!(grant(100, 100, 150), 0);
        assert_eq!(grant(7, 100, 10), 7);
    }

    proptest! {
        #[test]
        fn targets_never_exceed_max_in_flight(
            max in 1u32..3000,
            active in 0usize..200,
            offset in 0usize..10_000,
            rotor in 0usize..10_000,
            testing in any::<bool>(),
        ) {
            let phase = if testing { BackoffPhase::Testing } else { BackoffPhase::Normal };
            let t = targets(max, active, phase, rotor, offset);
            prop_assert_eq!(t.len(), active);
            let sum: u64 = t.iter().map(|&x| u64::from(x)).sum();
            prop_assert!(sum <= u64::from(max));
            if !testing && active > 0 {
                // The whole budget is handed out, as evenly as it can be.
                prop_assert_eq!(sum, u64::from(max));
                let (lo, hi) = (t.iter().min().unwrap(), t.iter().max().unwrap());
                prop_assert!(hi - lo <= 1);
            }
        }
    }
}
