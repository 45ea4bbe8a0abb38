//! The serve endpoint's figures on the sidecar's `/metrics` page: its consumers, what it
//! served them and how they answered. Read from the dispatcher at each scrape.

use std::sync::Arc;

use super::dispatch::DispatchStats;
use super::Shared;
use crate::metrics::{HandlerFigures, HandlerMetrics};

/// The endpoint as the metrics page reads it.
pub(crate) struct ServeMetrics(pub(crate) Arc<Shared>);

impl std::fmt::Debug for ServeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeMetrics")
            .field("tcp_address", &self.0.tcp_address)
            .finish()
    }
}

impl HandlerMetrics for ServeMetrics {
    fn figures(&self) -> HandlerFigures {
        figures(&self.0.dispatcher.stats())
    }
}

/// The figures of one snapshot.
fn figures(stats: &DispatchStats) -> HandlerFigures {
    let c = &stats.counters;
    HandlerFigures {
        counters: vec![
            (
                "nsq_dedupe_serve_messages",
                "Messages sent to consumers of the served port; one handed back and served again counts again.",
                c.delivered,
            ),
            (
                "nsq_dedupe_serve_fins",
                "FINs from consumers: messages delivered.",
                c.finished,
            ),
            (
                "nsq_dedupe_serve_reqs",
                "REQs from consumers: claims erased, messages requeued upstream.",
                c.requeued,
            ),
            (
                "nsq_dedupe_serve_timeouts",
                "Messages a consumer did not answer within its msg_timeout, requeued upstream.",
                c.timed_out,
            ),
            (
                "nsq_dedupe_serve_disconnect_requeues",
                "Messages in flight to a consumer when it disconnected, requeued upstream.",
                c.abandoned,
            ),
        ],
        gauges: vec![(
            "nsq_dedupe_serve_consumers",
            "Consumers connected to the served port and subscribed.",
            stats.consumers.len() as f64,
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::serve::ServeCounters;

    #[test]
    fn each_figure_is_its_own_counter() {
        let stats = DispatchStats {
            waiting: 0,
            in_flight: 0,
            counters: ServeCounters {
                delivered: 1,
                finished: 2,
                requeued: 3,
                touched: 4,
                timed_out: 5,
                abandoned: 6,
            },
            consumers: Vec::new(),
        };
        let figures = figures(&stats);
        let values: Vec<(&str, u64)> = figures
            .counters
            .iter()
            .map(|&(name, _, value)| (name, value))
            .collect();
        assert_eq!(
            values,
            [
                ("nsq_dedupe_serve_messages", 1),
                ("nsq_dedupe_serve_fins", 2),
                ("nsq_dedupe_serve_reqs", 3),
                ("nsq_dedupe_serve_timeouts", 5),
                ("nsq_dedupe_serve_disconnect_requeues", 6),
            ]
        );
        assert_eq!(
            figures.gauges[0].0, "nsq_dedupe_serve_consumers",
            "{figures:?}"
        );
        assert_eq!(figures.gauges[0].2, 0.0);
    }
}
