//! One connection to nsqd and the two halves that carry its frames.
//!
//! `Connection::connect` opens it through `transport` (the magic, IDENTIFY with feature
//! negotiation, and the TLS, compression and AUTH nsqd agreed to) and returns a connection
//! whose read half yields [`Frame`]s. The consumer then splits it: the read half stays in the
//! connection's task and the write half goes to a writer task fed by a channel, so
//! FIN/REQ/TOUCH from any task are written by one task, batched with whatever else is
//! queued. Answers (FIN, REQ) wait there up to [`ANSWER_HOLD`] for the answers that follow
//! them, so that nsqd refills its window in groups (see [`Writer`]); every other command
//! goes out at once, with what waits before it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::fold_hash::IdHasher;

use super::delegate::MessageDelegate;
use super::error::{broker_error, Error};
use super::frame::{Command, Frame, FrameCodec, MessageId};
pub(crate) use super::identify::{Identify, IdentifyResponse};
use super::refusal::Role;
use super::stream::{ReadHalf, WriteHalf};
use super::transport::Prepared;

/// An open, identified connection to one nsqd.
pub(crate) struct Connection {
    addr: Arc<str>,
    reader: FramedRead<ReadHalf, FrameCodec>,
    writer: WriteHalf,
    settings: IdentifyResponse,
    role: Role,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `addr`: the magic, IDENTIFY, and the upgrades and AUTH of `transport`
    /// (see [`transport`](super::transport)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the whole handshake takes longer than `connect_timeout`,
    /// [`Error::Io`] for socket errors, [`Error::Refused`] for answers no retry can change, and
    /// [`Error::Broker`] or [`Error::UnexpectedResponse`] for other refusals.
    pub(crate) async fn connect(
        addr: &str,
        identify: &Identify,
        transport: &Prepared,
        max_frame_size: usize,
        connect_timeout: Duration,
    ) -> Result<Connection, Error> {
        let fut = super::transport::open(addr, identify, transport, max_frame_size);
        match tokio::time::timeout(connect_timeout, fut).await {
            Ok(Ok((read, writer, settings))) => Ok(Connection {
                addr: addr.into(),
                reader: FramedRead::with_capacity(read, FrameCodec::new(max_frame_size), 64 * 1024),
                writer,
                settings,
                role: transport.role(),
            }),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(Error::Timeout {
                addr: addr.to_string(),
                what: "connecting, IDENTIFY, upgrades and AUTH",
                after: connect_timeout,
                knob: "connect_timeout",
            }),
        }
    }

    /// Subscribes to `topic`/`channel` and waits for `OK`.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when nsqd refuses (bad names, heartbeats disabled), or socket errors.
    pub(crate) async fn subscribe(&mut self, topic: &str, channel: &str) -> Result<(), Error> {
        self.send(&Command::Sub {
            topic: topic.to_string(),
            channel: channel.to_string(),
        })
        .await?;
        let answer = self
            .expect_response("SUB")
            .await
            .map_err(|error| super::refusal::classify("SUB", error, self.role))?;
        if &answer[..] != b"OK" {
            return Err(self.unexpected("SUB", &answer));
        }
        Ok(())
    }

    /// Writes one command and flushes it.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the socket fails.
    pub(crate) async fn send(&mut self, command: &Command) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        command.encode(&mut buf);
        let io = |cause| Error::Io {
            addr: self.addr.to_string(),
            cause,
        };
        self.writer.write_all(&buf).await.map_err(io)?;
        self.writer.flush().await.map_err(io)
    }

    /// Reads the next frame. `Ok(None)` means nsqd closed the socket cleanly.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] for malformed frames and socket errors.
    pub(crate) async fn read_frame(&mut self) -> Result<Option<Frame>, Error> {
        match self.reader.next().await {
            None => Ok(None),
            Some(Ok(frame)) => Ok(Some(frame)),
            Some(Err(cause)) => Err(Error::Protocol {
                addr: self.addr.to_string(),
                cause,
            }),
        }
    }

    /// Reads the answer to a command, answering heartbeats on the way. An error frame
    /// becomes [`Error::Broker`].
    async fn expect_response(&mut self, command: &'static str) -> Result<Bytes, Error> {
        loop {
            match self.read_frame().await? {
                None => {
                    return Err(Error::ConnectionClosed {
                        addr: self.addr.to_string(),
                    })
                }
                Some(Frame::Response(data)) if &data[..] == super::frame::HEARTBEAT => {
                    self.send(&Command::Nop).await?;
                }
                Some(Frame::Response(data)) => return Ok(data),
                Some(Frame::Error(text)) => return Err(broker_error(&self.addr, &text)),
                Some(Frame::Message(_)) => return Err(self.unexpected(command, b"a message")),
            }
        }
    }

    fn unexpected(&self, command: &'static str, answer: &[u8]) -> Error {
        Error::UnexpectedResponse {
            addr: self.addr.to_string(),
            command,
            answer: String::from_utf8_lossy(answer).into_owned(),
        }
    }

    /// nsqd's settings from the IDENTIFY response.
    pub(crate) fn settings(&self) -> &IdentifyResponse {
        &self.settings
    }

    /// Splits into the frame reader and the raw write half.
    pub(crate) fn into_parts(self) -> (FramedRead<ReadHalf, FrameCodec>, WriteHalf) {
        (self.reader, self.writer)
    }
}

/// The shared end of a live consumer connection: the writer's queue and the IDs in flight.
///
/// Held by the connection's task and by every [`Message`](super::Message) that came from it.
/// The in-flight set is the single source of truth for "does anyone still owe nsqd an answer
/// for this ID": FIN/REQ remove the ID before queueing the command, so a message is answered at
/// most once however many tasks race (the handler, the message's drop, shutdown's final REQ).
///
/// What answering writes (the in-flight set, the count set aside) lies on lines of its own
/// ([`Answering`]): every message read takes a reference to the handle and every message
/// answered drops one, often on another core, and the reference count must not share a line
/// with a lock those cores take.
pub(crate) struct ConnHandle {
    pub(crate) addr: Arc<str>,
    /// The consumer its messages call back when they are answered.
    pub(crate) consumer: Arc<dyn MessageDelegate>,
    /// Commands for the [`Writer`] task. Its receiver is closed when the connection ends, so a
    /// late FIN fails with [`Error::ConnectionClosed`] instead of vanishing.
    commands: mpsc::UnboundedSender<Outgoing>,
    closed: AtomicBool,
    answering: Answering,
}

/// The parts of a [`ConnHandle`] that answering writes, aligned to 128 bytes (two cache
/// lines, as the CPU prefetches them in pairs) away from its reference count.
#[repr(align(128))]
struct Answering {
    /// `std` mutex: held for one set operation, never across an `.await`.
    in_flight: Mutex<HashSet<MessageId, IdHasher>>,
    /// Messages in flight that the application set aside (`Message::park`): they do not count
    /// toward `max_in_flight`, so RDY is raised by as many.
    parked: AtomicU32,
}

impl ConnHandle {
    /// A handle whose messages call back `consumer`, and the receiving end for its [`Writer`].
    pub(crate) fn new(
        addr: Arc<str>,
        consumer: Arc<dyn MessageDelegate>,
    ) -> (Arc<ConnHandle>, mpsc::UnboundedReceiver<Outgoing>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let handle = ConnHandle {
            addr,
            consumer,
            commands,
            closed: AtomicBool::new(false),
            answering: Answering {
                in_flight: Mutex::new(HashSet::with_capacity_and_hasher(64, IdHasher)),
                parked: AtomicU32::new(0),
            },
        };
        (Arc::new(handle), rx)
    }

    /// A handle for unit tests, whose messages call back a consumer that does nothing.
    #[cfg(test)]
    pub(crate) fn for_test(addr: &str) -> (Arc<ConnHandle>, mpsc::UnboundedReceiver<Outgoing>) {
        ConnHandle::new(addr.into(), Arc::new(super::delegate::Nobody))
    }

    /// Queues a command that answers no message (RDY, NOP, CLS).
    pub(crate) fn send(&self, command: Command) -> Result<(), Error> {
        self.commands
            .send(Outgoing::One(command))
            .map_err(|_| self.closed_error())
    }

    fn closed_error(&self) -> Error {
        Error::ConnectionClosed {
            addr: self.addr.to_string(),
        }
    }

    /// Why `id` cannot be answered: the connection is gone, or it was answered already.
    fn not_in_flight(&self, id: MessageId) -> Error {
        if self.is_closed() {
            self.closed_error()
        } else {
            Error::NotInFlight { id: id.to_string() }
        }
    }

    /// Messages of this connection set aside now.
    pub(crate) fn parked(&self) -> u32 {
        self.answering.parked.load(Ordering::Relaxed)
    }

    /// One more message set aside (`parked`), or one fewer.
    pub(crate) fn park(&self, parked: bool) {
        // Relaxed: a count the control task reads when it computes RDY; the notice that
        // follows each change makes it read again.
        if parked {
            self.answering.parked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.answering.parked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Records delivered messages as in flight, under one lock for a burst.
    pub(crate) fn track(&self, ids: impl IntoIterator<Item = MessageId>) {
        self.ids().extend(ids);
    }

    /// The IDs in flight, locked.
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<MessageId, IdHasher>> {
        self.answering.in_flight.lock().expect("in-flight lock")
    }

    /// Answers message `id` with `command` (FIN or REQ) if it is still in flight here.
    pub(crate) fn answer(&self, id: MessageId, command: Command) -> Result<(), Error> {
        let removed = self.ids().remove(&id);
        if !removed {
            return Err(self.not_in_flight(id));
        }
        self.send(command)
    }

    /// Answers each message of `answers` that is still in flight here with its command (FIN or
    /// REQ), all queued as one write: one lock of the in-flight set and one wake-up of the
    /// writer for a whole burst. The results are in the order of `answers`.
    pub(crate) fn answer_many(&self, answers: Vec<(MessageId, Command)>) -> Vec<Result<(), Error>> {
        let mut results = Vec::with_capacity(answers.len());
        let mut commands = Vec::with_capacity(answers.len());
        {
            let mut in_flight = self.ids();
            for (id, command) in answers {
                if in_flight.remove(&id) {
                    commands.push(command);
                    results.push(Ok(()));
                } else {
                    results.push(Err(self.not_in_flight(id)));
                }
            }
        }
        if !commands.is_empty() && self.commands.send(Outgoing::Many(commands)).is_err() {
            for result in results.iter_mut().filter(|r| r.is_ok()) {
                *result = Err(self.closed_error());
            }
        }
        results
    }

    /// Whether `id` is still owed an answer.
    pub(crate) fn is_in_flight(&self, id: &MessageId) -> bool {
        self.ids().contains(id)
    }

    /// How many messages are owed an answer.
    pub(crate) fn in_flight(&self) -> usize {
        self.ids().len()
    }

    /// Takes every ID still in flight, so the caller can requeue them.
    pub(crate) fn take_in_flight(&self) -> Vec<MessageId> {
        self.ids().drain().collect()
    }

    /// Marks the connection as gone; later answers fail with [`Error::ConnectionClosed`].
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// What the connection's owners queue for its [`Writer`].
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// One command.
    One(Command),
    /// A burst's answers, written together.
    Many(Vec<Command>),
}

impl Outgoing {
    /// How many messages it answers (FIN, REQ); `None` for any other command, which is
    /// written at once.
    fn answers(&self) -> Option<usize> {
        match self {
            Outgoing::One(Command::Fin(_) | Command::Req(..)) => Some(1),
            Outgoing::One(_) => None,
            Outgoing::Many(commands) => Some(commands.len()),
        }
    }

    fn encode(self, buf: &mut BytesMut) {
        match self {
            Outgoing::One(command) => command.encode(buf),
            Outgoing::Many(commands) => {
                for command in commands {
                    command.encode(buf);
                }
            }
        }
    }
}

/// The longest answers (FIN, REQ) wait in the [`Writer`] for the answers that follow them.
/// Tokio's timer counts whole milliseconds, so the wait is at most one more; far below any
/// `msg_timeout` nsqd accepts (1 s at least).
pub(crate) const ANSWER_HOLD: Duration = Duration::from_millis(3);

/// The task that owns a connection's write half.
///
/// It waits for one command, then takes everything else already queued (up to 64 KiB) and
/// writes it in one go. Answers wait for more answers before they are written, up to
/// [`ANSWER_HOLD`] after the first, while they number less than a quarter of the RDY last
/// sent: nsqd sends a new message for each answer it reads, so answers that reach it one
/// small group at a time come back as as many small bursts, each costing the consumer a
/// wake-up, a hand-off and a write of answers (a consumer served by the serve sink answers a
/// few dozen messages at a time). Held a moment, they come back as fewer, larger bursts,
/// and nsqd keeps at least three quarters of its window to send into meanwhile; with a RDY
/// below 4 (a consumer taking messages one at a time), answers go out at once. Any other
/// command (RDY, NOP, TOUCH, CLS), and closing, end the wait: what waits goes out with it.
pub(crate) struct Writer {
    pub(crate) write: WriteHalf,
    pub(crate) commands: mpsc::UnboundedReceiver<Outgoing>,
    /// Cancelled by the connection's owner to close: the writer writes what is queued, then
    /// shuts the socket's write side and closes its queue.
    pub(crate) close: CancellationToken,
}

const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// What the [`Writer`] has taken since its last write.
struct Batch {
    buf: BytesMut,
    /// Answers in `buf`.
    answers: usize,
    /// A command that is not an answer is in `buf`: write at once.
    urgent: bool,
    /// The last RDY written: answers wait while they number less than a quarter of it.
    rdy: u32,
}

impl Batch {
    fn take(&mut self, outgoing: Outgoing) {
        match outgoing.answers() {
            Some(answers) => self.answers += answers,
            None => self.urgent = true,
        }
        if let Outgoing::One(Command::Rdy(count)) = outgoing {
            self.rdy = count;
        }
        outgoing.encode(&mut self.buf);
    }

    /// Whether to write now rather than wait for more answers.
    fn is_due(&self) -> bool {
        self.urgent
            || self.answers >= (self.rdy / 4) as usize
            || self.buf.len() >= WRITE_BATCH_BYTES
    }
}

impl Writer {
    /// Runs until closed or the socket fails.
    ///
    /// # Errors
    ///
    /// The socket error that stopped it.
    pub(crate) async fn run(mut self) -> std::io::Result<()> {
        let mut batch = Batch {
            buf: BytesMut::with_capacity(WRITE_BATCH_BYTES),
            answers: 0,
            urgent: false,
            rdy: 0,
        };
        let result = loop {
            let first = tokio::select! {
                biased;
                cmd = self.commands.recv() => cmd,
                _ = self.close.cancelled() => None,
            };
            let Some(first) = first else { break Ok(()) };
            batch.take(first);
            self.take_queued(&mut batch);
            if !batch.is_due() {
                self.hold(&mut batch).await;
            }
            let buf = &mut batch.buf;
            // The flush pushes TLS records and compressed blocks out (a no-op on plain TCP).
            if let Err(e) = self.write.write_all(buf).await {
                break Err(e);
            }
            if let Err(e) = self.write.flush().await {
                break Err(e);
            }
            buf.clear();
            batch.answers = 0;
            batch.urgent = false;
        };
        // Close the queue first so nothing new arrives, then write what is already in it,
        // answers held at the close included.
        self.commands.close();
        if result.is_ok() {
            while let Ok(cmd) = self.commands.try_recv() {
                batch.take(cmd);
            }
            if !batch.buf.is_empty() {
                self.write.write_all(&batch.buf).await?;
                self.write.flush().await?;
            }
            let _ = self.write.shutdown().await;
        }
        result
    }

    /// Takes what is queued now, up to a write's worth.
    fn take_queued(&mut self, batch: &mut Batch) {
        while batch.buf.len() < WRITE_BATCH_BYTES {
            match self.commands.try_recv() {
                Ok(cmd) => batch.take(cmd),
                Err(_) => break,
            }
        }
    }

    /// Lets the answers in `batch` wait for more, up to [`ANSWER_HOLD`], until the batch is
    /// due or the connection closes.
    async fn hold(&mut self, batch: &mut Batch) {
        let deadline = tokio::time::Instant::now() + ANSWER_HOLD;
        while !batch.is_due() {
            tokio::select! {
                biased;
                _ = self.close.cancelled() => return,
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => {
                        batch.take(cmd);
                        self.take_queued(batch);
                    }
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A write half that keeps each `write` call apart, as nsqd would read them off the wire.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<String>>>);

    impl Recorded {
        fn writes(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    impl tokio::io::AsyncWrite for Recorded {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let text = String::from_utf8_lossy(buf).into_owned();
            self.0.lock().unwrap().push(text);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    struct Running {
        handle: Arc<ConnHandle>,
        wire: Recorded,
        close: CancellationToken,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    /// A writer on a recorded wire, with messages `a` to `z` in flight, after it wrote
    /// `RDY rdy`.
    async fn writer(rdy: u32) -> Running {
        let (handle, commands) = ConnHandle::for_test("nsqd");
        handle.track((b'a'..=b'z').map(|id| MessageId([id; 16])));
        let wire = Recorded::default();
        let close = CancellationToken::new();
        let task = tokio::spawn(
            Writer {
                write: Box::new(wire.clone()),
                commands,
                close: close.clone(),
            }
            .run(),
        );
        handle.send(Command::Rdy(rdy)).unwrap();
        settle().await;
        assert_eq!(
            wire.writes(),
            vec![format!("RDY {rdy}\n")],
            "RDY goes at once"
        );
        Running {
            handle,
            wire,
            close,
            task,
        }
    }

    /// Lets the writer run what is ready, without moving the (paused) clock.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Answers `ids` with FIN in one call, then lets the writer run.
    async fn fin(handle: &ConnHandle, ids: &[u8]) {
        let answers = ids
            .iter()
            .map(|&id| (MessageId([id; 16]), Command::Fin(MessageId([id; 16]))))
            .collect();
        assert!(handle.answer_many(answers).iter().all(Result::is_ok));
        settle().await;
    }

    impl Running {
        /// Closes the connection and waits for the writer to end.
        async fn close(self) -> Recorded {
            self.close.cancel();
            self.task.await.unwrap().unwrap();
            self.wire
        }
    }

    fn fins(ids: &[u8]) -> String {
        let mut buf = BytesMut::new();
        for &id in ids {
            Command::Fin(MessageId([id; 16])).encode(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    #[tokio::test(start_paused = true)]
    async fn answers_of_several_calls_within_the_hold_go_out_in_one_write() {
        let w = writer(2500).await;
        fin(&w.handle, b"ab").await;
        tokio::time::advance(Duration::from_millis(1)).await;
        fin(&w.handle, b"c").await;
        tokio::time::advance(Duration::from_millis(1)).await;
        fin(&w.handle, b"de").await;
        assert_eq!(
            w.wire.writes().len(),
            1,
            "answers wait for the ones after them"
        );
        tokio::time::advance(ANSWER_HOLD).await;
        settle().await;
        assert_eq!(
            w.wire.writes()[1..],
            [fins(b"abcde")],
            "one write, within the hold"
        );
        // The next answers wait again, and a command that is not an answer takes them along.
        fin(&w.handle, b"f").await;
        w.handle.send(Command::Nop).unwrap();
        settle().await;
        assert_eq!(w.wire.writes()[2..], [fins(b"f") + "NOP\n"]);
        w.close().await;
    }

    #[tokio::test(start_paused = true)]
    async fn answers_reaching_a_quarter_of_rdy_or_with_a_rdy_below_4_go_out_at_once() {
        let w = writer(8).await;
        fin(&w.handle, b"a").await;
        assert_eq!(w.wire.writes().len(), 1, "1 answer of a RDY of 8 waits");
        fin(&w.handle, b"b").await;
        assert_eq!(w.wire.writes()[1..], [fins(b"ab")], "2 of 8 go out");
        w.handle.send(Command::Rdy(3)).unwrap();
        settle().await;
        fin(&w.handle, b"c").await;
        assert_eq!(w.wire.writes()[2..], ["RDY 3\n".to_string(), fins(b"c")]);
        w.close().await;
    }

    #[tokio::test(start_paused = true)]
    async fn answers_held_when_the_connection_closes_are_written_before_it_shuts() {
        let w = writer(2500).await;
        fin(&w.handle, b"ab").await;
        let single = MessageId([b'c'; 16]);
        w.handle.answer(single, Command::Fin(single)).unwrap();
        settle().await;
        assert_eq!(w.wire.writes().len(), 1, "held");
        let wire = w.close().await;
        assert_eq!(wire.writes()[1..].concat(), fins(b"abc"), "none lost");
    }

    /// Sequential nsqd-style IDs must spread over the low bits that pick a bucket.
    #[test]
    fn id_hash_spreads_sequential_ids() {
        let mut buckets = [0u32; 256];
        for i in 0..25_600u64 {
            let text = format!("{:04x}{:012x}", 1, i);
            let mut id = [0u8; 16];
            id.copy_from_slice(text.as_bytes());
            let h = IdHasher.hash_one(MessageId(id));
            buckets[(h & 0xff) as usize] += 1;
        }
        let (min, max) = (buckets.iter().min().unwrap(), buckets.iter().max().unwrap());
        assert!(
            *min > 50 && *max < 170,
            "bucket loads {min}..{max}, expected about 100"
        );
    }
}
