//! How many connections a pool may hold to one endpoint, learnt from how fast the endpoint
//! takes them: a limit that starts at [`INITIAL`], rises while requests wait for a connection
//! and connects complete fast, and halves when a connect stalls; never above the configured
//! maximum. Pure bookkeeping, no I/O: the pool reports its connects and asks before it grows.
//!
//! # Why
//!
//! A server's listen backlog bounds the connections its kernel holds until the server accepts
//! them. Beyond it the kernel drops the SYN (or the handshake's last ACK), and the client's
//! kernel sends it again after 1 s, then 2 s more, 4 s more (RFC 6298's initial RTO of 1 s,
//! doubled). Python's `http.server` listens with a backlog of 5 and closes each connection
//! after one answer, so every request connects anew: a few plain clients got 1,000 to 2,300
//! answers a second from it on the 2 shared cores of `docs/benchmarks.md`, but 100 connects at
//! once overflow the backlog and most requests wait a second or more for a retransmit: 93 to
//! 189 answers a second. A fixed count of connections
//! cannot be right for both that server and a keep-alive one that wants 100 requests in
//! flight; so the pool adapts the count as TCP adapts its window (AIMD, RFC 5681):
//!
//! - **Only on demand, and on evidence.** The limit rises by one only for a request that
//!   found every connection busy ([`ConnectionLimit::grow`]), and only once a connect has
//!   completed: connections follow the load, and a caller that sends one request at a time
//!   keeps one connection.
//! - **No faster than we learn.** Whether a connect stalled is known within the stall bound
//!   ([`ConnectionLimit::stall_after`]), so the limit rises at most so far per bound: it may
//!   double (slow start: from 2 to 4 at once, then 8, 16, ... 100 within 0.5 s against a
//!   keep-alive server under load), and after a stall only by one. A limit too high is thus
//!   found within one bound, at twice the last good one at most, not after a hundred connects
//!   have piled up.
//! - **Halve on a stall.** A connect still pending at the stall bound, or one that times out,
//!   halves the limit ([`ConnectionLimit::stalled`]), and the halved limit is the threshold
//!   above which it rises only by one per bound. Connects begun before the halving stalled in
//!   the same crowd: they do not halve it again (TCP's one reduction per window). While a
//!   stalled connect is still pending the limit does not rise. (The pool gives a stalled
//!   connect up at once and tries again under the lowered limit, so that the crowd's SYNs are
//!   not all sent again together a second later.)
//!
//! Against a keep-alive server connects are few and fast: the limit climbs to what the load
//! needs and stays there. Against Python's server it swings between about 4 and 8, the
//! handful of connections the server takes at once.
//!
//! # The stall bound
//!
//! `max(100 ms, 4 × the fastest connect seen)`, a connect being the TCP handshake (a TLS
//! handshake's time is mostly the endpoint's work, not its backlog). 100 ms is far below the
//! 1 s a dropped SYN costs and far above a connect on a loopback or a LAN (well under 1 ms),
//! even on a loaded machine; the multiple of the fastest connect keeps a distant endpoint
//! (100 ms away: 400 ms) from looking stalled. Until a first connect has completed there is
//! no bound: nothing is judged, and the limit does not rise.

use std::time::{Duration, Instant};

/// The limit a pool starts with (or the maximum, if lower).
pub(super) const INITIAL: usize = 2;

/// The least time a connect may take before it counts as stalled.
pub(super) const STALL_FLOOR: Duration = Duration::from_millis(100);

/// The stall bound as a multiple of the fastest connect seen.
const STALL_FACTOR: u32 = 4;

/// The connection limit of one endpoint, and what it is learnt from.
#[derive(Debug)]
pub(super) struct ConnectionLimit {
    /// The configured maximum.
    max: usize,
    /// Connections the pool may hold now.
    limit: usize,
    /// At or above it the limit rises by one per stall bound, below it doubles (TCP's
    /// `ssthresh`). The maximum until the first stall.
    threshold: usize,
    /// When the current pacing window began, and the limit then.
    window_start: Instant,
    window_base: usize,
    /// When the limit was last halved.
    halved_at: Option<Instant>,
    /// The fastest connect seen.
    fastest: Option<Duration>,
    /// Connects pending past the stall bound.
    stalled: usize,
}

impl ConnectionLimit {
    /// A limit of at most `max` connections, starting at [`INITIAL`], at `now`.
    ///
    /// # Panics
    ///
    /// When `max` is 0.
    pub(super) fn new(max: usize, now: Instant) -> Self {
        assert!(max > 0, "a pool needs a connection");
        let limit = INITIAL.min(max);
        ConnectionLimit {
            max,
            limit,
            threshold: max,
            window_start: now,
            window_base: limit,
            halved_at: None,
            fastest: None,
            stalled: 0,
        }
    }

    /// Connections the pool may hold now.
    pub(super) fn get(&self) -> usize {
        self.limit
    }

    /// How long a connect may take before it counts as stalled (see the module docs); none
    /// before a connect has completed, when there is nothing to judge by.
    pub(super) fn stall_after(&self) -> Option<Duration> {
        self.fastest
            .map(|fastest| (fastest * STALL_FACTOR).max(STALL_FLOOR))
    }

    /// A request found every connection busy at `now`: raises the limit by one if it may rise
    /// (below the maximum, a connect completed and none stalled pending, within this window's
    /// pace); whether it did.
    pub(super) fn grow(&mut self, now: Instant) -> bool {
        let Some(window) = self.stall_after() else {
            return false;
        };
        if self.limit >= self.max || self.stalled > 0 {
            return false;
        }
        if now.saturating_duration_since(self.window_start) >= window {
            self.window_start = now;
            self.window_base = self.limit;
        }
        let cap = if self.window_base < self.threshold {
            (self.window_base * 2).min(self.threshold)
        } else {
            self.window_base + 1
        };
        if self.limit >= cap.min(self.max) {
            return false;
        }
        self.limit += 1;
        true
    }

    /// A connect completed in `took`.
    pub(super) fn connected(&mut self, took: Duration) {
        self.fastest = Some(self.fastest.map_or(took, |fastest| fastest.min(took)));
    }

    /// A connect begun at `started` is pending past the stall bound, or timed out, at `now`:
    /// halves the limit unless it was halved since `started`. Returns how many connections
    /// the limit lost. Call [`stall_ended`](Self::stall_ended) when that connect is over.
    pub(super) fn stalled(&mut self, started: Instant, now: Instant) -> usize {
        self.stalled += 1;
        if self.halved_at.is_some_and(|at| started < at) {
            return 0;
        }
        let before = self.limit;
        self.limit = (before / 2).max(1);
        self.threshold = self.limit;
        self.halved_at = Some(now);
        self.window_start = now;
        self.window_base = self.limit;
        before - self.limit
    }

    /// A connect reported to [`stalled`](Self::stalled) is over, connected or not.
    pub(super) fn stall_ended(&mut self) {
        self.stalled = self.stalled.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Grows at `now` until the limit stops rising; the limit then.
    fn grow_all(limit: &mut ConnectionLimit, now: Instant) -> usize {
        while limit.grow(now) {}
        limit.get()
    }

    #[test]
    fn the_limit_doubles_per_stall_bound_up_to_the_maximum() {
        let t0 = Instant::now();
        let mut limit = ConnectionLimit::new(100, t0);
        assert_eq!(limit.get(), INITIAL);
        assert!(!limit.grow(t0), "no connect has completed yet");
        limit.connected(Duration::from_micros(80));
        assert_eq!(grow_all(&mut limit, t0), 4);
        assert_eq!(
            grow_all(&mut limit, t0 + STALL_FLOOR - MS),
            4,
            "within one bound"
        );
        let rounds: Vec<usize> = (1..=7)
            .map(|k| grow_all(&mut limit, t0 + k * STALL_FLOOR))
            .collect();
        assert_eq!(rounds, [8, 16, 32, 64, 100, 100, 100]);
        let mut one = ConnectionLimit::new(1, t0);
        one.connected(Duration::from_micros(80));
        assert_eq!(one.get(), 1);
        assert!(!one.grow(t0));
    }

    #[test]
    fn a_stall_halves_the_limit_once_per_crowd_and_growth_then_goes_one_by_one() {
        let t0 = Instant::now();
        let mut limit = ConnectionLimit::new(100, t0);
        limit.connected(Duration::from_micros(80));
        for k in 0..3 {
            grow_all(&mut limit, t0 + k * STALL_FLOOR);
        }
        assert_eq!(limit.get(), 16);
        let crowd = t0 + 450 * MS;
        let stalled_at = crowd + STALL_FLOOR;
        assert_eq!(limit.stalled(crowd, stalled_at), 8);
        assert_eq!(limit.get(), 8);
        // Others of the same crowd stall too: no second halving.
        assert_eq!(limit.stalled(crowd, stalled_at + MS), 0);
        assert_eq!(limit.get(), 8);
        // No growth while they are pending.
        assert!(!limit.grow(stalled_at + 5 * STALL_FLOOR));
        limit.stall_ended();
        limit.stall_ended();
        // Then one per bound.
        let later = stalled_at + 6 * STALL_FLOOR;
        assert_eq!(grow_all(&mut limit, later), 9);
        assert_eq!(grow_all(&mut limit, later + STALL_FLOOR), 10);
        // A connect begun after the halving halves again, down to one at least.
        for k in 1..=5 {
            let begun = later + 2 * k * STALL_FLOOR;
            limit.stalled(begun, begun + STALL_FLOOR);
            limit.stall_ended();
        }
        assert_eq!(limit.get(), 1);
    }

    #[test]
    fn the_stall_bound_follows_the_fastest_connect() {
        let now = Instant::now();
        let mut near = ConnectionLimit::new(10, now);
        assert_eq!(near.stall_after(), None, "nothing to judge by yet");
        near.connected(Duration::from_micros(80));
        assert_eq!(near.stall_after(), Some(STALL_FLOOR));
        let mut far = ConnectionLimit::new(10, now);
        for took in [300, 100, 250] {
            far.connected(Duration::from_millis(took));
        }
        assert_eq!(far.stall_after(), Some(Duration::from_millis(400)));
    }
}
