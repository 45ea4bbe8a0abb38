//! A message received by the [`Consumer`](super::Consumer), and how it is answered.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::connection::ConnHandle;
use super::error::Error;
use super::frame::{Command, MessageId, RawMessage};

/// How [`Message::answer_all`] answers a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `FIN`, as [`Message::finish`].
    Finish,
    /// `REQ`, as [`Message::requeue`] (`backoff: true`) or
    /// [`Message::requeue_without_backoff`].
    Requeue {
        /// The delay; `None` for the configured default.
        delay: Option<Duration>,
        /// Whether it counts as a handler failure.
        backoff: bool,
    },
}

/// The answers of [`Message::answer_all`] to one connection.
struct Group {
    conn: Arc<ConnHandle>,
    /// Each answer with its place in the caller's list.
    answers: Vec<(usize, Answer)>,
    commands: Vec<(MessageId, Command)>,
}

/// One delivery of a message from nsqd.
///
/// Answer it exactly once with [`finish`](Message::finish) or [`requeue`](Message::requeue)
/// (both consume it), from any task, after any amount of async work; [`touch`](Message::touch)
/// it meanwhile if the work may outlast nsqd's `msg_timeout`. The answer is queued to the
/// connection's writer at once and written within 4 ms, with the answers that follow it, so
/// that nsqd refills its window in groups; when the connection closes, it is written first.
///
/// A message dropped without an answer is requeued with the default delay and a warning, so
/// nothing is left in flight unknowingly. If the connection it came from has closed, answers
/// fail with [`Error::ConnectionClosed`]: nsqd delivers the message again after `msg_timeout`.
pub struct Message {
    id: MessageId,
    attempts: u16,
    timestamp_ns: i64,
    body: Bytes,
    /// Its connection, and through it the consumer it calls back ([`ConnHandle::consumer`]):
    /// one reference counted per message, not two, as every message takes one when it is
    /// read and drops it when it is answered, often on another core.
    conn: Arc<ConnHandle>,
    answered: bool,
    /// Set aside by [`park`](Message::park).
    parked: bool,
}

impl Message {
    pub(crate) fn new(raw: RawMessage, conn: Arc<ConnHandle>) -> Self {
        Message {
            id: raw.id,
            attempts: raw.attempts,
            timestamp_ns: raw.timestamp_ns,
            body: raw.body,
            conn,
            answered: false,
            parked: false,
        }
    }

    /// The ID nsqd gave this message. Copies of one payload on different nsqd have different
    /// IDs; redeliveries by the same nsqd keep it.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// How many times nsqd has delivered this message, this delivery included (starts at 1).
    pub fn attempts(&self) -> u16 {
        self.attempts
    }

    /// When nsqd first received the message, in nanoseconds since the Unix epoch.
    pub fn timestamp(&self) -> i64 {
        self.timestamp_ns
    }

    /// The payload. Shares the connection's read buffer; cloning it is cheap.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The address of the nsqd that delivered it, as configured or discovered.
    pub fn nsqd_address(&self) -> &str {
        &self.conn.addr
    }

    /// Sends `FIN`: the message is done. Counts as a handler success for backoff.
    ///
    /// # Errors
    ///
    /// [`Error::NotInFlight`] if it was already answered (e.g. by shutdown's final REQ), or
    /// [`Error::ConnectionClosed`] if its connection is gone (nsqd will redeliver it).
    pub fn finish(mut self) -> Result<(), Error> {
        self.answered = true;
        let result = self.conn.answer(self.id, Command::Fin(self.id));
        if result.is_ok() {
            self.conn.consumer.on_finished(1);
        }
        result
    }

    /// Sends `REQ`: nsqd delivers the message again after `delay` (or the configured default,
    /// `default_requeue_delay * attempts`, if `None`), capped at `max_requeue_delay` because
    /// nsqd treats a delay above its `--max-req-timeout` as a fatal error. Counts as a handler
    /// failure: the consumer backs off like go-nsq.
    ///
    /// # Errors
    ///
    /// As for [`finish`](Message::finish).
    pub fn requeue(self, delay: Option<Duration>) -> Result<(), Error> {
        self.requeue_inner(delay, true)
    }

    /// Like [`requeue`](Message::requeue) but without triggering backoff.
    ///
    /// # Errors
    ///
    /// As for [`finish`](Message::finish).
    pub fn requeue_without_backoff(self, delay: Option<Duration>) -> Result<(), Error> {
        self.requeue_inner(delay, false)
    }

    /// Tells the consumer that this message could not be handled because something its
    /// handler needs does not answer (a shared store down), and completes once the consumer
    /// has set RDY for it: answer the message after that (a
    /// [`requeue_without_backoff`](Message::requeue_without_backoff) with a delay), so that
    /// the requeue does not make room for the next message before RDY 0 is on the wire.
    ///
    /// The consumer backs off as for a handler failure (RDY 0 for `backoff_multiplier`, then
    /// one message to test, each test that meets the outage again doubling the pause, up to
    /// 10 s or `max_backoff` if lower), but the first message for which [`outage_over`](Message::outage_over)
    /// is told ends it at once, with full RDY. Told during a pause (by a message delivered
    /// before it), it changes nothing. Once for a burst of messages is enough.
    pub async fn outage(&self) {
        let (lowered, set) = tokio::sync::oneshot::channel();
        self.conn.consumer.on_outage(lowered);
        // Dropped, not sent: an error here is the answer.
        let _ = set.await;
    }

    /// Tells the consumer that what the handler needs answered for this message: a backoff
    /// for an outage ([`outage`](Message::outage)) ends at once. One atomic read when there
    /// is none, so it can be told for every burst.
    pub fn outage_over(&self) {
        self.conn.consumer.on_outage_over();
    }

    /// Sets the message aside (`true`) or takes it back (`false`): while set aside it stays in
    /// flight at nsqd, TOUCHed and answered as usual, but does not count toward the consumer's
    /// `max_in_flight`, whose RDY rises by one meanwhile. For a message kept waiting on
    /// another one's outcome (a copy held beside its original), which must not take the place
    /// of new messages. Answering or dropping the message takes it back.
    pub fn park(&mut self, parked: bool) {
        if self.parked == parked {
            return;
        }
        self.parked = parked;
        self.conn.park(parked);
        self.conn.consumer.on_parked();
    }

    /// The delay a REQ of this message with `delay` waits at nsqd: `delay` capped at the
    /// consumer's `max_requeue_delay`, or its default for `None`.
    pub fn requeue_delay(&self, delay: Option<Duration>) -> Duration {
        match delay {
            Some(delay) => self.conn.consumer.clamp_requeue_delay(delay),
            None => self.conn.consumer.default_requeue_delay(self.attempts),
        }
    }

    fn requeue_inner(mut self, delay: Option<Duration>, backoff: bool) -> Result<(), Error> {
        self.answered = true;
        let delay = self.requeue_delay(delay);
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let result = self.conn.answer(self.id, Command::Req(self.id, delay_ms));
        if result.is_ok() {
            self.conn.consumer.on_requeued(backoff);
        }
        result
    }

    /// Answers every message of `answers` as [`finish`](Message::finish) and
    /// [`requeue`](Message::requeue) would, with one queued write per connection (one lock of
    /// its in-flight set, one wake-up of its writer) instead of one per message. The results
    /// are in the order of `answers`.
    pub fn answer_all(answers: Vec<(Message, Answer)>) -> Vec<Result<(), Error>> {
        // Messages of one burst share a connection: the groups are few, often one.
        let mut groups: Vec<Group> = Vec::new();
        let count = answers.len();
        for (index, (mut message, answer)) in answers.into_iter().enumerate() {
            message.answered = true;
            let command = match answer {
                Answer::Finish => Command::Fin(message.id),
                Answer::Requeue { delay, .. } => {
                    let delay = message.requeue_delay(delay);
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    Command::Req(message.id, delay_ms)
                }
            };
            let group = match groups
                .iter()
                .position(|group| Arc::ptr_eq(&group.conn, &message.conn))
            {
                Some(group) => &mut groups[group],
                None => {
                    groups.push(Group {
                        conn: message.conn.clone(),
                        answers: Vec::new(),
                        commands: Vec::new(),
                    });
                    groups.last_mut().expect("pushed above")
                }
            };
            group.answers.push((index, answer));
            group.commands.push((message.id, command));
        }
        let mut results: Vec<Result<(), Error>> = Vec::with_capacity(count);
        results.resize_with(count, || Ok(()));
        for group in groups {
            let taken = group.conn.answer_many(group.commands);
            // Counted once per group: the counters are shared by every core that answers.
            let mut finished = 0;
            for ((index, answer), result) in group.answers.into_iter().zip(taken) {
                if result.is_ok() {
                    match answer {
                        Answer::Finish => finished += 1,
                        Answer::Requeue { backoff, .. } => group.conn.consumer.on_requeued(backoff),
                    }
                }
                results[index] = result;
            }
            if finished > 0 {
                group.conn.consumer.on_finished(finished);
            }
        }
        results
    }

    /// Sends `TOUCH`: nsqd restarts this message's `msg_timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::NotInFlight`] if the message was already answered, or
    /// [`Error::ConnectionClosed`] if its connection is gone.
    pub fn touch(&self) -> Result<(), Error> {
        if !self.conn.is_in_flight(&self.id) {
            return Err(if self.conn.is_closed() {
                Error::ConnectionClosed {
                    addr: self.conn.addr.to_string(),
                }
            } else {
                Error::NotInFlight {
                    id: self.id.to_string(),
                }
            });
        }
        self.conn.send(Command::Touch(self.id))?;
        self.conn.consumer.on_touched();
        Ok(())
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        // Answered or not, a message set aside no longer is once it is gone.
        self.park(false);
        if self.answered || !self.conn.is_in_flight(&self.id) {
            return;
        }
        let delay = self.conn.consumer.default_requeue_delay(self.attempts);
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        match self.conn.answer(self.id, Command::Req(self.id, delay_ms)) {
            Ok(()) => {
                self.conn.consumer.on_requeued(false);
                tracing::warn!(id = %self.id, nsqd = %self.conn.addr, delay_ms, "Message dropped without an answer; requeued.");
            }
            Err(error) => {
                tracing::warn!(id = %self.id, nsqd = %self.conn.addr, %error, "Message dropped without an answer and could not be requeued; nsqd will redeliver it after msg_timeout.");
            }
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("attempts", &self.attempts)
            .field("timestamp_ns", &self.timestamp_ns)
            .field("body_len", &self.body.len())
            .field("nsqd", &self.conn.addr)
            .finish()
    }
}

#[cfg(test)]
impl Message {
    /// A message with ID `id` of a connection that is not open, for the unit tests of code
    /// that keeps messages: answering it fails, and dropping it does nothing.
    pub(crate) fn for_test(id: u8) -> Message {
        let (conn, _) = ConnHandle::for_test("test");
        let raw = RawMessage {
            timestamp_ns: 0,
            attempts: 1,
            id: MessageId([id; 16]),
            body: Bytes::new(),
        };
        Message::new(raw, conn)
    }
}
