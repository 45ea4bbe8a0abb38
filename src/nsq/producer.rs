//! The producer: PUB, MPUB and DPUB to one or more nsqd.
//!
//! Each nsqd gets a task that owns its connection. Requests reach it over a channel; it writes
//! them (batched with whatever else is queued) and keeps their reply slots in a queue in write
//! order, because nsqd answers commands in the order it reads them. An `OK` or an error frame
//! pops the oldest slot; heartbeats are answered with `NOP` and match nothing.
//!
//! The task connects lazily, on the first request, and reconnects the same way after a failure,
//! waiting a jittered, doubling delay between attempts; requests that arrive during that wait
//! fail at once with the reason, so [`Producer`] can try the next nsqd.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::connection::Connection;
use super::error::{broker_error, Error};
use super::frame::{Command, Frame, DEFAULT_MAX_FRAME_SIZE, HEARTBEAT};
use super::identify::{Identify, USER_AGENT};
use super::jitter::random_unit;
use super::names::is_valid_name;
use super::refusal::Role;
use super::stream::WriteHalf;
use super::transport::{Prepared, Transport};

/// Settings of a [`Producer`]. Build it with [`ProducerConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// nsqd TCP addresses (`host:port`). Publishes go round-robin over them.
    pub nsqd_tcp_addresses: Vec<String>,
    /// Bound on connecting and IDENTIFY. Defaults to: 5 s.
    pub connect_timeout: Duration,
    /// Bound on waiting for nsqd's answer to a publish. Defaults to: 10 s.
    pub request_timeout: Duration,
    /// Heartbeat interval asked of nsqd. Defaults to: 30 s.
    pub heartbeat_interval: Duration,
    /// Largest frame accepted from nsqd. Defaults to: 1 MiB + 1 KiB.
    pub max_frame_size: usize,
    /// First wait after a failed connect; doubles per failure. Defaults to: 100 ms.
    pub reconnect_backoff_min: Duration,
    /// Longest wait between connects. Defaults to: 10 s.
    pub reconnect_backoff_max: Duration,
    /// Reported in IDENTIFY. Defaults to: `nsq-dedupe/<version>`.
    pub user_agent: String,
    /// Reported in IDENTIFY. Defaults to: `nsq-dedupe-producer`.
    pub client_id: String,
    /// TLS, compression and AUTH asked of every nsqd. Defaults to: none.
    pub transport: Transport,
}

impl ProducerConfig {
    /// A configuration publishing to `nsqd_tcp_addresses`.
    pub fn new(nsqd_tcp_addresses: Vec<String>) -> Self {
        ProducerConfig {
            nsqd_tcp_addresses,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(30),
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(10),
            user_agent: USER_AGENT.to_string(),
            client_id: "nsq-dedupe-producer".to_string(),
            transport: Transport::default(),
        }
    }
}

/// Why a request failed, and whether it may have reached nsqd.
type Outcome = Result<(), (Error, Written)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// Never sent: safe to try another nsqd.
    No,
    /// Sent (or possibly sent): nsqd may have published it.
    Maybe,
}

struct Request {
    command: Command,
    reply: oneshot::Sender<Outcome>,
}

/// Publishes to one or more nsqd. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Producer {
    conns: Vec<mpsc::UnboundedSender<Request>>,
    /// The first refusal no retry changes, from any nsqd (see [`Producer::refused`]).
    refused: watch::Receiver<Option<Arc<Error>>>,
    addrs: Vec<String>,
    next: AtomicUsize,
    request_timeout: Duration,
}

impl Producer {
    /// Starts one connection task per address. Connections are opened on first use.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when no address is given or a transport setting is unusable (a TLS
    /// file, a deflate level).
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn new(config: ProducerConfig) -> Result<Producer, Error> {
        if config.nsqd_tcp_addresses.is_empty() {
            return Err(Error::Config {
                field: "nsqd_tcp_addresses",
                reason: "the producer needs at least one nsqd TCP address".into(),
            });
        }
        config.transport.validate()?;
        let transport = config.transport.prepare_for(Role::Producer)?;
        let (refusals, refused) = watch::channel(None);
        let refusals = Arc::new(refusals);
        let config = Arc::new(config);
        let conns = config
            .nsqd_tcp_addresses
            .iter()
            .map(|addr| {
                let (tx, rx) = mpsc::unbounded_channel();
                let task = ConnTask {
                    addr: addr.as_str().into(),
                    config: config.clone(),
                    transport: transport.clone(),
                    refusals: refusals.clone(),
                };
                tokio::spawn(task.run(rx));
                tx
            })
            .collect();
        Ok(Producer {
            conns,
            refused,
            addrs: config.nsqd_tcp_addresses.clone(),
            next: AtomicUsize::new(0),
            request_timeout: config.request_timeout,
        })
    }

    /// Completes with the first refusal of any nsqd that no retry changes (AUTH refused, TLS
    /// that does not verify, a topic the secret may not publish to). Publishes keep failing
    /// with it meanwhile; a caller that must not hide a misconfiguration stops on it.
    pub fn refused(&self) -> impl std::future::Future<Output = Arc<Error>> + Send + 'static {
        let mut refused = self.refused.clone();
        async move {
            let error = match refused.wait_for(Option::is_some).await {
                Ok(error) => error.clone(),
                Err(_) => None,
            };
            match error {
                Some(error) => error,
                // The connection tasks are gone: nothing will be refused any more.
                None => std::future::pending().await,
            }
        }
    }

    /// `PUB`: publishes one message and waits for nsqd's `OK`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid topic name (checked before anything is sent);
    /// [`Error::Broker`] with nsqd's error (e.g. `E_BAD_TOPIC`, `E_PUB_FAILED`); a connection
    /// error if the request was sent and the connection failed before the answer (the message
    /// may or may not be published); [`Error::NoProducer`] if no nsqd could be reached.
    pub async fn publish(&self, topic: &str, body: impl Into<Bytes>) -> Result<(), Error> {
        self.request(Command::Pub {
            topic: topic.to_string(),
            body: body.into(),
        })
        .await
    }

    /// `MPUB`: publishes several messages atomically and waits for nsqd's `OK`.
    ///
    /// # Errors
    ///
    /// As for [`publish`](Producer::publish).
    pub async fn multi_publish(&self, topic: &str, bodies: Vec<Bytes>) -> Result<(), Error> {
        self.request(Command::Mpub {
            topic: topic.to_string(),
            bodies,
        })
        .await
    }

    /// `DPUB`: publishes one message that nsqd holds for `defer` before delivering it.
    ///
    /// # Errors
    ///
    /// As for [`publish`](Producer::publish).
    pub async fn deferred_publish(
        &self,
        topic: &str,
        defer: Duration,
        body: impl Into<Bytes>,
    ) -> Result<(), Error> {
        self.request(Command::Dpub {
            topic: topic.to_string(),
            defer_ms: u64::try_from(defer.as_millis()).unwrap_or(u64::MAX),
            body: body.into(),
        })
        .await
    }

    /// Sends `command` to the next nsqd in turn, moving on to the following ones only while
    /// the request has certainly not been written.
    async fn request(&self, command: Command) -> Result<(), Error> {
        let topic = match &command {
            Command::Pub { topic, .. }
            | Command::Mpub { topic, .. }
            | Command::Dpub { topic, .. } => topic,
            _ => unreachable!("only publishes are requested"),
        };
        if !is_valid_name(topic) {
            return Err(Error::Config {
                field: "topic",
                reason: format!("{topic:?} is not a valid NSQ topic name (1-64 of [.a-zA-Z0-9_-], optionally ending in #ephemeral)"),
            });
        }
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            let (reply, answer) = oneshot::channel();
            let request = Request {
                command: command.clone(),
                reply,
            };
            if self.conns[i].send(request).is_err() {
                last = Some(Error::ConnectionClosed {
                    addr: self.addrs[i].clone(),
                });
                continue;
            }
            let outcome = match tokio::time::timeout(self.request_timeout, answer).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Err((
                    Error::ConnectionClosed {
                        addr: self.addrs[i].clone(),
                    },
                    Written::Maybe,
                )),
                Err(_) => Err((
                    Error::Timeout {
                        addr: self.addrs[i].clone(),
                        what: "waiting for the answer to a publish",
                        after: self.request_timeout,
                        knob: "request_timeout",
                    },
                    Written::Maybe,
                )),
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err((error, Written::Maybe)) => return Err(error),
                Err((error, Written::No)) => last = Some(error),
            }
        }
        Err(Error::NoProducer {
            tried: n,
            last: last.map_or_else(String::new, |e| e.to_string()),
        })
    }
}

/// The task owning one nsqd's connection.
struct ConnTask {
    addr: Arc<str>,
    config: Arc<ProducerConfig>,
    transport: Prepared,
    refusals: Arc<watch::Sender<Option<Arc<Error>>>>,
}

impl ConnTask {
    async fn run(self, mut requests: mpsc::UnboundedReceiver<Request>) {
        let (addr, config) = (&self.addr, &self.config);
        let mut identify = Identify {
            client_id: config.client_id.clone(),
            hostname: config.client_id.clone(),
            user_agent: config.user_agent.clone(),
            feature_negotiation: true,
            heartbeat_interval: config.heartbeat_interval.as_millis() as i64,
            msg_timeout: 0,
            output_buffer_size: 0,
            output_buffer_timeout: 0,
            sample_rate: 0,
            tls_v1: false,
            snappy: false,
            deflate: false,
            deflate_level: 0,
        };
        config.transport.ask(&mut identify);
        let mut failures: u32 = 0;
        let mut retry_at = Instant::now();
        let mut last_error = String::new();
        while let Some(first) = requests.recv().await {
            if Instant::now() < retry_at {
                let error = match self.refusals.borrow().as_ref() {
                    Some(refusal) if refusal.is_permanent() => clone_refusal(refusal),
                    _ => Error::ConnectionClosed {
                        addr: format!("{addr} (reconnecting after: {last_error})"),
                    },
                };
                let _ = first.reply.send(Err((error, Written::No)));
                continue;
            }
            let conn = match Connection::connect(
                addr,
                &identify,
                &self.transport,
                config.max_frame_size,
                config.connect_timeout,
            )
            .await
            {
                Ok(conn) => conn,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let base = config
                        .reconnect_backoff_min
                        .saturating_mul(1u32 << (failures - 1).min(20))
                        .min(config.reconnect_backoff_max);
                    retry_at = Instant::now() + base.mul_f64(0.5 + 0.5 * random_unit());
                    last_error = error.to_string();
                    self.note(&error);
                    let _ = first.reply.send(Err((error, Written::No)));
                    continue;
                }
            };
            failures = 0;
            tracing::info!(nsqd = %addr, "Producer connected to nsqd.");
            match serve(addr, conn, first, &mut requests, config.request_timeout).await {
                Ok(()) => return,
                Err(error) => {
                    last_error = error.to_string();
                    self.note(&error);
                }
            }
        }
    }

    /// Logs a failure; a permanent one is also published to [`Producer::refused`].
    fn note(&self, error: &Error) {
        if error.is_permanent() {
            tracing::error!(nsqd = %self.addr, %error, "nsqd refused the producer; retrying cannot help.");
            self.refusals.send_if_modified(|slot| {
                let first = slot.is_none();
                if first {
                    *slot = Some(Arc::new(clone_refusal(error)));
                }
                first
            });
        } else {
            tracing::warn!(nsqd = %self.addr, %error, "Producer connection to nsqd failed; reconnecting on next publish.");
        }
    }
}

/// A copy of a [`Error::Refused`] (errors holding I/O causes are not `Clone`).
fn clone_refusal(error: &Error) -> Error {
    error
        .refusal_copy()
        .unwrap_or_else(|| Error::ConnectionClosed {
            addr: error.to_string(),
        })
}

/// Serves requests on one connection until it fails (`Err`) or the producer is dropped (`Ok`).
async fn serve(
    addr: &str,
    conn: Connection,
    first: Request,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    request_timeout: Duration,
) -> Result<(), Error> {
    let (mut reader, mut writer) = conn.into_parts();
    let mut pending = Pending::new();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut first = Some(first);
    let mut check = tokio::time::interval(Duration::from_millis(100));
    let result: Result<(), Error> = loop {
        let mut batch = Vec::new();
        if let Some(request) = first.take() {
            batch.push(request);
        }
        if batch.is_empty() {
            tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => batch.push(request),
                    None => break Ok(()),
                },
                frame = reader.next() => {
                    let frame = match frame {
                        None => break Err(Error::ConnectionClosed { addr: addr.to_string() }),
                        Some(Err(cause)) => break Err(Error::Protocol { addr: addr.to_string(), cause }),
                        Some(Ok(frame)) => frame,
                    };
                    if let Err(error) = on_frame(addr, frame, &mut pending, &mut batch) {
                        break Err(error);
                    }
                }
                _ = check.tick() => {
                    if pending.front().is_some_and(|(t, _, _)| t.elapsed() > request_timeout) {
                        break Err(Error::Timeout { addr: addr.to_string(), what: "waiting for the answer to a publish", after: request_timeout, knob: "request_timeout" });
                    }
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        if let Err(error) =
            write_batch(addr, batch, requests, &mut pending, &mut buf, &mut writer).await
        {
            break Err(error);
        }
        buf.clear();
    };
    // Whatever is still waiting may or may not have been published.
    for (_, _, reply) in pending {
        let error = Error::ConnectionClosed {
            addr: addr.to_string(),
        };
        let _ = reply.send(Err((error, Written::Maybe)));
    }
    let _ = writer.shutdown().await;
    result
}

/// Requests written and not yet answered, in order: when, which command, who waits.
type Pending = VecDeque<(Instant, &'static str, oneshot::Sender<Outcome>)>;

/// Answers the oldest pending request with nsqd's `frame`, or queues a NOP for a heartbeat.
///
/// # Errors
///
/// What ends the connection: an answer to nothing, a refusal no retry changes, a fatal
/// error, a message on a producer's connection.
fn on_frame(
    addr: &str,
    frame: Frame,
    pending: &mut Pending,
    batch: &mut Vec<Request>,
) -> Result<(), Error> {
    match frame {
        Frame::Response(data) if &data[..] == HEARTBEAT => batch.push(Request {
            command: Command::Nop,
            reply: oneshot::channel().0,
        }),
        Frame::Response(data) => match pending.pop_front() {
            Some((_, _, reply)) if &data[..] == b"OK" => {
                let _ = reply.send(Ok(()));
            }
            Some((_, command, reply)) => {
                let error = Error::UnexpectedResponse {
                    addr: addr.to_string(),
                    command,
                    answer: String::from_utf8_lossy(&data).into_owned(),
                };
                let _ = reply.send(Err((error, Written::Maybe)));
            }
            None => {
                return Err(Error::UnexpectedResponse {
                    addr: addr.to_string(),
                    command: "nothing",
                    answer: String::from_utf8_lossy(&data).into_owned(),
                })
            }
        },
        Frame::Error(text) => {
            // nsqd answers in order: the error is the oldest request's.
            let (answered, command) = match pending.pop_front() {
                Some((_, command, reply)) => (Some(reply), command),
                None => (None, "PUB"),
            };
            let error =
                super::refusal::classify(command, broker_error(addr, &text), Role::Producer);
            let fatal = !error.is_non_fatal_broker_error();
            let permanent = error.is_permanent();
            if let Some(reply) = answered {
                let _ = reply.send(Err((error, Written::Maybe)));
            }
            if permanent {
                return Err(super::refusal::classify(
                    command,
                    broker_error(addr, &text),
                    Role::Producer,
                ));
            }
            if fatal {
                return Err(broker_error(addr, &text));
            }
        }
        Frame::Message(_) => {
            return Err(Error::UnexpectedResponse {
                addr: addr.to_string(),
                command: "PUB",
                answer: "a message".into(),
            })
        }
    }
    Ok(())
}

/// Writes `batch`, and whatever else is waiting (up to 256 requests), in one write; each
/// request but a NOP then waits in `pending` for its answer.
async fn write_batch(
    addr: &str,
    mut batch: Vec<Request>,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    pending: &mut Pending,
    buf: &mut BytesMut,
    writer: &mut WriteHalf,
) -> Result<(), Error> {
    while let Ok(request) = requests.try_recv() {
        batch.push(request);
        if batch.len() >= 256 {
            break;
        }
    }
    let now = Instant::now();
    for request in batch {
        request.command.encode(buf);
        if !matches!(request.command, Command::Nop) {
            pending.push_back((now, request.command.name(), request.reply));
        }
    }
    let written = match writer.write_all(buf).await {
        Ok(()) => writer.flush().await,
        Err(error) => Err(error),
    };
    written.map_err(|cause| Error::Io {
        addr: addr.to_string(),
        cause,
    })
}
