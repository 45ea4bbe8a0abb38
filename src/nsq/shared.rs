//! State shared by the consumer's tasks and its messages, and what the tasks tell the
//! control task.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::backoff::Signal;
use super::config::ConsumerConfig;
use super::connection::ConnHandle;
use super::delegate::MessageDelegate;
use super::error::Error;
use super::events::{ConsumerEvent, ShutdownReport};
use crate::metrics::inc;

/// The consumer's counters; [`Consumer::stats`](super::Consumer::stats) reads them.
///
/// Aligned to 128 bytes (two cache lines, as the CPU prefetches them in pairs): an `Arc` of
/// [`ConsumerShared`] is cloned for every message read and dropped for every message answered,
/// often on another core, and its reference count must not share a line with counters that
/// other cores write.
#[derive(Default)]
#[repr(align(128))]
pub(super) struct Counters {
    pub(super) messages_received: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) requeued: AtomicU64,
    pub(super) touched: AtomicU64,
    pub(super) non_fatal_errors: AtomicU64,
    pub(super) heartbeats: AtomicU64,
    pub(super) connects: AtomicU64,
    pub(super) disconnects: AtomicU64,
    pub(super) max_attempts_exceeded: AtomicU64,
    pub(super) connections: AtomicU64,
    pub(super) rdy_total: AtomicU64,
    pub(super) requeued_at_deadline: AtomicU64,
}

/// State shared by the consumer's tasks and its messages.
pub(crate) struct ConsumerShared {
    pub(super) counters: Counters,
    pub(super) default_requeue_delay: Duration,
    pub(super) max_requeue_delay: Duration,
    /// True while backing off on handler failures: only then do finishes report to the
    /// control task.
    pub(super) backoff_active: AtomicBool,
    /// True while backing off for an outage: only then does its end report to the control
    /// task.
    pub(super) outage_active: AtomicBool,
    /// True once shutdown began: dropped messages are requeued with no delay.
    pub(super) shutting_down: AtomicBool,
    /// True while a `Control::Rebalance` is queued and not yet handled.
    pub(super) rebalance_pending: AtomicBool,
    pub(super) control: mpsc::UnboundedSender<Control>,
    pub(super) events: broadcast::Sender<ConsumerEvent>,
    /// The first refusal no retry can change; see [`Consumer::refused`](super::Consumer::refused).
    pub(super) refused: watch::Sender<Option<Arc<Error>>>,
}

impl MessageDelegate for ConsumerShared {
    fn default_requeue_delay(&self, attempts: u16) -> Duration {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        self.default_requeue_delay
            .saturating_mul(u32::from(attempts.max(1)))
            .min(self.max_requeue_delay)
    }

    fn clamp_requeue_delay(&self, delay: Duration) -> Duration {
        delay.min(self.max_requeue_delay)
    }

    fn on_finished(&self, count: u64) {
        self.counters.finished.fetch_add(count, Ordering::Relaxed);
        if self.backoff_active.load(Ordering::Relaxed) {
            for _ in 0..count {
                let _ = self
                    .control
                    .send(Control::Backoff(Signal::HandlerSucceeded, None));
            }
        }
    }

    fn on_requeued(&self, backoff: bool) {
        inc(&self.counters.requeued);
        if backoff {
            let _ = self
                .control
                .send(Control::Backoff(Signal::HandlerFailed, None));
        }
    }

    fn on_outage(&self, lowered: oneshot::Sender<()>) {
        let _ = self
            .control
            .send(Control::Backoff(Signal::Outage, Some(lowered)));
    }

    fn on_outage_over(&self) {
        // Relaxed: a report that comes a moment late ends the pause at the next one.
        if self.outage_active.load(Ordering::Relaxed) {
            let _ = self
                .control
                .send(Control::Backoff(Signal::OutageOver, None));
        }
    }

    fn on_touched(&self) {
        inc(&self.counters.touched);
    }

    fn on_parked(&self) {
        // One pending rebalance covers every change made before it runs.
        if !self.rebalance_pending.swap(true, Ordering::AcqRel) {
            let _ = self.control.send(Control::Rebalance);
        }
    }
}

impl ConsumerShared {
    /// Fresh state for a consumer of `config` whose control task listens on `control`.
    pub(super) fn new(config: &ConsumerConfig, control: mpsc::UnboundedSender<Control>) -> Self {
        let (events, _) = broadcast::channel(1024);
        ConsumerShared {
            counters: Counters::default(),
            default_requeue_delay: config.default_requeue_delay,
            max_requeue_delay: config.max_requeue_delay,
            backoff_active: AtomicBool::new(false),
            outage_active: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            rebalance_pending: AtomicBool::new(false),
            control,
            events,
            refused: watch::Sender::new(None),
        }
    }

    /// Records `error` as the consumer's refusal, unless one was recorded before.
    pub(super) fn refuse(&self, error: Error) {
        self.refused.send_if_modified(|refused| {
            if refused.is_some() {
                return false;
            }
            *refused = Some(Arc::new(error));
            true
        });
    }

    pub(super) fn event(&self, event: ConsumerEvent) {
        // No receivers is fine: events are optional.
        let _ = self.events.send(event);
    }
}

/// What the consumer's tasks tell its control task.
pub(crate) enum Control {
    Up {
        addr: Arc<str>,
        conn: Arc<ConnHandle>,
        max_rdy: u32,
    },
    Down {
        addr: Arc<str>,
    },
    /// A message's outcome that backing off depends on, and who waits until RDY is set for
    /// it (dropped then).
    Backoff(Signal, Option<oneshot::Sender<()>>),
    /// Messages were set aside or taken back: RDY is computed again.
    Rebalance,
    Lookup(Vec<(String, Result<Vec<String>, Error>)>),
    Shutdown {
        grace: Duration,
        done: oneshot::Sender<ShutdownReport>,
    },
}
