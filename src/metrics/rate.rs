//! The distinct rate as it is now, its peak over the window, and the distinct messages of the
//! last window: what the table fills at, and what it had to hold.
//!
//! A rate averaged since the start hides this morning's peak behind a quiet night. The
//! sidecar samples the count of distinct messages once a second; the recent rate is the count
//! over the last [`RECENT_SPAN`] (or over what was sampled, early on), and the peak is the
//! highest recent rate seen in the last window (kept per [`PEAK_BUCKETS`]th of the window).
//! The same parts count the messages of the last window: a burst shorter than the window
//! counts for what it brought, not for its rate over a whole window.
//!
//! Consumers that share a store also learn the fleet's rate through it
//! ([`note_fleet`](RateTracker::note_fleet)); from then on the peak is the fleet's, and the
//! window's count adds the fleet's rate over the time between two notes.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The span the recent rate is measured over.
pub(crate) const RECENT_SPAN: Duration = Duration::from_secs(60);

/// How many parts of the window the peak is kept in: the peak forgets a part once it is a
/// whole window old.
pub(crate) const PEAK_BUCKETS: u32 = 60;

/// Samples of a count, giving its recent rate and that rate's peak over a window.
#[derive(Debug)]
pub(crate) struct RateTracker {
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// (when, count), oldest first, covering at least `RECENT_SPAN` once that much passed.
    samples: VecDeque<(Instant, u64)>,
    /// The parts of the last window, oldest first.
    parts: VecDeque<Part>,
    recent: Option<f64>,
    /// The fleet's rate, once known, and when it was last noted: the peak and the window's
    /// count then follow it instead of our own.
    fleet: Option<(f64, Instant)>,
}

/// A [`PEAK_BUCKETS`]th of the window.
#[derive(Debug)]
struct Part {
    start: Instant,
    /// The highest recent rate in it.
    peak: f64,
    /// The distinct messages it counted.
    count: f64,
}

impl RateTracker {
    /// A tracker whose peak covers `window`.
    pub(crate) fn new(window: Duration) -> Self {
        RateTracker {
            window,
            state: Mutex::new(State::default()),
        }
    }

    /// Records that the count was `count` at `now` (non-decreasing in both).
    pub(crate) fn sample(&self, now: Instant, count: u64) {
        // A plain mutex: one sample a second and a few readers, never held across an await.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // What came since the last sample, counted until the fleet's rate takes over. Counts
        // start at 0, so the first part counts all that came before the first sample too (the
        // messages decided before the first tick).
        let added = match (state.fleet, state.samples.back()) {
            (None, Some(_)) if state.parts.is_empty() => count as f64,
            (None, Some(&(_, before))) => count.saturating_sub(before) as f64,
            _ => 0.0,
        };
        state.samples.push_back((now, count));
        while state.samples.len() > 2 && now.duration_since(state.samples[1].0) >= RECENT_SPAN {
            state.samples.pop_front();
        }
        let (first, first_count) = state.samples[0];
        let span = now.duration_since(first).as_secs_f64();
        if span <= 0.0 {
            return;
        }
        let rate = count.saturating_sub(first_count) as f64 / span;
        state.recent = Some(rate);
        if state.fleet.is_none() {
            self.note_part(&mut state, now, rate, added);
        }
    }

    /// Records the fleet's rate, as learnt at `now` from the shared store.
    #[cfg(feature = "sidecar")]
    pub(crate) fn note_fleet(&self, now: Instant, rate: f64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.fleet.is_none() {
            // Our own rates so far were a share of the fleet's: not its peak. Our own counts
            // stay, as the least the fleet's could have been.
            state.parts.iter_mut().for_each(|part| part.peak = 0.0);
        }
        // The fleet's rate held since the last note (or our own last sample, which counted
        // what came before), up to a part's length: a consumer that was stopped meanwhile
        // does not count its pause.
        let counted_at = match state.fleet {
            Some((_, noted)) => Some(noted),
            None => state.samples.back().map(|&(at, _)| at),
        };
        let since = counted_at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
            .min(self.part());
        state.fleet = Some((rate, now));
        self.note_part(&mut state, now, rate, rate * since.as_secs_f64());
    }

    /// The fleet's rate, once the shared store told it.
    pub(crate) fn fleet(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.fleet.map(|(rate, _)| rate)
    }

    /// The length of one part of the window.
    fn part(&self) -> Duration {
        (self.window / PEAK_BUCKETS).max(Duration::from_secs(1))
    }

    fn note_part(&self, state: &mut State, now: Instant, rate: f64, added: f64) {
        let part = self.part();
        match state.parts.back_mut() {
            Some(last) if now.duration_since(last.start) < part => {
                last.peak = last.peak.max(rate);
                last.count += added;
            }
            _ => state.parts.push_back(Part {
                start: now,
                peak: rate,
                count: added,
            }),
        }
        while state
            .parts
            .front()
            .is_some_and(|first| now.duration_since(first.start) > self.window)
        {
            state.parts.pop_front();
        }
    }

    /// The rate over the last [`RECENT_SPAN`]; `None` before two samples.
    pub(crate) fn recent(&self) -> Option<f64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).recent
    }

    /// The highest recent rate in the last window; `None` before two samples.
    pub(crate) fn peak(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.parts.iter().map(|part| part.peak).reduce(f64::max)
    }

    /// The distinct messages of the last window (of the time since the start, early on);
    /// `None` before two samples.
    pub(crate) fn window_count(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.recent?;
        Some(state.parts.iter().map(|part| part.count).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages counted before the first sample (decided before the first tick) are the
    /// window's too.
    #[test]
    fn the_window_counts_what_came_before_the_first_sample() {
        let tracker = RateTracker::new(Duration::from_secs(3600));
        let start = Instant::now();
        tracker.sample(start, 200);
        assert_eq!(tracker.window_count(), None);
        tracker.sample(start + Duration::from_secs(1), 2000);
        assert_eq!(tracker.window_count(), Some(2000.0));
        tracker.sample(start + Duration::from_secs(2), 2500);
        assert_eq!(tracker.window_count(), Some(2500.0));
    }

    #[test]
    fn the_recent_rate_follows_the_last_minute_and_the_peak_the_window() {
        let tracker = RateTracker::new(Duration::from_secs(600));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(tracker.recent(), None);
        // 1,000 a second for five minutes.
        let mut total = 0;
        tracker.sample(at(0), total);
        for s in 1..=300 {
            total += 1000;
            tracker.sample(at(s), total);
        }
        assert_eq!(tracker.recent(), Some(1000.0));
        // Then 100 a second: after a minute the recent rate is 100, the peak still 1,000.
        for s in 301..=400 {
            total += 100;
            tracker.sample(at(s), total);
        }
        assert_eq!(tracker.recent(), Some(100.0));
        assert_eq!(tracker.peak(), Some(1000.0));
        // A whole window later the peak has forgotten the busy minutes.
        for s in 401..=1000 {
            total += 100;
            tracker.sample(at(s), total);
        }
        assert_eq!(tracker.peak(), Some(100.0));
        // The last window's messages: its last 600 seconds at 100 a second, give or take a
        // part (10 s).
        let count = tracker.window_count().unwrap();
        assert!((59_000.0..=61_100.0).contains(&count), "{count}");
    }

    /// A burst counts for what it brought: 20,000 messages in two seconds, then ten quiet
    /// minutes, are 20,000 messages of an hour's window, not two seconds' rate for an hour.
    #[test]
    fn the_window_counts_a_burst_for_what_it_brought() {
        let tracker = RateTracker::new(Duration::from_secs(3600));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(tracker.window_count(), None);
        tracker.sample(at(0), 0);
        tracker.sample(at(1), 10_000);
        tracker.sample(at(2), 20_000);
        assert_eq!(tracker.window_count(), Some(20_000.0));
        assert_eq!(tracker.recent(), Some(10_000.0));
        for s in 3..=600 {
            tracker.sample(at(s), 20_000);
        }
        assert_eq!(tracker.window_count(), Some(20_000.0));
        assert_eq!(tracker.recent(), Some(0.0));
        // An hour after the burst, it has left the window.
        for s in 601..=3700 {
            tracker.sample(at(s), 20_000);
        }
        assert_eq!(tracker.window_count(), Some(0.0));
    }

    /// Once the fleet's rate is known, the window counts it over the time between notes.
    #[cfg(feature = "sidecar")]
    #[test]
    fn the_window_counts_the_fleets_rate_once_known() {
        let tracker = RateTracker::new(Duration::from_secs(3600));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        tracker.sample(at(0), 0);
        tracker.sample(at(10), 1_000);
        for s in (20..=120).step_by(10) {
            tracker.note_fleet(at(s), 300.0);
        }
        // Our own 1,000, then 300 a second for 110 s (from the last sample at 10 s).
        assert_eq!(tracker.window_count(), Some(1_000.0 + 300.0 * 110.0));
    }
}
