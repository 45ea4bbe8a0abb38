//! The dispatcher: hands each waiting record to a consumer with RDY room and routes that
//! consumer's FIN, REQ or TOUCH, its timeout or its disconnection back to the handler call
//! that waits for it.
//!
//! One `std` mutex guards the state (never held across an `.await`): the records waiting for
//! a consumer, the subscribed consumers, and the messages in flight to them by the IDs this
//! endpoint gave them. A record in flight resolves its handler call exactly once: `Ok` on
//! FIN; [`HandlerError::Requeued`] with the consumer's delay on a REQ;
//! [`HandlerError::Retry`] at once when its consumer times out or goes away. The pipeline then
//! commits the claim and FINs upstream, or erases it and REQs upstream.
//!
//! IDs are 16 hexadecimal digits of a counter: unique among everything in flight here, even
//! when two upstream nsqd gave their messages the same ID.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::nsq::frame::{encode_message_frame, MessageId, RawMessage};
use crate::sink::{Delivery, HandlerError};

/// A connection's number, unique for the endpoint's life.
pub(crate) type ClientId = u64;

/// What a handler call waits for.
pub(crate) type Reply = oneshot::Sender<Result<(), HandlerError>>;

/// A record waiting for a consumer, or in flight to one.
struct Record {
    delivery: Delivery,
    reply: Reply,
}

impl Record {
    fn resolve(self, result: Result<(), HandlerError>) {
        // The call may be gone (the pipeline abandoned it at shutdown): nothing to tell.
        let _ = self.reply.send(result);
    }
}

struct InFlight {
    client: ClientId,
    record: Record,
    deadline: Instant,
    delivered_at: Instant,
}

/// Who a subscribed consumer is, for `/stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ConsumerInfo {
    /// Its address.
    pub remote_address: String,
    /// From IDENTIFY.
    pub client_id: String,
    /// From IDENTIFY.
    pub hostname: String,
    /// From IDENTIFY.
    pub user_agent: String,
    /// Upgraded to TLS.
    pub tls: bool,
    /// AUTH accepted.
    pub authed: bool,
}

/// A subscribed consumer.
struct Slot {
    info: ConsumerInfo,
    rdy: u64,
    in_flight: u64,
    /// Sent CLS: gets no more messages.
    closing: bool,
    msg_timeout: Duration,
    /// Message frames to write; the connection's task holds the receiver.
    frames: mpsc::UnboundedSender<Bytes>,
    connected_at: std::time::SystemTime,
    message_count: u64,
    finish_count: u64,
    requeue_count: u64,
}

/// Counters over the endpoint's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServeCounters {
    /// Message frames sent to consumers.
    pub delivered: u64,
    /// FINs from consumers.
    pub finished: u64,
    /// REQs from consumers.
    pub requeued: u64,
    /// TOUCHes from consumers.
    pub touched: u64,
    /// Messages taken back because their consumer did not answer within its timeout.
    pub timed_out: u64,
    /// Messages taken back because their consumer went away.
    pub abandoned: u64,
}

/// One consumer as `/stats` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConsumerStats {
    /// Who it is.
    #[serde(flatten)]
    pub info: ConsumerInfo,
    /// Its RDY.
    pub ready_count: u64,
    /// Messages in flight to it.
    pub in_flight_count: u64,
    /// Messages sent to it.
    pub message_count: u64,
    /// Its FINs.
    pub finish_count: u64,
    /// Its REQs.
    pub requeue_count: u64,
    /// When it subscribed, in seconds since the Unix epoch.
    pub connect_ts: u64,
}

/// A snapshot of the dispatcher.
#[derive(Debug, Clone)]
pub struct DispatchStats {
    /// Records waiting for a consumer with RDY room.
    pub waiting: usize,
    /// Messages in flight to consumers.
    pub in_flight: usize,
    /// The counters.
    pub counters: ServeCounters,
    /// The subscribed consumers.
    pub consumers: Vec<ConsumerStats>,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Record>,
    slots: BTreeMap<ClientId, Slot>,
    in_flight: HashMap<MessageId, InFlight>,
    /// The consumer that got the last message: the next one goes to the one after it.
    cursor: ClientId,
    next_id: u64,
    counters: ServeCounters,
}

/// Why a FIN, REQ or TOUCH was refused, in nsqd's words.
pub(crate) const NOT_IN_FLIGHT: &str = "ID not in flight";
/// See [`NOT_IN_FLIGHT`].
pub(crate) const NOT_OWNER: &str = "client does not own message";

/// See the module docs.
pub(crate) struct Dispatcher {
    state: Mutex<State>,
    /// A TOUCHed message stays out at most this long after it was sent.
    max_msg_timeout: Duration,
}

impl Dispatcher {
    pub(crate) fn new(max_msg_timeout: Duration) -> Self {
        Dispatcher {
            state: Mutex::default(),
            max_msg_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug here; the state is still consistent
        // enough to requeue everything, which beats losing it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a record for a consumer; the receiver answers once a consumer has.
    pub(crate) fn submit(&self, delivery: Delivery) -> oneshot::Receiver<Result<(), HandlerError>> {
        let (reply, answer) = oneshot::channel();
        let mut state = self.lock();
        state.waiting.push_back(Record { delivery, reply });
        state.pump(Instant::now());
        answer
    }

    /// Queues a burst's records under one lock; one receiver per record, in order.
    pub(crate) fn submit_many(
        &self,
        deliveries: Vec<Delivery>,
    ) -> Vec<oneshot::Receiver<Result<(), HandlerError>>> {
        let mut state = self.lock();
        let answers = deliveries
            .into_iter()
            .map(|delivery| {
                let (reply, answer) = oneshot::channel();
                state.waiting.push_back(Record { delivery, reply });
                answer
            })
            .collect();
        state.pump(Instant::now());
        answers
    }

    /// A consumer subscribed: it gets messages once it sends RDY.
    pub(crate) fn subscribe(
        &self,
        client: ClientId,
        info: ConsumerInfo,
        msg_timeout: Duration,
        frames: mpsc::UnboundedSender<Bytes>,
    ) {
        self.lock().slots.insert(
            client,
            Slot {
                info,
                rdy: 0,
                in_flight: 0,
                closing: false,
                msg_timeout,
                frames,
                connected_at: std::time::SystemTime::now(),
                message_count: 0,
                finish_count: 0,
                requeue_count: 0,
            },
        );
    }

    pub(crate) fn set_rdy(&self, client: ClientId, rdy: u64) {
        let mut state = self.lock();
        if let Some(slot) = state.slots.get_mut(&client) {
            slot.rdy = rdy;
            state.pump(Instant::now());
        }
    }

    /// CLS: the consumer gets no more messages; what it holds it may still answer.
    pub(crate) fn close(&self, client: ClientId) {
        if let Some(slot) = self.lock().slots.get_mut(&client) {
            slot.closing = true;
        }
    }

    /// FIN: the handler call succeeds.
    pub(crate) fn finish(&self, client: ClientId, id: MessageId) -> Result<(), &'static str> {
        let mut state = self.lock();
        let record = state.take(client, id)?;
        state.counters.finished += 1;
        if let Some(slot) = state.slots.get_mut(&client) {
            slot.finish_count += 1;
        }
        record.resolve(Ok(()));
        state.pump(Instant::now());
        Ok(())
    }

    /// REQ: the handler call fails, asking for `delay` before the retry.
    pub(crate) fn requeue(
        &self,
        client: ClientId,
        id: MessageId,
        delay: Duration,
    ) -> Result<(), &'static str> {
        let mut state = self.lock();
        let record = state.take(client, id)?;
        state.counters.requeued += 1;
        if let Some(slot) = state.slots.get_mut(&client) {
            slot.requeue_count += 1;
        }
        // Not a failure of the sidecar: the consumer asks for the message again after `delay`.
        record.resolve(Err(HandlerError::Requeued { after: delay }));
        state.pump(Instant::now());
        Ok(())
    }

    /// TOUCH: the message's timer starts again, up to `max_msg_timeout` after it was sent.
    pub(crate) fn touch(&self, client: ClientId, id: MessageId) -> Result<(), &'static str> {
        let mut state = self.lock();
        let now = Instant::now();
        let timeout = state.slots.get(&client).map(|s| s.msg_timeout);
        let flight = state.in_flight.get_mut(&id).ok_or(NOT_IN_FLIGHT)?;
        if flight.client != client {
            return Err(NOT_OWNER);
        }
        let latest = flight.delivered_at + self.max_msg_timeout;
        flight.deadline = (now + timeout.unwrap_or(self.max_msg_timeout)).min(latest);
        state.counters.touched += 1;
        Ok(())
    }

    /// The consumer's connection closed: what it holds is handed back at once.
    pub(crate) fn remove(&self, client: ClientId) {
        let mut state = self.lock();
        if state.slots.remove(&client).is_none() {
            return;
        }
        let ids: Vec<MessageId> = state
            .in_flight
            .iter()
            .filter(|(_, f)| f.client == client)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(flight) = state.in_flight.remove(&id) {
                state.counters.abandoned += 1;
                flight.record.resolve(Err(HandlerError::Retry(
                    "a consumer disconnected with the message in flight".into(),
                )));
            }
        }
        state.pump(Instant::now());
    }

    /// Hands back every message whose consumer's timeout passed by `now`.
    pub(crate) fn expire(&self, now: Instant) {
        let mut state = self.lock();
        let late: Vec<MessageId> = state
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        if late.is_empty() {
            return;
        }
        for id in late {
            if let Some(flight) = state.in_flight.remove(&id) {
                state.counters.timed_out += 1;
                if let Some(slot) = state.slots.get_mut(&flight.client) {
                    slot.in_flight = slot.in_flight.saturating_sub(1);
                }
                flight.record.resolve(Err(HandlerError::Retry(
                    "a consumer did not answer the message within its msg_timeout".into(),
                )));
            }
        }
        state.pump(now);
    }

    pub(crate) fn stats(&self) -> DispatchStats {
        let state = self.lock();
        DispatchStats {
            waiting: state.waiting.len(),
            in_flight: state.in_flight.len(),
            counters: state.counters,
            consumers: state
                .slots
                .values()
                .map(|slot| ConsumerStats {
                    info: slot.info.clone(),
                    ready_count: slot.rdy,
                    in_flight_count: slot.in_flight,
                    message_count: slot.message_count,
                    finish_count: slot.finish_count,
                    requeue_count: slot.requeue_count,
                    connect_ts: slot
                        .connected_at
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                })
                .collect(),
        }
    }
}

impl State {
    /// Takes message `id` out of flight for `client`, as nsqd's channel does for FIN and REQ.
    fn take(&mut self, client: ClientId, id: MessageId) -> Result<Record, &'static str> {
        match self.in_flight.get(&id) {
            None => return Err(NOT_IN_FLIGHT),
            Some(flight) if flight.client != client => return Err(NOT_OWNER),
            Some(_) => {}
        }
        let flight = self.in_flight.remove(&id).ok_or(NOT_IN_FLIGHT)?;
        if let Some(slot) = self.slots.get_mut(&client) {
            slot.in_flight = slot.in_flight.saturating_sub(1);
        }
        Ok(flight.record)
    }

    /// The next consumer after the cursor with RDY room, taking turns.
    fn next_ready(&self) -> Option<ClientId> {
        let ready = |(_, slot): &(&ClientId, &Slot)| !slot.closing && slot.in_flight < slot.rdy;
        let after = std::ops::Bound::Excluded(self.cursor);
        self.slots
            .range((after, std::ops::Bound::Unbounded))
            .find(ready)
            .or_else(|| self.slots.range(..=self.cursor).find(ready))
            .map(|(id, _)| *id)
    }

    fn new_id(&mut self) -> MessageId {
        self.next_id = self.next_id.wrapping_add(1);
        let mut id = [0u8; 16];
        let hex = format!("{:016x}", self.next_id);
        id.copy_from_slice(hex.as_bytes());
        MessageId(id)
    }

    /// Sends waiting records to consumers with RDY room, while there are both.
    fn pump(&mut self, now: Instant) {
        while !self.waiting.is_empty() {
            let Some(client) = self.next_ready() else {
                return;
            };
            let Some(record) = self.waiting.pop_front() else {
                return;
            };
            if record.reply.is_closed() {
                // Its handler call was abandoned: the pipeline requeued it upstream.
                continue;
            }
            let id = self.new_id();
            let mut frame = BytesMut::new();
            encode_message_frame(
                &RawMessage {
                    timestamp_ns: record.delivery.timestamp_ns,
                    attempts: record.delivery.attempts,
                    id,
                    body: record.delivery.body.clone(),
                },
                &mut frame,
            );
            self.cursor = client;
            let Some(slot) = self.slots.get_mut(&client) else {
                self.waiting.push_front(record);
                return;
            };
            if slot.frames.send(frame.freeze()).is_err() {
                // The connection is closing; `remove` follows. Keep the record for another.
                slot.closing = true;
                self.waiting.push_front(record);
                continue;
            }
            slot.in_flight += 1;
            slot.message_count += 1;
            let deadline = now + slot.msg_timeout;
            self.counters.delivered += 1;
            self.in_flight.insert(
                id,
                InFlight {
                    client,
                    record,
                    deadline,
                    delivered_at: now,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::frame::{Frame, FrameCodec};
    use tokio_util::codec::Decoder;

    fn delivery(body: &'static str) -> Delivery {
        Delivery {
            body: Bytes::from_static(body.as_bytes()),
            attempts: 3,
            timestamp_ns: 42,
        }
    }

    fn consumer(d: &Dispatcher, client: ClientId) -> mpsc::UnboundedReceiver<Bytes> {
        let (tx, rx) = mpsc::unbounded_channel();
        d.subscribe(client, ConsumerInfo::default(), Duration::from_secs(60), tx);
        rx
    }

    fn received(rx: &mut mpsc::UnboundedReceiver<Bytes>) -> Vec<RawMessage> {
        let mut out = Vec::new();
        while let Ok(frame) = rx.try_recv() {
            let mut buf = BytesMut::from(&frame[..]);
            match FrameCodec::default().decode(&mut buf).unwrap() {
                Some(Frame::Message(m)) => out.push(m),
                other => panic!("not a message: {other:?}"),
            }
        }
        out
    }

    #[tokio::test]
    async fn waits_for_rdy_and_never_sends_beyond_it() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let answers: Vec<_> = ["a", "b", "c"].map(|b| d.submit(delivery(b))).into();
        let mut rx = consumer(&d, 1);
        assert!(received(&mut rx).is_empty(), "nothing before RDY");
        d.set_rdy(1, 2);
        let got = received(&mut rx);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].attempts, got[0].timestamp_ns), (3, 42));
        assert_ne!(got[0].id, got[1].id);
        d.finish(1, got[0].id).unwrap();
        assert_eq!(d.finish(1, got[0].id), Err(NOT_IN_FLIGHT));
        let third = received(&mut rx);
        assert_eq!(third.len(), 1);
        assert_eq!(third[0].body, "c");
        let mut answers = answers.into_iter();
        assert_eq!(answers.next().unwrap().await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn req_timeout_and_disconnect_fail_the_call_and_others_may_not_answer() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let a = d.submit(delivery("a"));
        let b = d.submit(delivery("b"));
        let mut rx = consumer(&d, 1);
        let _other = consumer(&d, 2);
        d.set_rdy(1, 5);
        let got = received(&mut rx);
        assert_eq!(d.finish(2, got[0].id), Err(NOT_OWNER));
        assert_eq!(d.touch(2, got[0].id), Err(NOT_OWNER));
        d.requeue(1, got[0].id, Duration::from_secs(3)).unwrap();
        assert!(matches!(
            a.await.unwrap(),
            Err(HandlerError::Requeued { after }) if after == Duration::from_secs(3)
        ));
        d.remove(1);
        assert!(matches!(b.await.unwrap(), Err(HandlerError::Retry(_))));
        let c = d.submit(delivery("c"));
        let mut rx = consumer(&d, 3);
        d.set_rdy(3, 1);
        assert_eq!(received(&mut rx).len(), 1);
        d.expire(Instant::now() + Duration::from_secs(61));
        assert!(
            matches!(c.await.unwrap(), Err(HandlerError::Retry(r)) if r.contains("msg_timeout"))
        );
        assert_eq!(d.stats().counters.timed_out, 1);
    }

    #[tokio::test]
    async fn consumers_take_turns_and_cls_stops_delivery() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let mut one = consumer(&d, 1);
        let mut two = consumer(&d, 2);
        d.set_rdy(1, 10);
        d.set_rdy(2, 10);
        let _answers: Vec<_> = (0..4).map(|_| d.submit(delivery("x"))).collect();
        assert_eq!((received(&mut one).len(), received(&mut two).len()), (2, 2));
        d.close(1);
        let _more: Vec<_> = (0..3).map(|_| d.submit(delivery("y"))).collect();
        assert_eq!((received(&mut one).len(), received(&mut two).len()), (0, 3));
    }
}
