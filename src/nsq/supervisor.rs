//! One task per nsqd: connects, subscribes, reads frames, hands messages out, and on failure
//! waits with jittered exponential backoff and reconnects, never giving up.
//!
//! Messages are handed out in bursts: every message decoded from what one wake-up of the
//! reader found (up to [`MAX_BURST`]) goes out as one `Vec`, so the pipeline pays its
//! per-hand-off costs (a channel send, a task, a wake-up, a sink request, a write of
//! answers) once per burst, not once per message.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::ConsumerConfig;
use super::connection::{ConnHandle, Connection, Writer};
use super::delegate::MessageDelegate as _;
use super::error::{broker_error, Error};
use super::events::ConsumerEvent;
use super::frame::{is_non_fatal_error, Command, Frame, HEARTBEAT};
use super::identify::Identify;
use super::jitter::random_unit;
use super::message::{Answer, Message};
use super::shared::{ConsumerShared, Control};
use super::transport::Prepared;
use crate::metrics::inc;

/// The most messages handed out as one burst.
pub(crate) const MAX_BURST: usize = 1024;

/// Keeps one nsqd connected: connect, subscribe, serve, and on failure wait and reconnect.
pub(super) struct Supervisor {
    pub(super) addr: Arc<str>,
    pub(super) config: Arc<ConsumerConfig>,
    pub(super) identify: Arc<Identify>,
    pub(super) transport: Prepared,
    pub(super) shared: Arc<ConsumerShared>,
    /// To the control task; sends fail harmlessly once it has stopped.
    pub(super) control: mpsc::UnboundedSender<Control>,
    /// To the [`Consumer`](super::Consumer), a burst at a time; once it is closed, messages
    /// are requeued.
    pub(super) messages: mpsc::UnboundedSender<Vec<Message>>,
    pub(super) hard_stop: CancellationToken,
    /// `Some(deadline)`: drain this connection and stop, requeueing what is unanswered at the
    /// deadline.
    pub(super) drain: watch::Receiver<Option<Instant>>,
}

/// How a served connection ended.
enum Served {
    /// Drained on request; do not reconnect.
    Drained,
    /// The consumer was dropped.
    Stopped,
}

impl Supervisor {
    pub(super) async fn run(mut self) {
        let mut attempt: u32 = 0;
        // The last failure's text: a failure like the one before is logged again only at
        // attempts 2, 4, 8, ..., so a long outage is summarised, not repeated every retry.
        let mut last_failure = String::new();
        loop {
            if self.hard_stop.is_cancelled() || self.drain.borrow().is_some() {
                return;
            }
            let connected = Connection::connect(
                &self.addr,
                &self.identify,
                &self.transport,
                self.config.max_frame_size,
                self.config.connect_timeout,
            )
            .await;
            let result = match connected {
                Ok(mut conn) => match conn
                    .subscribe(&self.config.topic, &self.config.channel)
                    .await
                {
                    Ok(()) => {
                        attempt = 0;
                        last_failure.clear();
                        Ok(self.serve(conn).await)
                    }
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
            let failure = match result {
                Ok(Ok(Served::Drained | Served::Stopped)) => return,
                Ok(Err(_)) => None,
                Err(error) if error.is_permanent() => return self.refused(error),
                Err(error) => Some(error),
            };
            if self.hard_stop.is_cancelled() || self.drain.borrow().is_some() {
                return;
            }
            attempt = attempt.saturating_add(1);
            let base = self
                .config
                .reconnect_backoff_min
                .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
                .min(self.config.reconnect_backoff_max);
            // Jitter in [base/2, base): reconnecting consumers do not stampede a restarted nsqd.
            let delay = base.mul_f64(0.5 + 0.5 * random_unit());
            if let Some(error) = failure {
                self.connect_failed(&error, attempt, delay, &mut last_failure);
            }
            self.shared.event(ConsumerEvent::ReconnectScheduled {
                addr: self.addr.to_string(),
                attempt,
                delay,
            });
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.hard_stop.cancelled() => return,
                _ = self.drain.wait_for(|d| d.is_some()) => return,
            }
        }
    }

    /// One log line per failed attempt: the address, the error and when the next attempt is.
    fn connect_failed(&self, error: &Error, attempt: u32, retry_in: Duration, last: &mut String) {
        let text = error.to_string();
        let retry_in_ms = retry_in.as_millis() as u64;
        if text != *last {
            tracing::warn!(nsqd = %self.addr, error = %text, attempt, retry_in_ms, "Could not connect to nsqd; retrying.");
        } else if attempt.is_power_of_two() {
            tracing::warn!(nsqd = %self.addr, error = %text, attempt, retry_in_ms, "Still cannot connect to nsqd; retrying.");
        }
        self.shared.event(ConsumerEvent::ConnectFailed {
            addr: self.addr.to_string(),
            error: text.clone(),
        });
        *last = text;
    }

    /// nsqd refused this client for good: stop reconnecting and tell the consumer's owner.
    fn refused(&self, error: Error) {
        tracing::error!(nsqd = %self.addr, %error, "nsqd refused this client; not reconnecting.");
        self.shared.event(ConsumerEvent::Refused {
            addr: self.addr.to_string(),
            error: error.to_string(),
        });
        self.shared.refuse(error);
    }

    /// Runs one subscribed connection until it fails, is drained, or the consumer is dropped.
    async fn serve(&mut self, conn: Connection) -> Result<Served, Error> {
        let max_rdy = conn.settings().max_rdy_count;
        let (reader, write) = conn.into_parts();
        let (handle, commands) = ConnHandle::new(self.addr.clone(), self.shared.clone());
        let close = CancellationToken::new();
        let writer = tokio::spawn(
            Writer {
                write,
                commands,
                close: close.clone(),
            }
            .run(),
        );
        inc(&self.shared.counters.connects);
        tracing::info!(nsqd = %self.addr, "Connected to nsqd and subscribed.");
        self.shared.event(ConsumerEvent::Connected {
            addr: self.addr.to_string(),
        });
        let _ = self.control.send(Control::Up {
            addr: self.addr.clone(),
            conn: handle.clone(),
            max_rdy,
        });

        let result = self.read_loop(reader, &handle).await;

        handle.mark_closed();
        close.cancel();
        // The writer flushes what is queued; a peer that stopped reading must not keep the
        // task (and the socket) alive.
        let mut writer = writer;
        if tokio::time::timeout(Duration::from_secs(1), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        let _ = self.control.send(Control::Down {
            addr: self.addr.clone(),
        });
        if let Err(error) = &result {
            let in_flight = handle.in_flight();
            inc(&self.shared.counters.disconnects);
            tracing::warn!(nsqd = %self.addr, %error, in_flight, "Connection to nsqd lost; its unanswered messages will be redelivered by nsqd after msg_timeout.");
            self.shared.event(ConsumerEvent::Disconnected {
                addr: self.addr.to_string(),
                error: error.to_string(),
                in_flight,
            });
        }
        result
    }

    async fn read_loop(
        &mut self,
        mut reader: tokio_util::codec::FramedRead<
            super::stream::ReadHalf,
            super::frame::FrameCodec,
        >,
        handle: &Arc<ConnHandle>,
    ) -> Result<Served, Error> {
        let addr = self.addr.clone();
        let heartbeat = self.config.heartbeat_interval;
        // nsqd closes a client after two missed heartbeats; we give nsqd the same plus slack.
        let silence_limit = heartbeat * 2 + heartbeat / 2;
        let mut last_frame = Instant::now();
        let mut watchdog = tokio::time::interval(heartbeat / 2);
        let mut draining: Option<Instant> = None;
        let mut close_wait = false;
        let mut drain_poll = tokio::time::interval(Duration::from_millis(10));
        loop {
            if let Some(deadline) = draining {
                let now = Instant::now();
                if (close_wait && handle.in_flight() == 0) || now >= deadline {
                    let left = handle.take_in_flight();
                    for id in &left {
                        let _ = handle.send(Command::Req(*id, 0));
                        self.shared.on_requeued(false);
                    }
                    if !left.is_empty() {
                        tracing::warn!(nsqd = %addr, count = left.len(), "Grace period over; requeued unanswered messages.");
                        self.shared
                            .counters
                            .requeued_at_deadline
                            .fetch_add(left.len() as u64, Ordering::Relaxed);
                    }
                    return Ok(Served::Drained);
                }
            }
            tokio::select! {
                frame = reader.next() => {
                    last_frame = Instant::now();
                    let mut frame = frame;
                    let mut burst = Vec::new();
                    // Counted once per burst: the counter is shared by every core that answers.
                    let mut received = 0;
                    // The first frame, then every frame that is ready without waiting.
                    let ended = loop {
                        let decoded = match frame {
                            None => break Some(Err(Error::ConnectionClosed { addr: addr.to_string() })),
                            Some(Err(cause)) => break Some(Err(Error::Protocol { addr: addr.to_string(), cause })),
                            Some(Ok(decoded)) => decoded,
                        };
                        received += u64::from(matches!(decoded, Frame::Message(_)));
                        if let Err(error) = self.on_frame(decoded, handle, &mut close_wait, &mut burst) {
                            break Some(Err(error));
                        }
                        if burst.len() >= MAX_BURST {
                            break None;
                        }
                        match reader.next().now_or_never() {
                            Some(next) => frame = next,
                            None => break None,
                        }
                    };
                    self.shared.counters.messages_received.fetch_add(received, Ordering::Relaxed);
                    // Tracked once per burst: the in-flight set's lock is taken by every core
                    // that answers.
                    handle.track(burst.iter().map(|message| *message.id()));
                    self.hand_out(burst);
                    if let Some(ended) = ended {
                        return ended;
                    }
                }
                changed = self.drain.changed(), if draining.is_none() => {
                    match changed {
                        Ok(()) => {
                            if let Some(deadline) = *self.drain.borrow_and_update() {
                                draining = Some(deadline);
                                handle.send(Command::Cls)?;
                            }
                        }
                        // The control task is gone without asking for a drain: stop.
                        Err(_) => return Ok(Served::Stopped),
                    }
                }
                _ = drain_poll.tick(), if draining.is_some() => {}
                _ = watchdog.tick() => {
                    if last_frame.elapsed() > silence_limit {
                        return Err(Error::Timeout {
                            addr: addr.to_string(),
                            what: "waiting for any frame (heartbeats stopped)",
                            after: silence_limit,
                            knob: "heartbeat_interval",
                        });
                    }
                }
                _ = self.hard_stop.cancelled() => return Ok(Served::Stopped),
            }
        }
    }

    /// Hands a burst to the consumer, or requeues it at once if the consumer is shutting down.
    fn hand_out(&self, burst: Vec<Message>) {
        if burst.is_empty() {
            return;
        }
        if let Err(mpsc::error::SendError(burst)) = self.messages.send(burst) {
            let answers = burst
                .into_iter()
                .map(|message| {
                    let answer = Answer::Requeue {
                        delay: Some(Duration::ZERO),
                        backoff: false,
                    };
                    (message, answer)
                })
                .collect();
            let _ = Message::answer_all(answers);
        }
    }

    /// Acts on one frame; a message is added to `burst`, which the caller records as in flight
    /// before handing it out.
    fn on_frame(
        &self,
        frame: Frame,
        handle: &Arc<ConnHandle>,
        close_wait: &mut bool,
        burst: &mut Vec<Message>,
    ) -> Result<(), Error> {
        match frame {
            Frame::Message(raw) => {
                let max = self.config.max_attempts;
                let attempts = raw.attempts;
                let message = Message::new(raw, handle.clone());
                if max > 0 && attempts > max {
                    handle.track([*message.id()]);
                    let id = message.id().to_string();
                    tracing::warn!(nsqd = %self.addr, %id, attempts, max_attempts = max, "Message exceeded max_attempts; finishing it without handling.");
                    inc(&self.shared.counters.max_attempts_exceeded);
                    self.shared
                        .event(ConsumerEvent::MaxAttemptsExceeded { id, attempts });
                    let _ = message.finish();
                } else {
                    burst.push(message);
                }
            }
            Frame::Response(data) if &data[..] == HEARTBEAT => {
                inc(&self.shared.counters.heartbeats);
                handle.send(Command::Nop)?;
            }
            Frame::Response(data) if &data[..] == b"CLOSE_WAIT" => *close_wait = true,
            Frame::Response(data) => {
                tracing::debug!(nsqd = %self.addr, response = %String::from_utf8_lossy(&data), "Unsolicited response from nsqd.");
            }
            Frame::Error(text) if is_non_fatal_error(&text) => {
                inc(&self.shared.counters.non_fatal_errors);
                let text = String::from_utf8_lossy(&text).into_owned();
                tracing::warn!(nsqd = %self.addr, error = %text, "nsqd reported a non-fatal error.");
                self.shared.event(ConsumerEvent::NonFatalError {
                    addr: self.addr.to_string(),
                    text,
                });
            }
            Frame::Error(text) => return Err(broker_error(&self.addr, &text)),
        }
        Ok(())
    }
}
