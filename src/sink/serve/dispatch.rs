//! The dispatcher: hands each waiting record to a consumer with RDY room and routes that
//! consumer's FIN, REQ or TOUCH, its timeout or its disconnection back to the handler call
//! that waits for it.
//!
//! One `std` mutex guards the state (never held across an `.await`): the records waiting for
//! a consumer, the subscribed consumers, and the messages in flight to them by the IDs this
//! endpoint gave them (`flights`). A record in flight resolves its handler call exactly once:
//! `Ok` on FIN; [`HandlerError::Requeued`] with the consumer's delay on a REQ, and with none
//! when its consumer goes away; [`HandlerError::Retry`] at once when its consumer times out.
//! The pipeline
//! then commits the claim and FINs upstream, or erases it and REQs upstream, as soon as the
//! answer reaches it, without waiting for the rest of its burst.
//!
//! Work moves in bursts, as it arrives: a handler call's records are queued under one lock;
//! the FINs, REQs and TOUCHes of one read from a consumer are settled under one lock
//! ([`Dispatcher::settle`]), and each call they answer is woken once for them, as one part of
//! its answer (`answers`);
//! message frames are encoded into their consumer's buffer, which its connection takes whole
//! (swapping in its own empty one, so neither allocates once warm) and writes in one `write`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::answers::{Answers, Reply};
use super::flights::Flights;
use crate::nsq::frame::{encode_message_frame, MessageId, RawMessage};
use crate::sink::{Delivery, HandlerError};

/// A connection's number, unique for the endpoint's life.
pub(crate) type ClientId = u64;

/// A record waiting for a consumer.
struct Waiting {
    delivery: Delivery,
    reply: Reply,
}

/// A record in flight to a consumer; its body is in the consumer's hands, not kept here.
struct InFlight {
    client: ClientId,
    reply: Reply,
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
    client: ClientId,
    info: ConsumerInfo,
    rdy: u64,
    in_flight: u64,
    /// Sent CLS: gets no more messages.
    closing: bool,
    msg_timeout: Duration,
    /// Message frames its connection has not taken yet.
    frames: BytesMut,
    /// Wakes its connection when `frames` gets its first bytes; the connection holds the other
    /// end, and takes the frames ([`Dispatcher::take_frames`]).
    wake: Arc<Notify>,
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

/// A consumer's answer to a message it holds, as [`Dispatcher::settle`] takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// FIN: the handler call's record succeeds.
    Finish(MessageId),
    /// REQ: the consumer asks for the record again after this delay.
    Requeue(MessageId, Duration),
    /// TOUCH: the message's timer starts again, up to `max_msg_timeout` after it was sent.
    Touch(MessageId),
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Waiting>,
    /// By client, in order: a few consumers, looked up by a binary search.
    slots: Vec<Slot>,
    flights: Flights<InFlight>,
    /// The consumer that got the last message: the next one goes to the one after it.
    cursor: ClientId,
    counters: ServeCounters,
    /// Records answered under the lock: their calls get the results, and are woken, once it
    /// is released.
    resolved: Vec<(Reply, Result<(), HandlerError>)>,
    /// The sidecar is stopping ([`Dispatcher::stop`]): records no consumer can take are
    /// handed back at once.
    stopping: bool,
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

    /// Runs `change` on the locked state, then wakes the handler calls it answered in full,
    /// once the lock is released: a woken call may need it at once.
    fn with_state<R>(&self, change: impl FnOnce(&mut State) -> R) -> R {
        // A panic while holding the lock would be a bug here; the state is still consistent
        // enough to requeue everything, which beats losing it.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = change(&mut state);
        let resolved = std::mem::take(&mut state.resolved);
        drop(state);
        for waker in Reply::resolve_all(resolved) {
            waker.wake();
        }
        result
    }

    /// Queues a burst's records under one lock; the answers come in parts as consumers answer
    /// them (or they are handed back).
    pub(crate) fn submit_many(&self, deliveries: Vec<Delivery>) -> Answers {
        let (answers, replies) = Answers::new(deliveries.len());
        self.with_state(|state| {
            state.waiting.extend(
                deliveries
                    .into_iter()
                    .zip(replies)
                    .map(|(delivery, reply)| Waiting { delivery, reply }),
            );
            state.pump(Instant::now());
            state.wake_connections(None);
            state.hand_back_if_unserved();
        });
        answers
    }

    /// The sidecar is stopping: from now on, whenever no consumer can take messages (none is
    /// subscribed, or each sent CLS), the records waiting for one are handed back at once,
    /// to be requeued upstream with no delay, rather than held until the shutdown grace
    /// ends. Messages in flight to a consumer stay its own to answer.
    pub(crate) fn stop(&self) {
        self.with_state(|state| {
            state.stopping = true;
            state.hand_back_if_unserved();
        });
    }

    /// A consumer subscribed: it gets messages once it sends RDY. `wake` tells its connection
    /// that frames wait for it.
    pub(crate) fn subscribe(
        &self,
        client: ClientId,
        info: ConsumerInfo,
        msg_timeout: Duration,
        wake: Arc<Notify>,
    ) {
        let slot = Slot {
            client,
            info,
            rdy: 0,
            in_flight: 0,
            closing: false,
            msg_timeout,
            frames: BytesMut::new(),
            wake,
            connected_at: std::time::SystemTime::now(),
            message_count: 0,
            finish_count: 0,
            requeue_count: 0,
        };
        self.with_state(|state| {
            let at = state.slots.partition_point(|s| s.client < client);
            match state.slots.get_mut(at) {
                Some(held) if held.client == client => *held = slot,
                _ => state.slots.insert(at, slot),
            }
        });
    }

    /// RDY: the consumer may hold `rdy` messages; the frames this sends it are added to `out`.
    /// Returns how many messages it holds.
    pub(crate) fn set_rdy(&self, client: ClientId, rdy: u64, out: &mut BytesMut) -> u64 {
        self.with_state(|state| {
            let Some(slot) = state.slot_mut(client) else {
                return 0;
            };
            slot.rdy = rdy;
            state.pump(Instant::now());
            state.take_frames(client, out);
            state.wake_connections(Some(client));
            state.slot_mut(client).map_or(0, |slot| slot.in_flight)
        })
    }

    /// CLS: the consumer gets no more messages; what it holds it may still answer.
    pub(crate) fn close(&self, client: ClientId) {
        self.with_state(|state| {
            if let Some(slot) = state.slot_mut(client) {
                slot.closing = true;
            }
            state.hand_back_if_unserved();
        });
    }

    /// Settles a run of one consumer's FIN, REQ and TOUCH in order under one lock, then sends
    /// what they made room for. Each answer refused is pushed to `refused` with its place in
    /// `answers` and nsqd's reason; when none is, the frames for this consumer are added to
    /// `out`, else they wait for the caller to write the refusals first and take them
    /// ([`take_frames`](Self::take_frames)). Returns how many messages the consumer holds.
    pub(crate) fn settle(
        &self,
        client: ClientId,
        answers: &[Settle],
        out: &mut BytesMut,
        refused: &mut Vec<(usize, &'static str)>,
    ) -> u64 {
        let max_msg_timeout = self.max_msg_timeout;
        self.with_state(|state| {
            let now = Instant::now();
            for (index, answer) in answers.iter().enumerate() {
                let settled = match *answer {
                    Settle::Finish(id) => state.finish(client, id),
                    Settle::Requeue(id, delay) => state.requeue(client, id, delay),
                    Settle::Touch(id) => state.touch(client, id, now, max_msg_timeout),
                };
                if let Err(why) = settled {
                    refused.push((index, why));
                }
            }
            state.pump(now);
            if refused.is_empty() {
                state.take_frames(client, out);
            }
            state.wake_connections(Some(client));
            state.slot_mut(client).map_or(0, |slot| slot.in_flight)
        })
    }

    /// Adds the frames waiting for `client` to `out`; returns how many messages it holds.
    pub(crate) fn take_frames(&self, client: ClientId, out: &mut BytesMut) -> u64 {
        self.with_state(|state| {
            state.take_frames(client, out);
            state.slot_mut(client).map_or(0, |slot| slot.in_flight)
        })
    }

    /// The consumer's connection closed: what it holds is handed back at once.
    pub(crate) fn remove(&self, client: ClientId) -> usize {
        self.with_state(|state| {
            let Ok(at) = state.slots.binary_search_by_key(&client, |s| s.client) else {
                return 0;
            };
            state.slots.remove(at);
            let flights = state.flights.take_if(|f| f.client == client);
            let handed_back = flights.len();
            for flight in flights {
                state.counters.abandoned += 1;
                // As nsqd does for a client that closes: requeued at once, and not a failure
                // of the sidecar (the receiver went away, as when it sends a REQ).
                state.resolve(
                    flight.reply,
                    Err(HandlerError::Requeued {
                        after: Duration::ZERO,
                    }),
                );
            }
            state.pump(Instant::now());
            state.wake_connections(None);
            state.hand_back_if_unserved();
            handed_back
        })
    }

    /// Hands back every message whose consumer's timeout passed by `now`.
    pub(crate) fn expire(&self, now: Instant) {
        self.with_state(|state| {
            let late = state.flights.take_if(|f| f.deadline <= now);
            if late.is_empty() {
                return;
            }
            for flight in late {
                state.counters.timed_out += 1;
                if let Some(slot) = state.slot_mut(flight.client) {
                    slot.in_flight = slot.in_flight.saturating_sub(1);
                }
                state.resolve(
                    flight.reply,
                    Err(HandlerError::Retry(
                        "a consumer did not answer the message within its msg_timeout".into(),
                    )),
                );
            }
            state.pump(now);
            state.wake_connections(None);
        });
    }

    pub(crate) fn stats(&self) -> DispatchStats {
        self.with_state(|state| DispatchStats {
            waiting: state.waiting.len(),
            in_flight: state.flights.len(),
            counters: state.counters,
            consumers: state
                .slots
                .iter()
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
        })
    }
}

impl State {
    fn slot_mut(&mut self, client: ClientId) -> Option<&mut Slot> {
        let at = self
            .slots
            .binary_search_by_key(&client, |s| s.client)
            .ok()?;
        Some(&mut self.slots[at])
    }

    /// While stopping with no consumer that can take messages, hands every waiting record
    /// back: its claim is erased and its message requeued upstream with no delay.
    fn hand_back_if_unserved(&mut self) {
        if !self.stopping || self.slots.iter().any(|slot| !slot.closing) {
            return;
        }
        for Waiting { reply, .. } in std::mem::take(&mut self.waiting) {
            self.resolve(
                reply,
                Err(HandlerError::Requeued {
                    after: Duration::ZERO,
                }),
            );
        }
    }

    /// Answers a record once the lock is released, with the other records of its call
    /// answered under the same lock; its call is woken then, unless an answer of the same run
    /// woke it already.
    fn resolve(&mut self, reply: Reply, result: Result<(), HandlerError>) {
        self.resolved.push((reply, result));
    }

    /// Takes message `id` out of flight for `client`, as nsqd's channel does for FIN and REQ.
    fn take(&mut self, client: ClientId, id: MessageId) -> Result<Reply, &'static str> {
        match self.flights.get(&id) {
            None => return Err(NOT_IN_FLIGHT),
            Some(flight) if flight.client != client => return Err(NOT_OWNER),
            Some(_) => {}
        }
        let flight = self.flights.remove(&id).ok_or(NOT_IN_FLIGHT)?;
        if let Some(slot) = self.slot_mut(client) {
            slot.in_flight = slot.in_flight.saturating_sub(1);
        }
        Ok(flight.reply)
    }

    fn finish(&mut self, client: ClientId, id: MessageId) -> Result<(), &'static str> {
        let reply = self.take(client, id)?;
        self.counters.finished += 1;
        if let Some(slot) = self.slot_mut(client) {
            slot.finish_count += 1;
        }
        self.resolve(reply, Ok(()));
        Ok(())
    }

    fn requeue(
        &mut self,
        client: ClientId,
        id: MessageId,
        delay: Duration,
    ) -> Result<(), &'static str> {
        let reply = self.take(client, id)?;
        self.counters.requeued += 1;
        if let Some(slot) = self.slot_mut(client) {
            slot.requeue_count += 1;
        }
        // Not a failure of the sidecar: the consumer asks for the message again after `delay`.
        self.resolve(reply, Err(HandlerError::Requeued { after: delay }));
        Ok(())
    }

    fn touch(
        &mut self,
        client: ClientId,
        id: MessageId,
        now: Instant,
        max_msg_timeout: Duration,
    ) -> Result<(), &'static str> {
        let timeout = self.slot_mut(client).map(|s| s.msg_timeout);
        let flight = self.flights.get_mut(&id).ok_or(NOT_IN_FLIGHT)?;
        if flight.client != client {
            return Err(NOT_OWNER);
        }
        let latest = flight.delivered_at + max_msg_timeout;
        flight.deadline = (now + timeout.unwrap_or(max_msg_timeout)).min(latest);
        self.counters.touched += 1;
        Ok(())
    }

    /// Moves the frames waiting for `client` to `out`: the whole buffer when `out` is
    /// empty, so the two buffers trade places and neither allocates once warm.
    fn take_frames(&mut self, client: ClientId, out: &mut BytesMut) {
        let Some(slot) = self.slot_mut(client) else {
            return;
        };
        if out.is_empty() {
            std::mem::swap(out, &mut slot.frames);
        } else {
            out.extend_from_slice(&slot.frames);
            slot.frames.clear();
        }
    }

    /// Wakes the connection of every consumer with frames to take, but `except`'s, which
    /// takes its own.
    fn wake_connections(&self, except: Option<ClientId>) {
        for slot in &self.slots {
            if !slot.frames.is_empty() && Some(slot.client) != except {
                slot.wake.notify_one();
            }
        }
    }

    /// Where the next consumer after the cursor with RDY room is, taking turns.
    fn next_ready(&self) -> Option<usize> {
        let ready = |slot: &Slot| !slot.closing && slot.in_flight < slot.rdy;
        let after = self.slots.partition_point(|s| s.client <= self.cursor);
        (after..self.slots.len())
            .chain(0..after)
            .find(|&at| ready(&self.slots[at]))
    }

    /// Sends waiting records to consumers with RDY room, while there are both: each frame
    /// is encoded into its consumer's buffer.
    fn pump(&mut self, now: Instant) {
        while !self.waiting.is_empty() {
            let Some(at) = self.next_ready() else {
                return;
            };
            let Some(Waiting { delivery, reply }) = self.waiting.pop_front() else {
                return;
            };
            if reply.is_abandoned() {
                // Its handler call was abandoned: the pipeline requeued it upstream.
                continue;
            }
            let slot = &mut self.slots[at];
            let client = slot.client;
            self.cursor = client;
            slot.in_flight += 1;
            slot.message_count += 1;
            let deadline = now + slot.msg_timeout;
            let id = self.flights.insert(InFlight {
                client,
                reply,
                deadline,
                delivered_at: now,
            });
            let message = RawMessage {
                timestamp_ns: delivery.timestamp_ns,
                attempts: delivery.attempts,
                id,
                body: delivery.body,
            };
            encode_message_frame(&message, &mut slot.frames);
            self.counters.delivered += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::frame::{Frame, FrameCodec};
    use bytes::Bytes;
    use tokio_util::codec::Decoder;

    fn delivery(body: &'static str) -> Delivery {
        Delivery {
            body: Bytes::from_static(body.as_bytes()),
            attempts: 3,
            timestamp_ns: 42,
        }
    }

    fn consumer(d: &Dispatcher, client: ClientId) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        d.subscribe(
            client,
            ConsumerInfo::default(),
            Duration::from_secs(60),
            wake.clone(),
        );
        wake
    }

    fn decode(out: &mut BytesMut) -> Vec<RawMessage> {
        let mut messages = Vec::new();
        while let Some(frame) = FrameCodec::default().decode(out).unwrap() {
            match frame {
                Frame::Message(m) => messages.push(m),
                other => panic!("not a message: {other:?}"),
            }
        }
        messages
    }

    /// The frames waiting for `client`.
    fn received(d: &Dispatcher, client: ClientId) -> Vec<RawMessage> {
        let mut out = BytesMut::new();
        d.take_frames(client, &mut out);
        decode(&mut out)
    }

    /// What `client`'s RDY sends it at once.
    fn rdy(d: &Dispatcher, client: ClientId, count: u64) -> Vec<RawMessage> {
        let mut out = BytesMut::new();
        d.set_rdy(client, count, &mut out);
        decode(&mut out)
    }

    /// Settles `answers`; the refusals, and the frames sent to `client` meanwhile.
    fn settle(
        d: &Dispatcher,
        client: ClientId,
        answers: &[Settle],
    ) -> (Vec<(usize, &'static str)>, Vec<RawMessage>) {
        let (mut out, mut refused) = (BytesMut::new(), Vec::new());
        d.settle(client, answers, &mut out, &mut refused);
        (refused, decode(&mut out))
    }

    #[tokio::test]
    async fn waits_for_rdy_and_never_sends_beyond_it() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let answers = d.submit_many(["a", "b", "c"].map(delivery).into());
        let _wake = consumer(&d, 1);
        assert!(received(&d, 1).is_empty(), "nothing before RDY");
        let got = rdy(&d, 1, 2);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].attempts, got[0].timestamp_ns), (3, 42));
        assert_ne!(got[0].id, got[1].id);
        let finish = Settle::Finish(got[0].id);
        // The FIN makes room for the third, which waits behind the refusal of the second FIN.
        assert_eq!(
            settle(&d, 1, &[finish, finish]),
            (vec![(1, NOT_IN_FLIGHT)], vec![])
        );
        let third = received(&d, 1);
        assert_eq!(third.len(), 1);
        assert_eq!(third[0].body, "c");
        let (refused, sent) = settle(
            &d,
            1,
            &[Settle::Finish(got[1].id), Settle::Finish(third[0].id)],
        );
        assert_eq!((refused, sent.len()), (vec![], 0));
        assert_eq!(answers.in_order().await, vec![Ok(()), Ok(()), Ok(())]);
    }

    #[tokio::test]
    async fn req_disconnect_and_timeout_hand_the_record_back_and_others_may_not_answer() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let a = d.submit_many(vec![delivery("a")]);
        let b = d.submit_many(vec![delivery("b")]);
        let _one = consumer(&d, 1);
        let _other = consumer(&d, 2);
        let got = rdy(&d, 1, 5);
        let id = got[0].id;
        let (refused, _) = settle(&d, 2, &[Settle::Finish(id), Settle::Touch(id)]);
        assert_eq!(refused, vec![(0, NOT_OWNER), (1, NOT_OWNER)]);
        let three = Duration::from_secs(3);
        assert_eq!(settle(&d, 1, &[Settle::Requeue(id, three)]).0, vec![]);
        assert!(matches!(
            &a.in_order().await[..],
            [Err(HandlerError::Requeued { after })] if *after == three
        ));
        d.remove(1);
        assert!(matches!(
            &b.in_order().await[..],
            [Err(HandlerError::Requeued { after })] if after.is_zero()
        ));
        let c = d.submit_many(vec![delivery("c")]);
        let _three = consumer(&d, 3);
        assert_eq!(rdy(&d, 3, 1).len(), 1);
        d.expire(Instant::now() + Duration::from_secs(61));
        assert!(matches!(
            &c.in_order().await[..],
            [Err(HandlerError::Retry(r))] if r.contains("msg_timeout")
        ));
        let counters = d.stats().counters;
        assert_eq!((counters.timed_out, counters.abandoned), (1, 1));
    }

    #[tokio::test]
    async fn consumers_take_turns_are_woken_for_their_frames_and_cls_stops_delivery() {
        let d = Dispatcher::new(Duration::from_secs(900));
        let one = consumer(&d, 1);
        let two = consumer(&d, 2);
        assert!(rdy(&d, 1, 10).is_empty());
        assert!(rdy(&d, 2, 10).is_empty());
        let _answers = d.submit_many((0..4).map(|_| delivery("x")).collect());
        let woken = tokio::time::timeout(Duration::from_secs(5), async {
            one.notified().await;
            two.notified().await;
        });
        assert!(
            woken.await.is_ok(),
            "each connection is told its frames wait"
        );
        assert_eq!((received(&d, 1).len(), received(&d, 2).len()), (2, 2));
        d.close(1);
        let _more = d.submit_many((0..3).map(|_| delivery("y")).collect());
        assert_eq!((received(&d, 1).len(), received(&d, 2).len()), (0, 3));
    }

    #[tokio::test]
    async fn once_stopping_records_no_consumer_can_take_are_handed_back_at_once() {
        // Bounded: a record not handed back would wait for ever.
        let handed_back = |answers: Answers| async {
            let results = tokio::time::timeout(Duration::from_secs(5), answers.in_order())
                .await
                .expect("handed back within 5 s");
            results
                .iter()
                .all(|r| matches!(r, Err(HandlerError::Requeued { after }) if after.is_zero()))
        };
        // No consumer: handed back when the stop begins, and so is what comes after.
        let d = Dispatcher::new(Duration::from_secs(900));
        let before = d.submit_many(vec![delivery("a"), delivery("b")]);
        d.stop();
        assert!(handed_back(before).await);
        assert!(handed_back(d.submit_many(vec![delivery("c")])).await);
        assert_eq!(d.stats().waiting, 0);
        // A consumer connected keeps being served; what waits goes back once it leaves.
        let d = Dispatcher::new(Duration::from_secs(900));
        let _wake = consumer(&d, 1);
        let waiting = d.submit_many(vec![delivery("d")]);
        d.stop();
        assert_eq!(d.stats().waiting, 1, "kept for the consumer");
        d.remove(1);
        assert!(handed_back(waiting).await);
    }

    #[tokio::test]
    async fn a_call_abandoned_before_its_records_are_sent_sends_none() {
        let d = Dispatcher::new(Duration::from_secs(900));
        drop(d.submit_many(vec![delivery("a"), delivery("b")]));
        let kept = d.submit_many(vec![delivery("c")]);
        let _one = consumer(&d, 1);
        let sent = rdy(&d, 1, 10);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].body, "c");
        assert_eq!(settle(&d, 1, &[Settle::Finish(sent[0].id)]).0, vec![]);
        assert_eq!(kept.in_order().await, vec![Ok(())]);
        assert_eq!(d.stats().waiting, 0);
    }
}
