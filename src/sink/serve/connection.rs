//! One consumer's connection: reads its commands, answers them as nsqd does, writes the
//! messages the dispatcher hands it, and sends heartbeats.
//!
//! One task owns the socket and does everything in one `select!` loop: commands already
//! buffered are answered first (a run of FIN, REQ and TOUCH settled together, with one lock
//! of the dispatcher), then what they queued is written in one `write`, the message frames
//! they made room for included, and the task waits for more bytes, the dispatcher's word
//! that frames wait for it, the heartbeat tick, or the read deadline. After a read, while the
//! consumer holds many messages, the task waits a moment before it reads again
//! ([`GATHER_WINDOW`]): the consumer's FINs, written one by one, are then read many at once,
//! and on Linux do not wake the endpoint as they arrive (`lowat`); the frames handed over
//! meanwhile wait for the window's end, and go out in one write with those the answers read
//! then made room for, so the task wakes once a window, not also once a burst.
//! States follow nsqd's: before SUB (IDENTIFY, AUTH), subscribed (RDY, FIN, REQ, TOUCH, CLS),
//! closing after CLS (no more messages; what it holds may still be answered); `answer` has a
//! function per command. A consumer that sends nothing for two heartbeat intervals is closed,
//! and whatever it held goes back to the pipeline at once (`Dispatcher::remove`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::either::Either;

use super::command::{CommandParser, ErrorFrame};
use super::config::{DEFAULT_MAX_LINE_SIZE, GATHER_MIN_HELD, GATHER_WINDOW};
use super::dispatch::{ClientId, ConsumerInfo, Settle};
use super::Shared;
use crate::nsq::frame::{encode_frame, FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT};

mod answer;
mod lowat;

type Stream = Either<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// Where the consumer is in nsqd's state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Init,
    Subscribed,
    Closing,
}

/// What answering a command asks of the loop.
enum Next {
    Continue,
    /// IDENTIFY agreed on TLS: the handshake follows the answer.
    UpgradeTls,
}

/// One consumer as nsqd's protocol keeps it: its state, what IDENTIFY agreed, and the frames
/// its commands' answers queue (`answer`).
struct Connection {
    id: ClientId,
    shared: Arc<Shared>,
    phase: Phase,
    heartbeat: Option<Duration>,
    msg_timeout: Duration,
    info: ConsumerInfo,
    commands_before_sub: u32,
    /// Frames waiting to be written.
    out: BytesMut,
    /// FIN, REQ and TOUCH read and not yet settled: a run of them is settled at once.
    pending: Vec<Settle>,
    /// How many messages the consumer held when the dispatcher last said.
    held: u64,
    /// Told by the dispatcher, which gets it at SUB, that message frames wait for this
    /// connection.
    wake: Arc<Notify>,
}

fn response(out: &mut BytesMut, data: &[u8]) {
    encode_frame(FRAME_TYPE_RESPONSE, data, out);
}

/// Serves one consumer after its magic was read, until it leaves, breaks the protocol or
/// the endpoint stops.
pub(crate) async fn run(shared: Arc<Shared>, id: ClientId, stream: TcpStream, remote: SocketAddr) {
    let config = &shared.config;
    let conn = Connection {
        id,
        phase: Phase::Init,
        heartbeat: Some(config.heartbeat_interval),
        msg_timeout: config.msg_timeout,
        info: ConsumerInfo {
            remote_address: remote.to_string(),
            ..ConsumerInfo::default()
        },
        commands_before_sub: 0,
        out: BytesMut::new(),
        pending: Vec::new(),
        held: 0,
        wake: Arc::new(Notify::new()),
        shared: shared.clone(),
    };
    let mut session = Session {
        parser: CommandParser {
            max_line: DEFAULT_MAX_LINE_SIZE,
            max_body: config.max_body_size,
        },
        stream: Some(Either::Left(stream)),
        input: BytesMut::with_capacity(4096),
        last_read: Instant::now(),
        just_read: false,
        mark_raised: false,
        beat: heartbeat_ticker(conn.heartbeat),
        conn,
    };
    let reason = session.serve().await;
    // What it holds goes back before the socket's last write: no message goes to a
    // connection that is closing.
    let handed_back = shared.dispatcher.remove(id);
    session.close().await;
    tracing::info!(client = id, %remote, %reason, handed_back, "Consumer connection closed; the messages it held are handed back.");
}

/// The socket side of one connection: what it has read, what it waits for, and the protocol
/// state its commands are answered with.
struct Session {
    conn: Connection,
    parser: CommandParser,
    /// `None` once a TLS handshake took the plain stream and failed.
    stream: Option<Stream>,
    /// Bytes read and not yet parsed.
    input: BytesMut,
    last_read: Instant,
    /// The last wait ended with a read: its answers are settled, and the next read may wait.
    just_read: bool,
    /// The socket's low-water mark is raised (`lowat`): set by a gathering, kept while the
    /// reads after it find answers, lowered before the connection waits for bytes.
    mark_raised: bool,
    beat: Option<tokio::time::Interval>,
}

impl Session {
    /// Serves until the connection ends, and says why it ended.
    async fn serve(&mut self) -> String {
        loop {
            // Answer every command already read before waiting for more.
            if let Err(reason) = self.answer_buffered().await {
                return reason;
            }
            if std::mem::take(&mut self.just_read) && self.conn.held >= GATHER_MIN_HELD {
                if let Err(reason) = self.gather().await {
                    return reason;
                }
                match self.read_gathered() {
                    // Read: answered next, and the mark stays raised for the next gathering.
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(reason) => return reason,
                }
            }
            self.lower_mark();
            if let Err(reason) = self.write_and_wait().await {
                return reason;
            }
        }
    }

    /// Answers each complete command in the input; an error is why the connection closes.
    async fn answer_buffered(&mut self) -> Result<(), String> {
        loop {
            let command = match self.parser.parse(&mut self.input) {
                Ok(Some(command)) => command,
                Ok(None) => {
                    self.conn.settle_pending();
                    return Ok(());
                }
                Err(error) => {
                    self.conn.settle_pending();
                    self.conn.refuse(&error);
                    return Err(error.text);
                }
            };
            let heartbeat = self.conn.heartbeat;
            match self.conn.answer(command) {
                Ok(Next::Continue) => {}
                Ok(Next::UpgradeTls) => self.upgrade_tls(heartbeat).await?,
                Err(error) => {
                    // The answers read before it come first.
                    self.conn.settle_pending();
                    self.conn.refuse(&error);
                    if error.fatal {
                        return Err(error.text);
                    }
                }
            }
            if self.conn.heartbeat != heartbeat {
                self.beat = heartbeat_ticker(self.conn.heartbeat);
            }
        }
    }

    /// After IDENTIFY agreed on TLS: its answer in plain text, then the handshake, then `OK`
    /// over TLS.
    async fn upgrade_tls(&mut self, heartbeat: Option<Duration>) -> Result<(), String> {
        let stream = self.stream.as_mut().ok_or("no stream")?;
        write_out(stream, &mut self.conn.out, heartbeat).await?;
        if !self.input.is_empty() {
            self.conn.refuse(&ErrorFrame::fatal(
                "E_IDENTIFY_FAILED",
                "IDENTIFY failed: data sent before the TLS handshake",
            ));
            return Err("data before the TLS handshake".into());
        }
        self.stream = Some(upgrade(&self.conn.shared, self.stream.take()).await?);
        self.conn.info.tls = true;
        response(&mut self.conn.out, b"OK");
        Ok(())
    }

    /// Waits until [`GATHER_WINDOW`] after the last read with the socket's low-water mark
    /// raised, having written what is queued, then takes the frames the dispatcher handed
    /// over meanwhile; an error is why the connection closes.
    async fn gather(&mut self) -> Result<(), String> {
        if !self.mark_raised {
            lowat::raise(self.stream.as_ref().ok_or("no stream")?);
            self.mark_raised = true;
        }
        self.gather_until(self.last_read + GATHER_WINDOW).await
    }

    /// After a gathering, reads what the consumer sent meanwhile without waiting, the mark
    /// still raised: `Ok(true)` if it read something, `Ok(false)` if nothing came or the
    /// stream cannot be read so (TLS: the connection then waits for it as usual); an error is
    /// why the connection closes.
    fn read_gathered(&mut self) -> Result<bool, String> {
        let stream = self.stream.as_ref().ok_or("no stream")?;
        match lowat::read_now(stream, &mut self.input) {
            None => Ok(false),
            Some(Err(error)) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Some(read) => self.took(read).map(|()| true),
        }
    }

    /// Takes the outcome of a read into `input`: bytes came, the consumer closed its end (0
    /// bytes), or the read failed; an error is why the connection closes.
    fn took(&mut self, read: std::io::Result<usize>) -> Result<(), String> {
        match read {
            Ok(0) => Err(CLOSED.into()),
            Ok(_) => {
                self.last_read = Instant::now();
                self.just_read = true;
                Ok(())
            }
            Err(error) => Err(failed("reading", &error)),
        }
    }

    /// Lowers the mark if a gathering raised it, before the connection waits for bytes.
    fn lower_mark(&mut self) {
        if let (true, Some(stream)) = (self.mark_raised, &self.stream) {
            lowat::lower(stream);
        }
        self.mark_raised = false;
    }

    async fn gather_until(&mut self, until: Instant) -> Result<(), String> {
        loop {
            let stream = self.stream.as_mut().ok_or("no stream")?;
            write_out(stream, &mut self.conn.out, self.conn.heartbeat).await?;
            let shared = &self.conn.shared;
            // Frames handed over meanwhile wait for the window's end, when the answers read
            // then make room for more and both go out in one write: the consumer still holds
            // many messages to work on, and the connection is woken once per window, not
            // once per burst the pipeline hands over as well.
            tokio::select! {
                biased;
                () = shared.cancel.cancelled() => return Err("the endpoint stopped".into()),
                () = tokio::time::sleep_until(until) => {
                    self.conn.held = shared.dispatcher.take_frames(self.conn.id, &mut self.conn.out);
                    return Ok(());
                }
                // A consumer that keeps the connection gathering still gets its heartbeats.
                _ = tick(&mut self.beat) => response(&mut self.conn.out, HEARTBEAT),
            }
        }
    }

    /// Writes what is queued, then waits for more bytes, the word that message frames wait,
    /// the heartbeat tick or the read deadline; an error is why the connection closes.
    async fn write_and_wait(&mut self) -> Result<(), String> {
        let stream = self.stream.as_mut().ok_or("no stream")?;
        write_out(stream, &mut self.conn.out, self.conn.heartbeat).await?;
        let deadline = self.conn.heartbeat.map(|hb| self.last_read + 2 * hb);
        let shared = &self.conn.shared;
        self.input.reserve(4096);
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return Err("the endpoint stopped".into()),
            read = stream.read_buf(&mut self.input) => self.took(read)?,
            () = self.conn.wake.notified() => {
                self.conn.held = shared.dispatcher.take_frames(self.conn.id, &mut self.conn.out);
            }
            _ = tick(&mut self.beat) => response(&mut self.conn.out, HEARTBEAT),
            () = sleep_until(deadline) => {
                shared.heartbeat_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err("the consumer missed two heartbeats".into());
            }
        }
        Ok(())
    }

    /// Best effort: the last error frame, if any, then the shutdown of the socket.
    async fn close(&mut self) {
        if let Some(stream) = self.stream.as_mut() {
            let _ = write_out(stream, &mut self.conn.out, self.conn.heartbeat).await;
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
        }
    }
}

impl Connection {
    fn refuse(&mut self, error: &ErrorFrame) {
        encode_frame(FRAME_TYPE_ERROR, error.text.as_bytes(), &mut self.out);
    }
}

fn heartbeat_ticker(interval: Option<Duration>) -> Option<tokio::time::Interval> {
    interval.map(|every| {
        let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    })
}

async fn tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Writes what is queued in one `write`, within a heartbeat interval (nsqd's write deadline).
async fn write_out(
    stream: &mut Stream,
    out: &mut BytesMut,
    heartbeat: Option<Duration>,
) -> Result<(), String> {
    if out.is_empty() {
        return Ok(());
    }
    let limit = heartbeat.unwrap_or(super::config::DEFAULT_HEARTBEAT_INTERVAL);
    let written = tokio::time::timeout(limit, async {
        stream.write_all(out).await?;
        stream.flush().await
    })
    .await;
    out.clear();
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(failed("writing", &error)),
        Err(_) => Err(format!("the consumer read nothing for {limit:?}")),
    }
}

/// The TLS handshake on the plain connection.
async fn upgrade(shared: &Shared, stream: Option<Stream>) -> Result<Stream, String> {
    let (Some(acceptor), Some(Either::Left(tcp))) = (&shared.tls, stream) else {
        return Err("TLS is not configured or already on".into());
    };
    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Ok(Either::Right(Box::new(tls))),
        Ok(Err(error)) => Err(format!("the TLS handshake failed: {error}")),
        Err(_) => Err("the TLS handshake took more than 10 s".into()),
    }
}

/// Why a connection ended when the consumer closed it: its own exit, or its process's end.
const CLOSED: &str = "the consumer closed the connection";

/// Why a connection ended after `action` (reading, writing) failed with `error`: a consumer
/// that closed or reset its end is a consumer that left (`nsq_tail -n` exiting closes while
/// messages are on their way), not a failure.
fn failed(action: &str, error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::BrokenPipe
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::UnexpectedEof => CLOSED.to_owned(),
        _ => format!("{action} failed: {error}"),
    }
}
