//! The graceful stop: once the run loop stopped taking messages, bring every message to a
//! safe state (answered, or requeued), write out what the sink buffers and save the table.
//!
//! The order is what keeps nothing lost: the handler is told first (the serve sink closes
//! its port, and hands back what no consumer can take, so that is requeued at once rather
//! than at the end of the grace period); the consumer closes next (no new messages, the
//! running handlers' answers still taken within the grace period); only then are the
//! handlers still running abandoned (their claims erased, their messages requeued by the
//! consumer already); the sink is flushed once no handler writes to it; and the table is saved
//! once no handler changes it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::snapshot::save_snapshot;
use super::status::{log_status, Target};
use super::{RunError, RunReport};
use crate::dedup::backend::Backend;
use crate::dedup::table_file::TableFile;
use crate::nsq::{Consumer, ShutdownReport};
use crate::pipeline::Dedupe;
use crate::sink::{Handler, HandlerError};

/// How long abandoned handlers have to stop.
const ABANDON_LIMIT: Duration = Duration::from_secs(2);

/// The steps of a drain, each on what the run holds; [`drain`] takes them in order.
pub(super) trait Steps {
    /// Records still with the handler.
    fn handling(&self) -> usize;
    /// Tells the handler the stop began ([`Handler::stopping`]): the serve sink closes its
    /// port and, with no consumer, hands back at once what it holds.
    fn stop_handler(&self);
    /// Stops the source: the consumer sends CLS, REQs what it received but never handed
    /// out, waits up to `grace` for the running handlers' answers and REQs what is left.
    fn close_source(&mut self, grace: Duration) -> impl Future<Output = ShutdownReport> + Send;
    /// Drops the running handlers and erases their claims, so a redelivery is not held
    /// back by a claim nobody works on.
    fn abandon_handlers(&self);
    /// Waits up to `limit` for the handlers' tasks to end; `false` if some did not.
    fn wait_handlers(&self, limit: Duration) -> impl Future<Output = bool> + Send;
    /// Writes out what the sink buffers.
    fn flush_sink(&self) -> impl Future<Output = Result<(), HandlerError>> + Send;
    /// Stops the background tasks and saves the table to its file, if it has one.
    fn save_table(&mut self) -> impl Future<Output = Result<(), RunError>> + Send;
    /// Logs the last status line.
    fn log_stopped(&self);
}

/// Stops gracefully (see the module docs).
///
/// # Errors
///
/// [`RunError::TableFile`] if the table cannot be saved to its file.
pub(super) async fn drain(steps: &mut impl Steps, grace: Duration) -> Result<RunReport, RunError> {
    tracing::info!(grace = ?grace, messages_in_hand = steps.handling(), "Shutting down: taking no new messages; waiting for the sink to settle those in hand.");
    steps.stop_handler();
    let report = steps.close_source(grace).await;
    let abandoned = steps.handling();
    if abandoned > 0 {
        tracing::warn!(
            messages = abandoned,
            "Messages still with the sink after the grace period were requeued."
        );
    }
    // Their messages are requeued already.
    steps.abandon_handlers();
    if !steps.wait_handlers(ABANDON_LIMIT).await {
        tracing::warn!(
            records = steps.handling(),
            "Handlers did not stop within 2 s of being abandoned."
        );
    }
    if let Err(error) = steps.flush_sink().await {
        tracing::error!(%error, "Flushing the sink failed.");
    }
    // Every handler is done or abandoned: what the table holds now is final.
    steps.save_table().await?;
    steps.log_stopped();
    tracing::info!(
        requeued_unseen = report.requeued_unseen,
        requeued_at_deadline = report.requeued_at_deadline,
        clean = report.clean,
        "Connections to nsqd closed."
    );
    Ok(RunReport {
        shutdown: report,
        abandoned_handlers: abandoned,
    })
}

/// What a running sidecar holds, to drain.
pub(super) struct Running<H> {
    /// Taken when the source closes.
    pub(super) consumer: Option<Consumer>,
    /// The bursts' tasks.
    pub(super) tracker: TaskTracker,
    pub(super) dedupe: Dedupe<Backend, H>,
    pub(super) table_file: Option<Arc<TableFile>>,
    /// Stops the background tasks (status line, snapshots, endpoints).
    pub(super) background: CancellationToken,
    pub(super) target: Target,
}

impl<H: Handler> Steps for Running<H> {
    fn handling(&self) -> usize {
        self.dedupe.handling()
    }

    fn stop_handler(&self) {
        self.dedupe.handler().stopping();
    }

    async fn close_source(&mut self, grace: Duration) -> ShutdownReport {
        let consumer = self.consumer.take();
        let consumer = consumer.expect("a drain closes the source once");
        let report = consumer.shutdown(grace).await;
        self.tracker.close();
        report
    }

    fn abandon_handlers(&self) {
        self.dedupe.abandon();
    }

    async fn wait_handlers(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.tracker.wait())
            .await
            .is_ok()
    }

    async fn flush_sink(&self) -> Result<(), HandlerError> {
        self.dedupe.handler().flush().await
    }

    async fn save_table(&mut self) -> Result<(), RunError> {
        let Some(file) = &self.table_file else {
            return Ok(());
        };
        self.background.cancel();
        let report = save_snapshot(file.clone(), self.dedupe.clone()).await?;
        tracing::info!(table_file = %file.path().display(), bytes = report.bytes, took = ?report.took, "Table saved to its file.");
        Ok(())
    }

    /// The last status line, on rates sampled now: the second's samples may not have come
    /// since the last messages, which the line (and its "too small" warning) would leave out.
    fn log_stopped(&self) {
        self.dedupe.metrics().sample_rate();
        log_status(&self.dedupe, self.target, "Sidecar stopped.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Steps that record their order; `handling` is what each step leaves with the handler.
    #[derive(Default)]
    struct Recorder {
        steps: Mutex<Vec<&'static str>>,
        handling: Mutex<usize>,
        /// Handlers left after the grace period.
        left_at_deadline: usize,
        handlers_stop: bool,
        flush_fails: bool,
        save_fails: bool,
    }

    impl Recorder {
        fn note(&self, step: &'static str) {
            self.steps.lock().unwrap().push(step);
        }
        fn steps(&self) -> Vec<&'static str> {
            self.steps.lock().unwrap().clone()
        }
    }

    impl Steps for Recorder {
        fn handling(&self) -> usize {
            *self.handling.lock().unwrap()
        }
        fn stop_handler(&self) {
            self.note("stop handler");
        }
        async fn close_source(&mut self, grace: Duration) -> ShutdownReport {
            assert_eq!(grace, Duration::from_secs(7));
            self.note("close source");
            *self.handling.lock().unwrap() = self.left_at_deadline;
            ShutdownReport {
                requeued_unseen: 0,
                requeued_at_deadline: self.left_at_deadline,
                clean: self.left_at_deadline == 0,
            }
        }
        fn abandon_handlers(&self) {
            self.note("abandon handlers");
        }
        async fn wait_handlers(&self, limit: Duration) -> bool {
            assert_eq!(limit, ABANDON_LIMIT);
            self.note("wait for handlers");
            if self.handlers_stop {
                *self.handling.lock().unwrap() = 0;
            }
            self.handlers_stop
        }
        async fn flush_sink(&self) -> Result<(), HandlerError> {
            self.note("flush sink");
            match self.flush_fails {
                true => Err(HandlerError::Retry("disk full".into())),
                false => Ok(()),
            }
        }
        async fn save_table(&mut self) -> Result<(), RunError> {
            self.note("save table");
            match self.save_fails {
                true => Err(RunError::FileSink {
                    setting: crate::wording::Named::key("sink.output_dir"),
                    reason: "read-only".into(),
                }),
                false => Ok(()),
            }
        }
        fn log_stopped(&self) {
            self.note("log stopped");
        }
    }

    const ORDER: [&str; 7] = [
        "stop handler",
        "close source",
        "abandon handlers",
        "wait for handlers",
        "flush sink",
        "save table",
        "log stopped",
    ];

    fn drained(steps: &mut Recorder) -> Result<RunReport, RunError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(drain(steps, Duration::from_secs(7)))
    }

    #[test]
    fn the_source_closes_then_handlers_end_then_the_sink_flushes_then_the_table_is_saved() {
        let mut steps = Recorder {
            handlers_stop: true,
            ..Recorder::default()
        };
        let report = drained(&mut steps).expect("drained");
        assert_eq!(steps.steps(), ORDER);
        assert_eq!(report.abandoned_handlers, 0);
        assert!(report.shutdown.clean);
    }

    #[test]
    fn handlers_left_after_the_grace_period_are_reported_as_abandoned() {
        let mut steps = Recorder {
            left_at_deadline: 3,
            ..Recorder::default()
        };
        let report = drained(&mut steps).expect("drained");
        assert_eq!(steps.steps(), ORDER);
        assert_eq!(report.abandoned_handlers, 3);
        assert_eq!(report.shutdown.requeued_at_deadline, 3);
    }

    #[test]
    fn a_failed_flush_still_saves_the_table() {
        let mut steps = Recorder {
            flush_fails: true,
            ..Recorder::default()
        };
        drained(&mut steps).expect("a failed flush is logged, not returned");
        assert_eq!(steps.steps(), ORDER);
    }

    #[test]
    fn a_table_that_cannot_be_saved_is_the_run_s_error() {
        let mut steps = Recorder {
            save_fails: true,
            ..Recorder::default()
        };
        let error = drained(&mut steps).expect_err("the save failed");
        assert!(matches!(error, RunError::FileSink { .. }), "{error:?}");
        assert_eq!(steps.steps(), ORDER[..6]);
    }
}
