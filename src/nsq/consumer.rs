//! The consumer: subscribes to one topic/channel on many nsqd and hands out [`Message`]s.
//!
//! Tasks and who owns what:
//!
//! - one *supervisor* task per nsqd address connects, subscribes, reads frames and reconnects
//!   with jittered exponential backoff that never gives up; each live connection also has a
//!   [`Writer`] task that owns the socket's write half;
//! - one *control* task owns the table of connections and decides every `RDY`: the sum over
//!   connections never exceeds `max_in_flight`, connections take turns when there are more of
//!   them than `max_in_flight` (go-nsq's redistribution), and handler failures back off like
//!   go-nsq. It also polls nsqlookupd, joining new nsqd and draining vanished ones;
//! - the [`Consumer`] itself is the receiving end of the message channel.
//!
//! RDY accounting is conservative: a connection whose RDY was lowered keeps counting with its
//! old value for [`RDY_SETTLE`](super::rdy::RDY_SETTLE) (so nsqd has applied the decrease before another connection is
//! raised) and with its in-flight count for as long as messages are unanswered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::ConsumerConfig;
use super::control::ControlTask;
use super::error::Error;
use super::events::{ConsumerEvent, ConsumerStats, ShutdownReport};
use super::message::{Answer, Message};
use super::refusal::Role;
use super::shared::{ConsumerShared, Control};

/// Consumes one topic/channel from many nsqd.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use nsq_dedupe::nsq::{Consumer, ConsumerConfig};
///
/// # async fn example() -> Result<(), nsq_dedupe::nsq::Error> {
/// let mut config = ConsumerConfig::new("events", "dedupe");
/// config.lookupd_http_addresses = vec!["http://127.0.0.1:4161".into()];
/// config.max_in_flight = 200;
/// let mut consumer = Consumer::new(config)?;
/// let stop = tokio::time::sleep(Duration::from_secs(60));
/// tokio::pin!(stop);
/// loop {
///     tokio::select! {
///         Some(message) = consumer.next() => {
///             tokio::spawn(async move {
///                 // ... async work with message.body() ...
///                 if let Err(error) = message.finish() {
///                     tracing::warn!(%error, "FIN failed; nsqd will redeliver.");
///                 }
///             });
///         }
///         _ = &mut stop => break,
///     }
/// }
/// let report = consumer.shutdown(Duration::from_secs(5)).await;
/// assert!(report.clean);
/// # Ok(())
/// # }
/// ```
pub struct Consumer {
    /// Receiving end of the message channel, a burst at a time; the supervisors hold the
    /// senders.
    messages: mpsc::UnboundedReceiver<Vec<Message>>,
    /// What is left of the burst [`next`](Self::next) is handing out, in reverse order.
    pending: Vec<Message>,
    shared: Arc<ConsumerShared>,
    /// Cancelled on drop: every task stops and closes its socket at once.
    hard_stop: CancellationToken,
    control_task: Option<JoinHandle<()>>,
}

impl Consumer {
    /// Validates `config` and starts connecting in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the first invalid setting.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn new(config: ConsumerConfig) -> Result<Consumer, Error> {
        config.validate()?;
        let transport = config.transport.prepare_for(Role::Consumer)?;
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(ConsumerShared::new(&config, control_tx.clone()));
        let (msg_tx, messages) = mpsc::unbounded_channel();
        let hard_stop = CancellationToken::new();
        let control = ControlTask::new(
            config,
            transport,
            shared.clone(),
            (control_tx, control_rx),
            msg_tx,
            hard_stop.clone(),
        );
        let control_task = tokio::spawn(control.run());
        Ok(Consumer {
            messages,
            pending: Vec::new(),
            shared,
            hard_stop,
            control_task: Some(control_task),
        })
    }

    /// The next message, in arrival order over all connections.
    ///
    /// Waits while no message is available; returns `None` only once the consumer has stopped.
    /// Cancel-safe: use it in `select!`.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(message) = self.pending.pop() {
            return Some(message);
        }
        let mut burst = self.messages.recv().await?;
        burst.reverse();
        self.pending = burst;
        self.pending.pop()
    }

    /// The next burst: every message one connection's reader found at once (at least one), in
    /// arrival order. Interleaves with [`next`](Self::next) without losing or reordering any.
    ///
    /// Waits while no message is available; returns `None` only once the consumer has stopped.
    /// Cancel-safe: use it in `select!`.
    pub async fn next_burst(&mut self) -> Option<Vec<Message>> {
        if !self.pending.is_empty() {
            let mut rest = std::mem::take(&mut self.pending);
            rest.reverse();
            return Some(rest);
        }
        self.messages.recv().await
    }

    /// A subscription to the consumer's events from now on. A receiver that falls more than
    /// 1024 events behind loses the oldest.
    pub fn events(&self) -> broadcast::Receiver<ConsumerEvent> {
        self.shared.events.subscribe()
    }

    /// Completes with the first refusal of an nsqd that no retry can change
    /// ([`Error::is_permanent`]): settings nsqd does not accept, a name it refuses, AUTH or TLS
    /// it requires. The consumer has stopped reconnecting to that nsqd; the error names the
    /// setting to change. Never completes while every refusal is transient.
    /// The future does not borrow the consumer, so it can wait beside [`next`](Self::next).
    pub fn refused(&self) -> impl std::future::Future<Output = Arc<Error>> + Send + 'static {
        let mut refused = self.shared.refused.subscribe();
        async move {
            let error = match refused.wait_for(Option::is_some).await {
                Ok(error) => error.clone(),
                Err(_) => None,
            };
            match error {
                Some(error) => error,
                // The sender lives as long as the consumer's tasks: once they are gone,
                // nothing will ever be refused.
                None => std::future::pending().await,
            }
        }
    }

    /// A handle that reads how many nsqd connections are up and subscribed, without borrowing
    /// the consumer.
    pub fn connection_count(&self) -> ConnectionCount {
        ConnectionCount(self.shared.clone())
    }

    /// A snapshot of the consumer's counters.
    pub fn stats(&self) -> ConsumerStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConsumerStats {
            messages_received: get(&c.messages_received),
            finished: get(&c.finished),
            requeued: get(&c.requeued),
            touched: get(&c.touched),
            non_fatal_errors: get(&c.non_fatal_errors),
            heartbeats: get(&c.heartbeats),
            connects: get(&c.connects),
            disconnects: get(&c.disconnects),
            max_attempts_exceeded: get(&c.max_attempts_exceeded),
            connections: get(&c.connections),
            rdy_total: get(&c.rdy_total),
        }
    }

    /// Stops gracefully: sends `CLS` on every connection (nsqd answers `CLOSE_WAIT` and sends
    /// no more), requeues at once the messages received but never handed out, lets the
    /// messages handed out be finished or requeued for up to `grace`, then requeues whatever is
    /// still unanswered and closes the connections. Nothing is left in flight unknowingly.
    ///
    /// Answers arriving after this returns fail with [`Error::NotInFlight`] or
    /// [`Error::ConnectionClosed`].
    pub async fn shutdown(mut self, grace: Duration) -> ShutdownReport {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let (done, done_rx) = oneshot::channel();
        let _ = self.shared.control.send(Control::Shutdown { grace, done });
        // Messages that reach the channel from now on are dropped by the channel, which
        // requeues them with no delay (see `Message`'s drop).
        self.messages.close();
        let mut requeued_unseen = 0;
        let mut unseen = std::mem::take(&mut self.pending);
        while let Ok(burst) = self.messages.try_recv() {
            unseen.extend(burst);
        }
        let answer = Answer::Requeue {
            delay: Some(Duration::ZERO),
            backoff: false,
        };
        let answers = unseen
            .into_iter()
            .map(|message| (message, answer))
            .collect();
        requeued_unseen += Message::answer_all(answers)
            .iter()
            .filter(|r| r.is_ok())
            .count();
        let mut report = match tokio::time::timeout(grace + Duration::from_secs(5), done_rx).await {
            Ok(Ok(report)) => report,
            _ => ShutdownReport::default(),
        };
        report.requeued_unseen += requeued_unseen;
        if let Some(task) = self.control_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        report
    }
}

/// Reads a consumer's live connection count; see [`Consumer::connection_count`].
#[derive(Clone)]
pub struct ConnectionCount(Arc<ConsumerShared>);

impl ConnectionCount {
    /// nsqd connections up and subscribed now.
    pub fn get(&self) -> u64 {
        self.0.counters.connections.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for ConnectionCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ConnectionCount").field(&self.get()).finish()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.hard_stop.cancel();
    }
}
