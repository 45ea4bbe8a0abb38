//! The distinct rate as it is now and its peak over the window: what the table fills at.
//!
//! A rate averaged since the start hides this morning's peak behind a quiet night. The
//! sidecar samples the count of distinct messages once a second; the recent rate is the count
//! over the last [`RECENT_SPAN`] (or over what was sampled, early on), and the peak is the
//! highest recent rate seen in the last window (kept per [`PEAK_BUCKETS`]th of the window).
//!
//! Consumers that share a store also learn the fleet's rate through it
//! ([`note_fleet`](RateTracker::note_fleet)); from then on the peak is the fleet's.

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
    /// (start of the part, highest recent rate in it), oldest first.
    peaks: VecDeque<(Instant, f64)>,
    recent: Option<f64>,
    /// The fleet's rate, once known, and the span the store's counters measured it over;
    /// the peak then follows it instead of our own.
    fleet: Option<(f64, Duration)>,
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
            self.note_peak(&mut state, now, rate);
        }
    }

    /// Records the fleet's rate over the last `span`, as learnt at `now` from the shared
    /// store.
    #[cfg(feature = "sidecar")]
    pub(crate) fn note_fleet(&self, now: Instant, rate: f64, span: Duration) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.fleet.is_none() {
            // Our own rates so far were a share of the fleet's: not its peak.
            state.peaks.clear();
        }
        state.fleet = Some((rate, span));
        self.note_peak(&mut state, now, rate);
    }

    /// The fleet's rate, once the shared store told it.
    pub(crate) fn fleet(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.fleet.map(|(rate, _)| rate)
    }

    /// The span the rate in use was measured over: the fleet's counters' once known, else
    /// this consumer's recent one ([`RECENT_SPAN`], or less early on); `None` before two
    /// samples.
    #[cfg(feature = "sidecar")]
    pub(crate) fn span(&self) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, span)) = state.fleet {
            return Some(span);
        }
        match (state.samples.front(), state.samples.back()) {
            (Some(&(first, _)), Some(&(last, _))) if last > first => {
                Some(last.duration_since(first))
            }
            _ => None,
        }
    }

    fn note_peak(&self, state: &mut State, now: Instant, rate: f64) {
        let part = (self.window / PEAK_BUCKETS).max(Duration::from_secs(1));
        match state.peaks.back_mut() {
            Some((start, peak)) if now.duration_since(*start) < part => *peak = peak.max(rate),
            _ => state.peaks.push_back((now, rate)),
        }
        while state
            .peaks
            .front()
            .is_some_and(|(start, _)| now.duration_since(*start) > self.window)
        {
            state.peaks.pop_front();
        }
    }

    /// The rate over the last [`RECENT_SPAN`]; `None` before two samples.
    pub(crate) fn recent(&self) -> Option<f64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).recent
    }

    /// The highest recent rate in the last window; `None` before two samples.
    pub(crate) fn peak(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.peaks.iter().map(|(_, p)| *p).reduce(f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[cfg(feature = "sidecar")]
    #[test]
    fn the_span_of_the_rate_in_use_is_known() {
        let tracker = RateTracker::new(Duration::from_secs(3600));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(tracker.span(), None);
        tracker.sample(at(0), 0);
        tracker.sample(at(3), 2000);
        // Early on, what was sampled.
        assert_eq!(tracker.span(), Some(Duration::from_secs(3)));
        for s in 4..=200 {
            tracker.sample(at(s), 2000);
        }
        assert_eq!(tracker.span(), Some(RECENT_SPAN));
        tracker.note_fleet(at(200), 50.0, Duration::from_secs(12));
        assert_eq!(tracker.span(), Some(Duration::from_secs(12)));
    }
}
