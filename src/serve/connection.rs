//! One consumer's connection: reads its commands, answers them as nsqd does, writes the
//! messages the dispatcher hands it, and sends heartbeats.
//!
//! One task owns the socket and does everything in one `select!` loop: commands already
//! buffered are answered first, then the task waits for more bytes, message frames from the
//! dispatcher (written together, in one `write`), the heartbeat tick, or the read deadline.
//! States follow nsqd's: before SUB (IDENTIFY, AUTH), subscribed (RDY, FIN, REQ, TOUCH, CLS),
//! closing after CLS (no more messages; what it holds may still be answered). A consumer that
//! sends nothing for two heartbeat intervals is closed, and whatever it held goes back to
//! the pipeline at once (`Dispatcher::remove`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::either::Either;

use super::command::{ClientCommand, CommandParser, ErrorFrame};
use super::config::{DEFAULT_MAX_COMMANDS_BEFORE_SUB, DEFAULT_MAX_LINE_SIZE};
use super::dispatch::{ClientId, ConsumerInfo};
use super::identify::identify;
use super::Shared;
use crate::nsq::frame::{encode_frame, FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT};

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
    /// The sending half the dispatcher gets at SUB.
    frames: mpsc::UnboundedSender<Bytes>,
}

fn response(out: &mut BytesMut, data: &[u8]) {
    encode_frame(FRAME_TYPE_RESPONSE, data, out);
}

/// Serves one consumer after its magic was read, until it leaves, breaks the protocol or
/// the endpoint stops.
pub(crate) async fn run(shared: Arc<Shared>, id: ClientId, stream: TcpStream, remote: SocketAddr) {
    let (frames, mut frames_rx) = mpsc::unbounded_channel();
    let config = &shared.config;
    let mut conn = Connection {
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
        frames,
        shared: shared.clone(),
    };
    let parser = CommandParser {
        max_line: DEFAULT_MAX_LINE_SIZE,
        max_body: config.max_body_size,
    };
    let mut stream: Option<Stream> = Some(Either::Left(stream));
    let mut input = BytesMut::with_capacity(4096);
    let mut last_read = Instant::now();
    let mut beat = heartbeat_ticker(conn.heartbeat);
    let reason = 'conn: loop {
        // Answer every command already read before waiting for more.
        loop {
            let command = match parser.parse(&mut input) {
                Ok(Some(command)) => command,
                Ok(None) => break,
                Err(error) => {
                    conn.refuse(&error);
                    break 'conn error.text;
                }
            };
            let heartbeat = conn.heartbeat;
            match conn.answer(command) {
                Ok(Next::Continue) => {}
                Ok(Next::UpgradeTls) => {
                    let Some(s) = stream.as_mut() else {
                        break 'conn "no stream".into();
                    };
                    if let Err(error) = write_out(s, &mut conn.out, heartbeat).await {
                        break 'conn error;
                    }
                    if !input.is_empty() {
                        conn.refuse(&ErrorFrame::fatal(
                            "E_IDENTIFY_FAILED",
                            "IDENTIFY failed: data sent before the TLS handshake",
                        ));
                        break 'conn "data before the TLS handshake".into();
                    }
                    match upgrade(&shared, stream.take()).await {
                        Ok(upgraded) => stream = Some(upgraded),
                        Err(error) => break 'conn error,
                    }
                    conn.info.tls = true;
                    response(&mut conn.out, b"OK");
                }
                Err(error) => {
                    let fatal = error.fatal;
                    conn.refuse(&error);
                    if fatal {
                        break 'conn error.text;
                    }
                }
            }
            if conn.heartbeat != heartbeat {
                beat = heartbeat_ticker(conn.heartbeat);
            }
        }
        let Some(s) = stream.as_mut() else {
            break "no stream".into();
        };
        if let Err(error) = write_out(s, &mut conn.out, conn.heartbeat).await {
            break error;
        }
        let deadline = conn.heartbeat.map(|hb| last_read + 2 * hb);
        input.reserve(4096);
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => break "the endpoint stopped".into(),
            read = s.read_buf(&mut input) => match read {
                Ok(0) => break "the consumer closed the connection".into(),
                Ok(_) => last_read = Instant::now(),
                Err(error) => break format!("reading failed: {error}"),
            },
            Some(frame) = frames_rx.recv() => {
                conn.out.extend_from_slice(&frame);
                while let Ok(frame) = frames_rx.try_recv() {
                    conn.out.extend_from_slice(&frame);
                }
            }
            _ = tick(&mut beat) => response(&mut conn.out, HEARTBEAT),
            () = sleep_until(deadline) => {
                shared.heartbeat_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                break "the consumer missed two heartbeats".into();
            }
        }
    };
    // Best effort: the last error frame, if any.
    if let Some(s) = stream.as_mut() {
        let _ = write_out(s, &mut conn.out, conn.heartbeat).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), s.shutdown()).await;
    }
    shared.dispatcher.remove(id);
    tracing::info!(client = id, %remote, %reason, "Consumer connection closed.");
}

impl Connection {
    fn refuse(&mut self, error: &ErrorFrame) {
        encode_frame(FRAME_TYPE_ERROR, error.text.as_bytes(), &mut self.out);
    }

    fn served(&self) -> String {
        let config = &self.shared.config;
        format!(
            "this endpoint serves topic {:?} channel {:?}",
            config.topic, config.channel
        )
    }

    /// Answers one command, as nsqd's `protocol_v2.go` does.
    fn answer(&mut self, command: ClientCommand) -> Result<Next, ErrorFrame> {
        let shared = self.shared.clone();
        let config = &shared.config;
        let name = command_name(&command);
        if self.phase == Phase::Init {
            self.commands_before_sub += 1;
            if self.commands_before_sub > DEFAULT_MAX_COMMANDS_BEFORE_SUB {
                return Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!("more than {DEFAULT_MAX_COMMANDS_BEFORE_SUB} commands before SUB"),
                ));
            }
        }
        let tls_required = config.tls.as_ref().is_some_and(|t| t.required);
        if tls_required && !self.info.tls && !matches!(command, ClientCommand::Identify(_)) {
            return Err(ErrorFrame::fatal(
                "E_INVALID",
                format_args!("cannot {name} in current state (TLS required)"),
            ));
        }
        let in_state = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!("cannot {name} in current state"),
                ))
            }
        };
        let answered = matches!(self.phase, Phase::Subscribed | Phase::Closing);
        match command {
            ClientCommand::Identify(body) => {
                in_state(self.phase == Phase::Init)?;
                let got = identify(&body, config, self.heartbeat, self.msg_timeout)?;
                self.heartbeat = got.heartbeat_interval;
                self.msg_timeout = got.msg_timeout;
                self.info.client_id = got.client_id;
                self.info.hostname = got.hostname;
                self.info.user_agent = got.user_agent;
                response(&mut self.out, &got.response);
                if got.tls {
                    return Ok(Next::UpgradeTls);
                }
            }
            ClientCommand::Auth(secret) => {
                in_state(self.phase == Phase::Init)?;
                if self.info.authed {
                    return Err(ErrorFrame::fatal("E_INVALID", "AUTH already set"));
                }
                let Some(expected) = &config.auth_secret else {
                    return Err(ErrorFrame::fatal("E_AUTH_DISABLED", "AUTH disabled"));
                };
                if !expected.matches(&secret) {
                    return Err(ErrorFrame::fatal("E_AUTH_FAILED", "AUTH failed"));
                }
                self.info.authed = true;
                response(
                    &mut self.out,
                    br#"{"identity":"consumer","identity_url":"","permission_count":1}"#,
                );
            }
            ClientCommand::Sub { topic, channel } => {
                in_state(self.phase == Phase::Init)?;
                if self.heartbeat.is_none() {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        "cannot SUB with heartbeats disabled",
                    ));
                }
                let topic = String::from_utf8_lossy(&topic);
                let channel = String::from_utf8_lossy(&channel);
                if !crate::nsq::is_valid_name(&topic) {
                    return Err(ErrorFrame::fatal(
                        "E_BAD_TOPIC",
                        format_args!("SUB topic name {topic:?} is not valid"),
                    ));
                }
                if !crate::nsq::is_valid_name(&channel) {
                    return Err(ErrorFrame::fatal(
                        "E_BAD_CHANNEL",
                        format_args!("SUB channel name {channel:?} is not valid"),
                    ));
                }
                if config.auth_secret.is_some() && !self.info.authed {
                    return Err(ErrorFrame::fatal(
                        "E_AUTH_FIRST",
                        "AUTH required before SUB",
                    ));
                }
                if topic != config.topic {
                    return Err(ErrorFrame::fatal(
                        "E_BAD_TOPIC",
                        format_args!("SUB topic {topic:?} is not served here: {}", self.served()),
                    ));
                }
                if channel != config.channel {
                    return Err(ErrorFrame::fatal(
                        "E_BAD_CHANNEL",
                        format_args!(
                            "SUB channel {channel:?} is not served here: {}",
                            self.served()
                        ),
                    ));
                }
                self.phase = Phase::Subscribed;
                tracing::info!(client = self.id, remote = %self.info.remote_address, user_agent = %self.info.user_agent, tls = self.info.tls, "Consumer subscribed.");
                shared.dispatcher.subscribe(
                    self.id,
                    self.info.clone(),
                    self.msg_timeout,
                    self.frames.clone(),
                );
                response(&mut self.out, b"OK");
            }
            ClientCommand::Rdy(count) => {
                if self.phase == Phase::Closing {
                    // nsqd ignores RDY after CLS.
                    return Ok(Next::Continue);
                }
                in_state(self.phase == Phase::Subscribed)?;
                let max = u64::from(config.max_rdy_count);
                if count > max {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        format_args!("RDY count {count} out of range 0-{max}"),
                    ));
                }
                shared.dispatcher.set_rdy(self.id, count);
            }
            ClientCommand::Fin(id) => {
                in_state(answered)?;
                shared.dispatcher.finish(self.id, id).map_err(|why| {
                    ErrorFrame::non_fatal("E_FIN_FAILED", format_args!("FIN {id} failed {why}"))
                })?;
            }
            ClientCommand::Req(id, delay_ms) => {
                in_state(answered)?;
                let delay = Duration::from_millis(delay_ms).min(config.max_req_timeout);
                shared
                    .dispatcher
                    .requeue(self.id, id, delay)
                    .map_err(|why| {
                        ErrorFrame::non_fatal("E_REQ_FAILED", format_args!("REQ {id} failed {why}"))
                    })?;
            }
            ClientCommand::Touch(id) => {
                in_state(answered)?;
                shared.dispatcher.touch(self.id, id).map_err(|why| {
                    ErrorFrame::non_fatal("E_TOUCH_FAILED", format_args!("TOUCH {id} failed {why}"))
                })?;
            }
            ClientCommand::Nop => {}
            ClientCommand::Cls => {
                in_state(self.phase == Phase::Subscribed)?;
                self.phase = Phase::Closing;
                shared.dispatcher.close(self.id);
                response(&mut self.out, b"CLOSE_WAIT");
            }
            ClientCommand::Publish(name) => {
                return Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!(
                        "{name} refused: this endpoint only serves consumers ({}); publish to nsqd",
                        self.served()
                    ),
                ));
            }
        }
        Ok(Next::Continue)
    }
}

fn command_name(command: &ClientCommand) -> &'static str {
    match command {
        ClientCommand::Identify(_) => "IDENTIFY",
        ClientCommand::Auth(_) => "AUTH",
        ClientCommand::Sub { .. } => "SUB",
        ClientCommand::Rdy(_) => "RDY",
        ClientCommand::Fin(_) => "FIN",
        ClientCommand::Req(..) => "REQ",
        ClientCommand::Touch(_) => "TOUCH",
        ClientCommand::Nop => "NOP",
        ClientCommand::Cls => "CLS",
        ClientCommand::Publish(name) => name,
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
        Ok(Err(error)) => Err(format!("writing failed: {error}")),
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
