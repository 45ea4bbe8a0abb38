//! The run loop: takes bursts from the consumer and hands each to its own task until
//! something stops the run, and says what did.

use std::future::Future;
use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::{RunError, RunReport};
use crate::dedup::backend::Backend;
use crate::nsq::Consumer;
use crate::pipeline::Dedupe;
use crate::sink::{Handler, Watch, Watched};

/// A future that completes with a refusal no retry changes.
pub(super) type Refusal = Watched<Arc<crate::nsq::Error>>;

/// Why the run loop stopped taking messages.
#[derive(Debug)]
pub(super) enum Stop {
    /// The caller's `shutdown` future completed (a signal, for the binary).
    Shutdown,
    /// The consumer has no more messages to give.
    SourceEnded,
    /// An nsqd refused this client in a way no retry changes: the source's, the nsq sink's
    /// or the dead-letter's.
    Refused(Arc<crate::nsq::Error>),
    /// The sink's output was closed for good.
    SinkClosed(std::io::Error),
}

impl Stop {
    /// The run's result once drained: a refusal or a closed sink is an error (the run
    /// stopped gracefully all the same), a shutdown or the end of the source is not.
    pub(super) fn into_result(self, report: RunReport) -> Result<RunReport, RunError> {
        match self {
            Stop::Shutdown | Stop::SourceEnded => Ok(report),
            Stop::Refused(error) => Err(RunError::Refused(error)),
            Stop::SinkClosed(error) => Err(RunError::SinkClosed(error)),
        }
    }
}

/// Takes bursts from `consumer`, each processed in a task of `tracker`, until `shutdown`
/// completes, an nsqd refuses this client, the sink's output closes (what `sink` watches) or
/// the consumer ends.
pub(super) async fn consume<H: Handler>(
    consumer: &mut Consumer,
    dedupe: &Dedupe<Backend, H>,
    tracker: &TaskTracker,
    sink: Watch,
    dead_letter_refused: Option<Refusal>,
    shutdown: impl Future,
) -> Stop {
    tokio::pin!(shutdown);
    let mut sink_closed = sink
        .closed
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    let nsqd_refused = consumer.refused();
    tokio::pin!(nsqd_refused);
    // A producer's refusal (the nsq sink's or dead-letter's nsqd) stops the run as the
    // consumer's does: a misconfiguration must be seen, not retried for ever.
    let mut sink_refused = sink
        .refused
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    let mut dead_letter_refused =
        dead_letter_refused.unwrap_or_else(|| Box::pin(std::future::pending()));
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => return Stop::Shutdown,
            error = &mut nsqd_refused => return Stop::Refused(error),
            error = &mut sink_refused => {
                tracing::error!(%error, "The nsq sink's nsqd refused this client; stopping.");
                return Stop::Refused(error);
            }
            error = &mut dead_letter_refused => {
                tracing::error!(%error, "The dead-letter's nsqd refused this client; stopping.");
                return Stop::Refused(error);
            }
            error = &mut sink_closed => {
                tracing::error!(%error, "The sink's output was closed; stopping.");
                return Stop::SinkClosed(error);
            }
            burst = consumer.next_burst() => match burst {
                Some(burst) => {
                    let dedupe = dedupe.clone();
                    tracker.spawn(async move { dedupe.process_batch(burst).await });
                }
                None => return Stop::SourceEnded,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::ShutdownReport;

    fn report() -> RunReport {
        RunReport {
            shutdown: ShutdownReport {
                requeued_unseen: 1,
                requeued_at_deadline: 2,
                clean: true,
            },
            abandoned_handlers: 3,
        }
    }

    #[test]
    fn a_shutdown_or_the_end_of_the_source_is_a_clean_stop() {
        for stop in [Stop::Shutdown, Stop::SourceEnded] {
            let done = stop.into_result(report()).expect("a clean stop");
            assert_eq!(done.abandoned_handlers, 3);
            assert_eq!(done.shutdown.requeued_at_deadline, 2);
        }
    }

    #[test]
    fn a_refusal_stops_with_its_cause_and_is_not_a_setting_error() {
        let cause = Arc::new(crate::nsq::Error::Refused {
            addr: "127.0.0.1:4150".into(),
            command: "AUTH",
            text: "E_AUTH_FAILED".into(),
            advice: "give the secret nsqd expects".into(),
        });
        let error = Stop::Refused(cause.clone())
            .into_result(report())
            .expect_err("a refusal is an error");
        assert!(
            matches!(&error, RunError::Refused(refused) if Arc::ptr_eq(refused, &cause)),
            "{error:?}"
        );
        // The binary's exit status: a refusal is not `EX_CONFIG`.
        assert!(!error.is_setting());
        assert_eq!(error.to_string(), "stopped");
        let source = std::error::Error::source(&error).expect("the refusal is the cause");
        assert!(source.to_string().contains("E_AUTH_FAILED"), "{source}");
    }

    #[test]
    fn a_closed_sink_stops_with_its_cause() {
        let cause = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let error = Stop::SinkClosed(cause)
            .into_result(report())
            .expect_err("a closed sink is an error");
        let RunError::SinkClosed(cause) = &error else {
            panic!("{error:?}");
        };
        assert_eq!(cause.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(!error.is_setting());
        assert_eq!(error.to_string(), "the sink's output was closed; stopped");
        // The binary exits 0 for a reader that went away: it finds the broken pipe in the
        // chain.
        let source = std::error::Error::source(&error).expect("the closed output is the cause");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("an I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
