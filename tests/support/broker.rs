//! A test nsqd: speaks NSQ's TCP protocol V2 and reproduces the nsqd v1.3.0 semantics our
//! client depends on, with knobs to inspect what it received and to inject faults.
//!
//! What it implements: topics and channels (each channel of a topic gets every message, one
//! subscriber of a channel gets each), IDENTIFY with the JSON answer under feature negotiation,
//! SUB (refused with heartbeats disabled), RDY as a per-client in-flight cap with a fatal
//! `E_INVALID` above `max_rdy_count`, FIN/REQ/TOUCH with nsqd's error texts, redelivery after
//! `msg_timeout` with the same ID and attempts + 1, deferred REQ and DPUB, heartbeats (a client
//! silent for two intervals is closed), CLS -> CLOSE_WAIT, PUB/MPUB/DPUB; the upgrades IDENTIFY
//! negotiates (TLS, snappy, deflate, in nsqd's order, each followed by `OK` in the new
//! encoding; `--tls-required` refusing every other command before TLS), and AUTH against an
//! answer the test chooses instead of nsqd's auth server, with nsqd's error texts. The layers
//! themselves are in `wire`.
//!
//! All state sits behind one `std` mutex (never held across an `.await`). A scanner task moves
//! timed-out and due deferred messages back to their queues every `scan_interval`. Dropping the
//! [`Broker`] cancels every task it started and closes every socket.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::wire::Codec;

/// Settings of a test nsqd, mirroring nsqd's flags. `Default` gives nsqd's defaults.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// `--max-rdy-count`.
    pub max_rdy_count: u32,
    /// `--msg-timeout`.
    pub msg_timeout: Duration,
    /// `--max-msg-timeout`.
    pub max_msg_timeout: Duration,
    /// `--max-req-timeout`.
    pub max_req_timeout: Duration,
    /// Heartbeat interval before IDENTIFY changes it (nsqd: `--client-timeout` / 2).
    pub heartbeat_interval: Duration,
    /// Largest heartbeat interval IDENTIFY may ask for.
    pub max_heartbeat_interval: Duration,
    /// `--max-msg-size`.
    pub max_msg_size: usize,
    /// `--max-body-size` (MPUB).
    pub max_body_size: usize,
    /// How often timeouts and deferred messages are checked.
    pub scan_interval: Duration,
    /// Record every RDY and in-flight change in [`Broker::flow_log`] (costly; off by default).
    pub log_flow: bool,
    /// Keep a [`MsgRecord`] per message ID (on by default; throughput runs turn it off).
    pub record_messages: bool,
    /// `--tls-cert`/`--tls-key`: TLS offered to clients that ask.
    pub tls: Option<Tls>,
    /// `--tls-required`: every command but IDENTIFY needs TLS first.
    pub tls_required: bool,
    /// `--snappy` (on by default, as in nsqd).
    pub snappy: bool,
    /// `--deflate` (on by default, as in nsqd).
    pub deflate: bool,
    /// `--max-deflate-level`.
    pub max_deflate_level: u32,
    /// `--auth-http-address`, with the auth server's answer chosen by the test.
    pub auth: Option<Auth>,
}

/// The TLS side of the broker.
#[derive(Clone)]
pub struct Tls(pub tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// What the auth server answers: `secret` is accepted with `identity`, allowed on `topics`
/// (all channels); any other secret is refused. An empty `topics` means no authorizations.
#[derive(Debug, Clone)]
pub struct Auth {
    pub secret: String,
    pub identity: String,
    pub topics: Vec<String>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_rdy_count: 2500,
            msg_timeout: Duration::from_secs(60),
            max_msg_timeout: Duration::from_secs(15 * 60),
            max_req_timeout: Duration::from_secs(60 * 60),
            heartbeat_interval: Duration::from_secs(30),
            max_heartbeat_interval: Duration::from_secs(60),
            max_msg_size: 1024 * 1024,
            max_body_size: 5 * 1024 * 1024,
            scan_interval: Duration::from_millis(10),
            log_flow: false,
            record_messages: true,
            tls: None,
            tls_required: false,
            snappy: true,
            deflate: true,
            max_deflate_level: 6,
            auth: None,
        }
    }
}

/// Counters over the broker's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// TCP connections accepted.
    pub connections: u64,
    /// Connections open now.
    pub clients_now: u64,
    /// Messages published (each MPUB message counts).
    pub published: u64,
    /// PUB and DPUB commands answered `OK`.
    pub pub_commands: u64,
    /// MPUB commands answered `OK`.
    pub mpub_commands: u64,
    /// Message frames sent (first deliveries and redeliveries).
    pub deliveries: u64,
    /// Successful FINs.
    pub fin_ok: u64,
    /// FINs answered with `E_FIN_FAILED`.
    pub fin_failed: u64,
    /// Successful REQs.
    pub req_ok: u64,
    /// REQs answered with `E_REQ_FAILED`.
    pub req_failed: u64,
    /// Successful TOUCHes.
    pub touch_ok: u64,
    /// TOUCHes answered with `E_TOUCH_FAILED`.
    pub touch_failed: u64,
    /// In-flight messages that hit `msg_timeout` and went back to the queue.
    pub timeouts: u64,
    /// Heartbeats sent.
    pub heartbeats_sent: u64,
    /// NOPs received.
    pub nops: u64,
    /// Clients closed for missing two heartbeats.
    pub heartbeat_timeouts: u64,
    /// CLS commands received.
    pub cls: u64,
    /// Fatal errors sent (after which the client was closed).
    pub fatal_errors: u64,
    /// Largest sum of RDY over this broker's clients ever seen.
    pub max_rdy_sum: u64,
    /// Largest number of messages in flight at once on this broker.
    pub max_in_flight: u64,
    /// AUTH commands received.
    pub auth_requests: u64,
    /// TLS handshakes that failed.
    pub tls_failures: u64,
}

/// What happened to one message ID on one channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MsgRecord {
    /// The ID.
    pub id: String,
    /// The body.
    pub body: Bytes,
    /// Times sent to a client.
    pub deliveries: u32,
    /// Attempts field of the last delivery.
    pub last_attempts: u16,
    /// Successful FINs (must end at exactly 1).
    pub fin_ok: u32,
    /// Failed FINs.
    pub fin_failed: u32,
    /// Successful REQs.
    pub req_ok: u32,
    /// Failed REQs.
    pub req_failed: u32,
    /// Successful TOUCHes.
    pub touch_ok: u32,
    /// Failed TOUCHes.
    pub touch_failed: u32,
    /// Timeouts in flight.
    pub timeouts: u32,
    /// When each delivery happened.
    pub delivered_at: Vec<Instant>,
    /// When each successful REQ happened, with its delay.
    pub requeued_at: Vec<(Instant, Duration)>,
}

/// One entry of [`Broker::flow_log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEvent {
    /// When.
    pub at: Instant,
    /// Which client (unique per broker).
    pub client: u64,
    /// Its RDY after the event (0 once disconnected).
    pub rdy: u32,
    /// Its in-flight count after the event (0 once disconnected).
    pub in_flight: u32,
}

/// A client as the broker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSnapshot {
    /// Unique per broker.
    pub id: u64,
    /// Subscribed topic and channel.
    pub subscription: Option<(String, String)>,
    /// Current RDY.
    pub rdy: u32,
    /// Messages in flight to it.
    pub in_flight: u32,
    /// From IDENTIFY.
    pub client_id: String,
    /// From IDENTIFY.
    pub user_agent: String,
    /// Negotiated heartbeat interval (`None`: disabled).
    pub heartbeat_interval: Option<Duration>,
    /// Negotiated msg timeout.
    pub msg_timeout: Duration,
    /// Upgraded to TLS.
    pub tls: bool,
    /// Compression agreed at IDENTIFY: `"snappy"` or `"deflate"`.
    pub compression: Option<&'static str>,
    /// The secret its AUTH carried.
    pub auth_secret: Option<String>,
    /// Whether it sent CLS.
    pub closing: bool,
}

/// A fault to inject into client connections.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Close the socket at once.
    Drop,
    /// Send an error frame; close afterwards if `fatal`.
    Error {
        /// Its text.
        text: String,
        /// Close the connection after sending it.
        fatal: bool,
    },
    /// Send these bytes as they are (e.g. a malformed frame) and keep the connection open.
    Raw(Bytes),
}

#[derive(Debug, Clone)]
struct Msg {
    id: [u8; 16],
    body: Bytes,
    timestamp: i64,
    attempts: u16,
}

#[derive(Debug)]
struct InFlight {
    msg: Msg,
    client: u64,
    deadline: Instant,
}

#[derive(Debug, Default)]
struct Channel {
    queue: VecDeque<Msg>,
    deferred: BinaryHeap<Reverse<(Instant, u64, [u8; 16])>>,
    deferred_msgs: HashMap<u64, Msg>,
    in_flight: HashMap<[u8; 16], InFlight>,
    finished: Vec<Bytes>,
    records: HashMap<[u8; 16], MsgRecord>,
    subscribers: Vec<u64>,
}

impl Channel {
    /// Why `client` may not FIN, REQ or TOUCH message `id`, in nsqd's words; `None` if it may.
    fn ownership_problem(&self, id: &[u8; 16], client: u64) -> Option<&'static str> {
        match self.in_flight.get(id) {
            None => Some("ID not in flight"),
            Some(f) if f.client != client => Some("client does not own message"),
            Some(_) => None,
        }
    }
}

#[derive(Debug, Default)]
struct Topic {
    log: Vec<Bytes>,
    channels: HashMap<String, Channel>,
    /// Messages published before any channel existed.
    backlog: VecDeque<Msg>,
    deferred: Vec<(Instant, Msg)>,
}

#[derive(Debug)]
struct Client {
    subscription: Option<(String, String)>,
    rdy: u32,
    in_flight: u32,
    closing: bool,
    identified: bool,
    client_id: String,
    user_agent: String,
    heartbeat: Option<Duration>,
    msg_timeout: Duration,
    /// Upgraded to TLS.
    tls: bool,
    /// Compression agreed at IDENTIFY ("snappy", "deflate").
    compression: Option<&'static str>,
    /// Permitted topics after a successful AUTH.
    authorized: Option<Vec<String>>,
    /// The secret AUTH sent, for the tests to check.
    auth_secret: Option<String>,
    notify: Arc<Notify>,
    faults: mpsc::UnboundedSender<Fault>,
}

#[derive(Debug, Default)]
struct State {
    topics: HashMap<String, Topic>,
    clients: HashMap<u64, Client>,
    next_client: u64,
    next_seq: u64,
    deferred_seq: u64,
    stats: BrokerStats,
    flow: Vec<FlowEvent>,
    fail_publishes: u32,
}

struct Shared {
    config: BrokerConfig,
    node: u16,
    state: Mutex<State>,
    cancel: CancellationToken,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("broker state lock")
    }
}

/// A running test nsqd on 127.0.0.1. Dropping it stops it.
pub struct Broker {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

static NEXT_NODE: AtomicU16 = AtomicU16::new(1);

impl Broker {
    /// Starts a broker on a free loopback port.
    pub async fn start(config: BrokerConfig) -> Broker {
        Broker::start_at("127.0.0.1:0".parse().expect("address"), config).await
    }

    /// Starts a broker on `addr` (to bring an nsqd "back" on the port a client knows).
    pub async fn start_at(addr: SocketAddr, config: BrokerConfig) -> Broker {
        let listener = TcpListener::bind(addr)
            .await
            .expect("bind the broker's address");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            config,
            node: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            cancel: CancellationToken::new(),
        });
        tokio::spawn(accept_loop(listener, shared.clone()));
        tokio::spawn(scan_loop(shared.clone()));
        Broker { addr, shared }
    }

    /// Starts a broker with nsqd's defaults.
    pub async fn start_default() -> Broker {
        Broker::start(BrokerConfig::default()).await
    }

    /// The TCP address clients connect to.
    pub fn tcp_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Publishes `body` to `topic` as if a producer had sent PUB.
    pub fn publish(&self, topic: &str, body: impl Into<Bytes>) {
        let mut st = self.shared.lock();
        publish_now(&self.shared, &mut st, topic, body.into());
    }

    /// Publishes many bodies at once (one lock, one wake-up).
    pub fn publish_many(&self, topic: &str, bodies: impl IntoIterator<Item = Bytes>) {
        let mut st = self.shared.lock();
        for body in bodies {
            publish_now(&self.shared, &mut st, topic, body);
        }
    }

    /// Bodies published to `topic`, in order (what producers sent).
    pub fn messages_on(&self, topic: &str) -> Vec<Bytes> {
        self.shared
            .lock()
            .topics
            .get(topic)
            .map(|t| t.log.clone())
            .unwrap_or_default()
    }

    /// Bodies successfully FINished on `topic`/`channel`, in FIN order.
    pub fn finished(&self, topic: &str, channel: &str) -> Vec<Bytes> {
        self.with_channel(topic, channel, |c| c.finished.clone())
            .unwrap_or_default()
    }

    /// Per-ID records of `topic`/`channel`, sorted by ID.
    pub fn records(&self, topic: &str, channel: &str) -> Vec<MsgRecord> {
        let mut v = self
            .with_channel(topic, channel, |c| {
                c.records.values().cloned().collect::<Vec<_>>()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Messages of `topic`/`channel` not yet finished: `(queued, deferred, in_flight)`.
    pub fn depth(&self, topic: &str, channel: &str) -> (usize, usize, usize) {
        self.with_channel(topic, channel, |c| {
            (c.queue.len(), c.deferred_msgs.len(), c.in_flight.len())
        })
        .unwrap_or((0, 0, 0))
    }

    /// Counters.
    pub fn stats(&self) -> BrokerStats {
        let st = self.shared.lock();
        let mut s = st.stats.clone();
        s.clients_now = st.clients.len() as u64;
        s
    }

    /// Every RDY and in-flight change so far (only with `log_flow`).
    pub fn flow_log(&self) -> Vec<FlowEvent> {
        self.shared.lock().flow.clone()
    }

    /// The connected clients.
    pub fn clients(&self) -> Vec<ClientSnapshot> {
        let st = self.shared.lock();
        let mut v: Vec<ClientSnapshot> = st
            .clients
            .iter()
            .map(|(id, c)| ClientSnapshot {
                id: *id,
                subscription: c.subscription.clone(),
                rdy: c.rdy,
                in_flight: c.in_flight,
                client_id: c.client_id.clone(),
                user_agent: c.user_agent.clone(),
                heartbeat_interval: c.heartbeat,
                msg_timeout: c.msg_timeout,
                closing: c.closing,
                tls: c.tls,
                compression: c.compression,
                auth_secret: c.auth_secret.clone(),
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Injects `fault` into every connected client; returns how many got it.
    pub fn inject(&self, fault: Fault) -> usize {
        let st = self.shared.lock();
        st.clients
            .values()
            .filter(|c| c.faults.send(fault.clone()).is_ok())
            .count()
    }

    /// Closes every client connection abruptly; returns how many.
    pub fn drop_connections(&self) -> usize {
        self.inject(Fault::Drop)
    }

    /// Answers the next `n` PUB/MPUB/DPUB with the non-fatal `E_PUB_FAILED`/... error.
    pub fn fail_publishes(&self, n: u32) {
        self.shared.lock().fail_publishes = n;
    }

    fn with_channel<R>(
        &self,
        topic: &str,
        channel: &str,
        f: impl FnOnce(&Channel) -> R,
    ) -> Option<R> {
        let st = self.shared.lock();
        st.topics
            .get(topic)
            .and_then(|t| t.channels.get(channel))
            .map(f)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn new_msg(shared: &Shared, st: &mut State, body: Bytes) -> Msg {
    st.next_seq += 1;
    let text = format!("{:04x}{:012x}", shared.node, st.next_seq);
    let mut id = [0u8; 16];
    id.copy_from_slice(text.as_bytes());
    Msg {
        id,
        body,
        timestamp: now_ns(),
        attempts: 0,
    }
}

fn publish_now(shared: &Shared, st: &mut State, topic: &str, body: Bytes) {
    let msg = new_msg(shared, st, body.clone());
    st.stats.published += 1;
    let t = st.topics.entry(topic.to_string()).or_default();
    t.log.push(body);
    if t.channels.is_empty() {
        t.backlog.push_back(msg);
        return;
    }
    // Every channel gets a copy with the same ID (as nsqd's topic pump does).
    let mut wake = Vec::new();
    for ch in t.channels.values_mut() {
        ch.queue.push_back(msg.clone());
        wake.extend(ch.subscribers.iter().copied());
    }
    for id in wake {
        if let Some(c) = st.clients.get(&id) {
            c.notify.notify_one();
        }
    }
}

fn log_flow(shared: &Shared, st: &mut State, client: u64) {
    let (rdy, in_flight) = st
        .clients
        .get(&client)
        .map_or((0, 0), |c| (c.rdy, c.in_flight));
    let rdy_sum: u64 = st.clients.values().map(|c| u64::from(c.rdy)).sum();
    let inf_sum: u64 = st.clients.values().map(|c| u64::from(c.in_flight)).sum();
    st.stats.max_rdy_sum = st.stats.max_rdy_sum.max(rdy_sum);
    st.stats.max_in_flight = st.stats.max_in_flight.max(inf_sum);
    if shared.config.log_flow {
        st.flow.push(FlowEvent {
            at: Instant::now(),
            client,
            rdy,
            in_flight,
        });
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                tokio::spawn(client_task(stream, shared.clone()));
            }
        }
    }
}

/// Moves timed-out in-flight messages and due deferred messages back to their queues.
async fn scan_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.config.scan_interval);
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let mut st = shared.lock();
        let st = &mut *st;
        let mut wake: Vec<u64> = Vec::new();
        let mut flow: Vec<u64> = Vec::new();
        let mut due_pubs: Vec<(String, Msg)> = Vec::new();
        for (tname, topic) in st.topics.iter_mut() {
            let mut i = 0;
            while i < topic.deferred.len() {
                if topic.deferred[i].0 <= now {
                    let (_, m) = topic.deferred.swap_remove(i);
                    due_pubs.push((tname.clone(), m));
                } else {
                    i += 1;
                }
            }
            for ch in topic.channels.values_mut() {
                let mut moved = false;
                let expired: Vec<[u8; 16]> = ch
                    .in_flight
                    .iter()
                    .filter(|(_, f)| f.deadline <= now)
                    .map(|(id, _)| *id)
                    .collect();
                for id in expired {
                    let f = ch.in_flight.remove(&id).expect("expired entry");
                    if let Some(c) = st.clients.get_mut(&f.client) {
                        c.in_flight = c.in_flight.saturating_sub(1);
                        flow.push(f.client);
                    }
                    if let Some(r) = ch.records.get_mut(&id) {
                        r.timeouts += 1;
                    }
                    st.stats.timeouts += 1;
                    ch.queue.push_back(f.msg);
                    moved = true;
                }
                while let Some(Reverse((at, seq, _))) = ch.deferred.peek().copied() {
                    if at > now {
                        break;
                    }
                    ch.deferred.pop();
                    if let Some(m) = ch.deferred_msgs.remove(&seq) {
                        ch.queue.push_back(m);
                        moved = true;
                    }
                }
                if moved {
                    wake.extend(ch.subscribers.iter().copied());
                }
            }
        }
        for (topic, m) in due_pubs {
            // A deferred publish becomes a normal publish, keeping its ID.
            let t = st.topics.entry(topic).or_default();
            if t.channels.is_empty() {
                t.backlog.push_back(m);
            } else {
                for ch in t.channels.values_mut() {
                    ch.queue.push_back(m.clone());
                    wake.extend(ch.subscribers.iter().copied());
                }
            }
        }
        for id in flow {
            log_flow(&shared, st, id);
        }
        for id in wake {
            if let Some(c) = st.clients.get(&id) {
                c.notify.notify_one();
            }
        }
    }
}

fn frame(dst: &mut BytesMut, frame_type: u32, data: &[u8]) {
    dst.reserve(8 + data.len());
    dst.put_u32(4 + data.len() as u32);
    dst.put_u32(frame_type);
    dst.put_slice(data);
}

fn message_frame(dst: &mut BytesMut, m: &Msg) {
    dst.reserve(34 + m.body.len());
    dst.put_u32(4 + 26 + m.body.len() as u32);
    dst.put_u32(2);
    dst.put_i64(m.timestamp);
    dst.put_u16(m.attempts);
    dst.put_slice(&m.id);
    dst.put_slice(&m.body);
}

fn valid_name(name: &str) -> bool {
    let base = name.strip_suffix("#ephemeral").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 64
        && !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What handling a command asks the connection to do next.
enum Next {
    Continue,
    /// Send what is buffered, then close (after a fatal error).
    Close,
    /// Send what is buffered (IDENTIFY's answer), then upgrade the connection.
    Upgrade {
        tls: bool,
        codec: Option<(&'static str, u32)>,
    },
}

/// A client's socket, upgraded or not.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Writes `out` through `codec`, then empties it.
async fn send(
    stream: &mut Box<dyn Io>,
    codec: &mut Codec,
    out: &mut BytesMut,
) -> std::io::Result<()> {
    let wire = codec.encode(out)?;
    out.clear();
    stream.write_all(&wire).await?;
    stream.flush().await
}

struct Conn {
    id: u64,
    shared: Arc<Shared>,
    out: BytesMut,
    last_read: Instant,
    next_heartbeat: Instant,
}

async fn client_task(tcp: TcpStream, shared: Arc<Shared>) {
    let mut stream: Box<dyn Io> = Box::new(tcp);
    let mut codec = Codec::Plain;
    let mut wire = BytesMut::with_capacity(64 * 1024);
    let (faults_tx, mut faults) = mpsc::unbounded_channel();
    let notify = Arc::new(Notify::new());
    let id = {
        let mut st = shared.lock();
        st.next_client += 1;
        st.stats.connections += 1;
        let id = st.next_client;
        st.clients.insert(
            id,
            Client {
                subscription: None,
                rdy: 0,
                in_flight: 0,
                closing: false,
                identified: false,
                client_id: String::new(),
                user_agent: String::new(),
                heartbeat: Some(shared.config.heartbeat_interval),
                msg_timeout: shared.config.msg_timeout,
                tls: false,
                compression: None,
                authorized: None,
                auth_secret: None,
                notify: notify.clone(),
                faults: faults_tx,
            },
        );
        id
    };
    let now = Instant::now();
    let mut conn = Conn {
        id,
        shared: shared.clone(),
        out: BytesMut::with_capacity(64 * 1024),
        last_read: now,
        next_heartbeat: now + shared.config.heartbeat_interval,
    };
    let mut input = BytesMut::with_capacity(64 * 1024);
    let mut magic_seen = false;
    loop {
        conn.deliver();
        if !conn.out.is_empty() && send(&mut stream, &mut codec, &mut conn.out).await.is_err() {
            break;
        }
        let heartbeat = shared.lock().clients.get(&id).and_then(|c| c.heartbeat);
        let wake_at = match heartbeat {
            Some(hb) => conn.next_heartbeat.min(conn.last_read + hb * 2),
            None => Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            biased;
            _ = shared.cancel.cancelled() => break,
            fault = faults.recv() => match fault {
                Some(Fault::Drop) | None => break,
                Some(Fault::Error { text, fatal }) => {
                    frame(&mut conn.out, 1, text.as_bytes());
                    if fatal {
                        let _ = send(&mut stream, &mut codec, &mut conn.out).await;
                        break;
                    }
                }
                Some(Fault::Raw(bytes)) => conn.out.extend_from_slice(&bytes),
            },
            read = stream.read_buf(&mut wire) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let decoded = codec.decode(&wire, &mut input);
                wire.clear();
                if decoded.is_err() {
                    break;
                }
                conn.last_read = Instant::now();
                if !magic_seen {
                    if input.len() < 4 {
                        continue;
                    }
                    if &input[..4] != b"  V2" {
                        frame(&mut conn.out, 1, b"E_BAD_PROTOCOL bad protocol magic");
                        let _ = send(&mut stream, &mut codec, &mut conn.out).await;
                        break;
                    }
                    input.advance(4);
                    magic_seen = true;
                }
                match conn.handle_input(&mut input) {
                    Next::Continue => {}
                    Next::Close => {
                        shared.lock().stats.fatal_errors += 1;
                        let _ = send(&mut stream, &mut codec, &mut conn.out).await;
                        break;
                    }
                    Next::Upgrade { tls, codec: compression } => {
                        // IDENTIFY's answer goes out before the upgrade; then each step ends
                        // with OK in the new encoding (nsqd's IDENTIFY).
                        if send(&mut stream, &mut codec, &mut conn.out).await.is_err() {
                            break;
                        }
                        if tls {
                            let acceptor = shared.config.tls.clone().expect("TLS agreed").0;
                            match acceptor.accept(stream).await {
                                Ok(upgraded) => stream = Box::new(upgraded),
                                Err(_) => {
                                    shared.lock().stats.tls_failures += 1;
                                    break;
                                }
                            }
                            if let Some(c) = shared.lock().clients.get_mut(&id) {
                                c.tls = true;
                            }
                            frame(&mut conn.out, 0, b"OK");
                            if send(&mut stream, &mut codec, &mut conn.out).await.is_err() {
                                break;
                            }
                        }
                        if let Some((name, level)) = compression {
                            codec = match name {
                                "snappy" => Codec::snappy(),
                                _ => Codec::deflate(level),
                            };
                            if let Some(c) = shared.lock().clients.get_mut(&id) {
                                c.compression = Some(name);
                            }
                            frame(&mut conn.out, 0, b"OK");
                            if send(&mut stream, &mut codec, &mut conn.out).await.is_err() {
                                break;
                            }
                        }
                        // Anything the client sent meanwhile is read in the new encoding.
                        if !input.is_empty() {
                            break;
                        }
                    }
                }
            }
            _ = notify.notified() => {}
            _ = tokio::time::sleep_until(wake_at.into()) => {
                let now = Instant::now();
                if let Some(hb) = heartbeat {
                    if now >= conn.last_read + hb * 2 {
                        shared.lock().stats.heartbeat_timeouts += 1;
                        break;
                    }
                    if now >= conn.next_heartbeat {
                        frame(&mut conn.out, 0, b"_heartbeat_");
                        shared.lock().stats.heartbeats_sent += 1;
                        conn.next_heartbeat = now + hb;
                    }
                }
            }
        }
    }
    // nsqd leaves the client's in-flight messages to time out; only the client goes.
    let mut st = shared.lock();
    if let Some(c) = st.clients.remove(&id) {
        if let Some((t, ch)) = c.subscription {
            if let Some(ch) = st.topics.get_mut(&t).and_then(|t| t.channels.get_mut(&ch)) {
                ch.subscribers.retain(|s| *s != id);
            }
        }
    }
    if shared.config.log_flow {
        st.flow.push(FlowEvent {
            at: Instant::now(),
            client: id,
            rdy: 0,
            in_flight: 0,
        });
    }
}

impl Conn {
    /// Sends queued messages while the client's RDY allows.
    fn deliver(&mut self) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let Some(c) = st.clients.get_mut(&self.id) else {
            return;
        };
        if c.closing || c.in_flight >= c.rdy {
            return;
        }
        let Some((t, chn)) = c.subscription.clone() else {
            return;
        };
        let Some(ch) = st.topics.get_mut(&t).and_then(|t| t.channels.get_mut(&chn)) else {
            return;
        };
        let now = Instant::now();
        let mut sent = 0u64;
        while c.in_flight < c.rdy {
            let Some(mut m) = ch.queue.pop_front() else {
                break;
            };
            m.attempts = m.attempts.saturating_add(1);
            message_frame(&mut self.out, &m);
            if self.shared.config.record_messages {
                let r = ch.records.entry(m.id).or_insert_with(|| MsgRecord {
                    id: String::from_utf8_lossy(&m.id).into_owned(),
                    body: m.body.clone(),
                    ..MsgRecord::default()
                });
                r.deliveries += 1;
                r.last_attempts = m.attempts;
                r.delivered_at.push(now);
            }
            ch.in_flight.insert(
                m.id,
                InFlight {
                    msg: m,
                    client: self.id,
                    deadline: now + c.msg_timeout,
                },
            );
            c.in_flight += 1;
            sent += 1;
        }
        if sent > 0 {
            st.stats.deliveries += sent;
            log_flow(&self.shared, st, self.id);
        }
    }

    fn error(&mut self, text: &str) {
        frame(&mut self.out, 1, text.as_bytes());
    }

    fn fatal(&mut self, text: &str) -> Next {
        self.error(text);
        Next::Close
    }

    /// Handles every complete command in `input`.
    fn handle_input(&mut self, input: &mut BytesMut) -> Next {
        loop {
            let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                if input.len() > 1024 {
                    return self.fatal("E_INVALID command line too long");
                }
                return Next::Continue;
            };
            let mut line_end = nl;
            if line_end > 0 && input[line_end - 1] == b'\r' {
                line_end -= 1;
            }
            // Fast path for the commonest command: `FIN <16-byte id>`.
            if line_end == 20 && &input[..4] == b"FIN " {
                let mut id = [0u8; 16];
                id.copy_from_slice(&input[4..20]);
                input.advance(nl + 1);
                if let Next::Close = self.fin_id(id) {
                    return Next::Close;
                }
                continue;
            }
            let line = String::from_utf8_lossy(&input[..line_end]).into_owned();
            let params: Vec<&str> = line.split(' ').collect();
            let has_body = matches!(params[0], "IDENTIFY" | "PUB" | "MPUB" | "DPUB" | "AUTH");
            let body = if has_body {
                if input.len() < nl + 5 {
                    return Next::Continue;
                }
                let size = u32::from_be_bytes([
                    input[nl + 1],
                    input[nl + 2],
                    input[nl + 3],
                    input[nl + 4],
                ]) as usize;
                let limit = match params[0] {
                    "MPUB" => self.shared.config.max_body_size,
                    "PUB" | "DPUB" => self.shared.config.max_msg_size,
                    _ => 64 * 1024,
                };
                if size > limit {
                    let text = match params[0] {
                        "PUB" | "DPUB" => format!(
                            "E_BAD_MESSAGE {} message too big {} > {}",
                            params[0], size, limit
                        ),
                        other => format!("E_BAD_BODY {other} body too big {size} > {limit}"),
                    };
                    return self.fatal(&text);
                }
                if input.len() < nl + 5 + size {
                    return Next::Continue;
                }
                input.advance(nl + 5);
                Some(input.split_to(size).freeze())
            } else {
                input.advance(nl + 1);
                None
            };
            match self.command(&params, body) {
                Next::Continue => {}
                other => return other,
            }
        }
    }

    fn command(&mut self, params: &[&str], body: Option<Bytes>) -> Next {
        // nsqd's enforceTLSPolicy: everything but IDENTIFY waits for TLS.
        if params[0] != "IDENTIFY" && self.shared.config.tls_required {
            let tls = self
                .shared
                .lock()
                .clients
                .get(&self.id)
                .is_some_and(|c| c.tls);
            if !tls {
                return self.fatal(&format!(
                    "E_INVALID cannot {} in current state (TLS required)",
                    params[0]
                ));
            }
        }
        match params[0] {
            "IDENTIFY" => self.identify(body.unwrap_or_default()),
            "SUB" => self.sub(params),
            "RDY" => self.rdy(params),
            "FIN" => self.fin(params),
            "REQ" => self.req(params),
            "TOUCH" => self.touch(params),
            "NOP" => {
                self.shared.lock().stats.nops += 1;
                Next::Continue
            }
            "CLS" => self.cls(),
            "PUB" | "DPUB" | "MPUB" => self.publish(params, body.unwrap_or_default()),
            "AUTH" => self.auth(body.unwrap_or_default()),
            other => {
                let text = format!("E_INVALID invalid command {other}");
                self.fatal(&text)
            }
        }
    }

    fn identify(&mut self, body: Bytes) -> Next {
        let cfg = self.shared.config.clone();
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return self.fatal("E_BAD_BODY IDENTIFY failed to decode JSON body");
        };
        let mut st = self.shared.lock();
        let c = st.clients.get_mut(&self.id).expect("client");
        if c.identified || c.subscription.is_some() {
            drop(st);
            return self.fatal("E_INVALID cannot IDENTIFY in current state");
        }
        let hb = json
            .get("heartbeat_interval")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        match hb {
            -1 => c.heartbeat = None,
            0 => {}
            ms if ms >= 1000 && ms as u128 <= cfg.max_heartbeat_interval.as_millis() => {
                c.heartbeat = Some(Duration::from_millis(ms as u64))
            }
            ms => {
                drop(st);
                return self.fatal(&format!(
                    "E_BAD_BODY IDENTIFY heartbeat interval ({ms}) is invalid"
                ));
            }
        }
        let mt = json
            .get("msg_timeout")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        match mt {
            0 => {}
            ms if ms >= 1000 && ms as u128 <= cfg.max_msg_timeout.as_millis() => {
                c.msg_timeout = Duration::from_millis(ms as u64)
            }
            ms => {
                drop(st);
                return self.fatal(&format!(
                    "E_BAD_BODY IDENTIFY msg timeout ({ms}) is invalid"
                ));
            }
        }
        let s = |k: &str| {
            json.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        c.client_id = s("client_id");
        c.user_agent = s("user_agent");
        c.identified = true;
        let msg_timeout = c.msg_timeout;
        if let Some(hb) = c.heartbeat {
            self.next_heartbeat = Instant::now() + hb;
        }
        drop(st);
        if json.get("feature_negotiation").and_then(|v| v.as_bool()) != Some(true) {
            frame(&mut self.out, 0, b"OK");
            return Next::Continue;
        }
        let asked = |k: &str| json.get(k).and_then(|v| v.as_bool()) == Some(true);
        let tls = cfg.tls.is_some() && asked("tls_v1");
        let deflate = cfg.deflate && asked("deflate");
        let mut deflate_level = 6;
        if let Some(level) = json.get("deflate_level").and_then(|v| v.as_i64()) {
            if deflate && level > 0 {
                deflate_level = level as u32;
            }
        }
        deflate_level = deflate_level.min(cfg.max_deflate_level);
        let snappy = cfg.snappy && asked("snappy");
        if deflate && snappy {
            return self
                .fatal("E_IDENTIFY_FAILED cannot enable both deflate and snappy compression");
        }
        let answer = serde_json::json!({
            "max_rdy_count": cfg.max_rdy_count,
            "version": "1.3.0",
            "max_msg_timeout": cfg.max_msg_timeout.as_millis() as u64,
            "msg_timeout": msg_timeout.as_millis() as u64,
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": cfg.max_deflate_level,
            "snappy": snappy,
            "sample_rate": 0,
            "auth_required": cfg.auth.is_some(),
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250
        });
        frame(&mut self.out, 0, answer.to_string().as_bytes());
        let codec = if snappy {
            Some(("snappy", 0))
        } else if deflate {
            Some(("deflate", deflate_level))
        } else {
            None
        };
        if tls || codec.is_some() {
            return Next::Upgrade { tls, codec };
        }
        Next::Continue
    }

    /// nsqd's AUTH, with the test's [`Auth`] standing in for the auth server.
    fn auth(&mut self, body: Bytes) -> Next {
        let mut st = self.shared.lock();
        st.stats.auth_requests += 1;
        let c = st.clients.get_mut(&self.id).expect("client");
        if c.subscription.is_some() {
            drop(st);
            return self.fatal("E_INVALID cannot AUTH in current state");
        }
        if body.is_empty() {
            drop(st);
            return self.fatal("E_BAD_BODY AUTH invalid body size 0");
        }
        if c.authorized.is_some() {
            drop(st);
            return self.fatal("E_INVALID AUTH already set");
        }
        let secret = String::from_utf8_lossy(&body).into_owned();
        c.auth_secret = Some(secret.clone());
        let Some(auth) = self.shared.config.auth.clone() else {
            drop(st);
            return self.fatal("E_AUTH_DISABLED AUTH disabled");
        };
        if secret != auth.secret {
            drop(st);
            return self.fatal("E_AUTH_FAILED AUTH failed");
        }
        if auth.topics.is_empty() {
            drop(st);
            return self.fatal("E_UNAUTHORIZED AUTH no authorizations found");
        }
        c.authorized = Some(auth.topics.clone());
        drop(st);
        let answer = serde_json::json!({
            "identity": auth.identity,
            "identity_url": "http://auth.example/whoami",
            "permission_count": auth.topics.len(),
        });
        frame(&mut self.out, 0, answer.to_string().as_bytes());
        Next::Continue
    }

    /// nsqd's CheckAuth: `Some(error text)` when `cmd` on `topic` is not allowed.
    fn check_auth(&self, cmd: &str, topic: &str, channel: &str) -> Option<String> {
        self.shared.config.auth.as_ref()?;
        let st = self.shared.lock();
        let c = st.clients.get(&self.id)?;
        match &c.authorized {
            None => Some(format!("E_AUTH_FIRST AUTH required before {cmd}")),
            Some(topics) if !topics.iter().any(|t| t == topic) => Some(format!(
                "E_UNAUTHORIZED AUTH failed for {cmd} on {topic:?} {channel:?}"
            )),
            Some(_) => None,
        }
    }

    fn sub(&mut self, params: &[&str]) -> Next {
        let shared = self.shared.clone();
        let mut guard = shared.lock();
        let st = &mut *guard;
        let c = st.clients.get_mut(&self.id).expect("client");
        let refusal = if c.subscription.is_some() {
            Some("E_INVALID cannot SUB in current state".to_string())
        } else if c.heartbeat.is_none() {
            Some("E_INVALID cannot SUB with heartbeats disabled".to_string())
        } else if params.len() < 3 {
            Some("E_INVALID SUB insufficient number of parameters".to_string())
        } else if !valid_name(params[1]) {
            Some(format!(
                "E_BAD_TOPIC SUB topic name {:?} is not valid",
                params[1]
            ))
        } else if !valid_name(params[2]) {
            Some(format!(
                "E_BAD_CHANNEL SUB channel name {:?} is not valid",
                params[2]
            ))
        } else {
            None
        };
        if let Some(text) = refusal {
            drop(guard);
            return self.fatal(&text);
        }
        drop(guard);
        if let Some(text) = self.check_auth("SUB", params[1], params[2]) {
            return self.fatal(&text);
        }
        let mut guard = shared.lock();
        let st = &mut *guard;
        let c = st.clients.get_mut(&self.id).expect("client");
        let (topic, channel) = (params[1], params[2]);
        c.subscription = Some((topic.to_string(), channel.to_string()));
        let t = st.topics.entry(topic.to_string()).or_default();
        let first_channel = t.channels.is_empty();
        let ch = t.channels.entry(channel.to_string()).or_default();
        if first_channel {
            ch.queue.extend(t.backlog.drain(..));
        }
        ch.subscribers.push(self.id);
        drop(guard);
        frame(&mut self.out, 0, b"OK");
        Next::Continue
    }

    fn rdy(&mut self, params: &[&str]) -> Next {
        let max = self.shared.config.max_rdy_count;
        let mut st = self.shared.lock();
        let c = st.clients.get_mut(&self.id).expect("client");
        if c.closing {
            return Next::Continue;
        }
        if c.subscription.is_none() {
            drop(st);
            return self.fatal("E_INVALID cannot RDY in current state");
        }
        let count: i64 = match params.get(1).map(|p| p.parse::<i64>()) {
            None => 1,
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                drop(st);
                return self.fatal(&format!(
                    "E_INVALID could not parse RDY count {}",
                    params[1]
                ));
            }
        };
        if count < 0 || count > i64::from(max) {
            drop(st);
            return self.fatal(&format!("E_INVALID RDY count {count} out of range 0-{max}"));
        }
        c.rdy = count as u32;
        log_flow(&self.shared, &mut st, self.id);
        Next::Continue
    }

    /// Looks up an in-flight message for FIN/REQ/TOUCH, with nsqd's checks and texts.
    fn in_flight_check(
        &mut self,
        verb: &str,
        params: &[&str],
    ) -> Result<([u8; 16], String, String), Next> {
        let sub = {
            let st = self.shared.lock();
            st.clients
                .get(&self.id)
                .expect("client")
                .subscription
                .clone()
        };
        let Some((t, ch)) = sub else {
            return Err(self.fatal(&format!("E_INVALID cannot {verb} in current state")));
        };
        if params.len() < 2 {
            return Err(self.fatal(&format!("E_INVALID {verb} insufficient number of params")));
        }
        if params[1].len() != 16 {
            return Err(self.fatal("E_INVALID Invalid Message ID"));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(params[1].as_bytes());
        Ok((id, t, ch))
    }

    fn fin(&mut self, params: &[&str]) -> Next {
        if params.len() < 2 {
            return self.fatal("E_INVALID FIN insufficient number of params");
        }
        if params[1].len() != 16 {
            return self.fatal("E_INVALID Invalid Message ID");
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(params[1].as_bytes());
        self.fin_id(id)
    }

    fn fin_id(&mut self, id: [u8; 16]) -> Next {
        let shared = self.shared.clone();
        let mut guard = shared.lock();
        let st = &mut *guard;
        let Some((t, chn)) = st
            .clients
            .get(&self.id)
            .and_then(|c| c.subscription.clone())
        else {
            drop(guard);
            return self.fatal("E_INVALID cannot FIN in current state");
        };
        let ch = st
            .topics
            .get_mut(&t)
            .and_then(|t| t.channels.get_mut(&chn))
            .expect("channel");
        let problem = ch.ownership_problem(&id, self.id);
        if let Some(problem) = problem {
            if let Some(r) = ch.records.get_mut(&id) {
                r.fin_failed += 1;
            }
            st.stats.fin_failed += 1;
            drop(guard);
            let text = format!(
                "E_FIN_FAILED FIN {} failed {problem}",
                String::from_utf8_lossy(&id)
            );
            self.error(&text);
            return Next::Continue;
        }
        let f = ch.in_flight.remove(&id).expect("checked");
        ch.finished.push(f.msg.body);
        if let Some(r) = ch.records.get_mut(&id) {
            r.fin_ok += 1;
        }
        st.stats.fin_ok += 1;
        if let Some(c) = st.clients.get_mut(&self.id) {
            c.in_flight -= 1;
        }
        if shared.config.log_flow {
            log_flow(&shared, st, self.id);
        }
        Next::Continue
    }

    fn req(&mut self, params: &[&str]) -> Next {
        let (id, t, chn) = match self.in_flight_check("REQ", params) {
            Ok(x) => x,
            Err(next) => return next,
        };
        let max = self.shared.config.max_req_timeout.as_millis() as i64;
        let delay_ms = match params.get(2).map(|p| p.parse::<i64>()) {
            Some(Ok(ms)) => ms,
            _ => return self.fatal("E_INVALID could not parse REQ timeout"),
        };
        if delay_ms < 0 || delay_ms > max {
            return self.fatal(&format!(
                "E_INVALID REQ timeout {delay_ms} out of range 0-{max}"
            ));
        }
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let ch = st
            .topics
            .get_mut(&t)
            .and_then(|t| t.channels.get_mut(&chn))
            .expect("channel");
        let problem = ch.ownership_problem(&id, self.id);
        if let Some(problem) = problem {
            if let Some(r) = ch.records.get_mut(&id) {
                r.req_failed += 1;
            }
            st.stats.req_failed += 1;
            drop(guard);
            self.error(&format!("E_REQ_FAILED REQ {} failed {problem}", params[1]));
            return Next::Continue;
        }
        let f = ch.in_flight.remove(&id).expect("checked");
        let delay = Duration::from_millis(delay_ms as u64);
        let now = Instant::now();
        if let Some(r) = ch.records.get_mut(&id) {
            r.req_ok += 1;
            r.requeued_at.push((now, delay));
        }
        if delay.is_zero() {
            ch.queue.push_back(f.msg);
        } else {
            st.deferred_seq += 1;
            let seq = st.deferred_seq;
            ch.deferred.push(Reverse((now + delay, seq, id)));
            ch.deferred_msgs.insert(seq, f.msg);
        }
        let wake: Vec<u64> = ch.subscribers.clone();
        st.stats.req_ok += 1;
        if let Some(c) = st.clients.get_mut(&self.id) {
            c.in_flight -= 1;
        }
        for w in wake {
            if let Some(c) = st.clients.get(&w) {
                c.notify.notify_one();
            }
        }
        log_flow(&self.shared, st, self.id);
        Next::Continue
    }

    fn touch(&mut self, params: &[&str]) -> Next {
        let (id, t, chn) = match self.in_flight_check("TOUCH", params) {
            Ok(x) => x,
            Err(next) => return next,
        };
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let timeout = st
            .clients
            .get(&self.id)
            .map(|c| c.msg_timeout)
            .expect("client");
        let ch = st
            .topics
            .get_mut(&t)
            .and_then(|t| t.channels.get_mut(&chn))
            .expect("channel");
        let problem = ch.ownership_problem(&id, self.id);
        if problem.is_none() {
            if let Some(f) = ch.in_flight.get_mut(&id) {
                f.deadline = Instant::now() + timeout;
            }
        }
        let r = ch.records.get_mut(&id);
        if let Some(problem) = problem {
            if let Some(r) = r {
                r.touch_failed += 1;
            }
            st.stats.touch_failed += 1;
            drop(guard);
            self.error(&format!(
                "E_TOUCH_FAILED TOUCH {} failed {problem}",
                params[1]
            ));
            return Next::Continue;
        }
        if let Some(r) = r {
            r.touch_ok += 1;
        }
        st.stats.touch_ok += 1;
        Next::Continue
    }

    fn cls(&mut self) -> Next {
        let mut st = self.shared.lock();
        st.stats.cls += 1;
        let c = st.clients.get_mut(&self.id).expect("client");
        if c.subscription.is_none() {
            drop(st);
            return self.fatal("E_INVALID cannot CLS in current state");
        }
        c.closing = true;
        drop(st);
        frame(&mut self.out, 0, b"CLOSE_WAIT");
        Next::Continue
    }

    fn publish(&mut self, params: &[&str], body: Bytes) -> Next {
        let verb = params[0];
        let Some(topic) = params.get(1).copied() else {
            return self.fatal(&format!(
                "E_INVALID {verb} insufficient number of parameters"
            ));
        };
        if !valid_name(topic) {
            return self.fatal(&format!(
                "E_BAD_TOPIC {verb} topic name {topic:?} is not valid"
            ));
        }
        let mut defer = None;
        if verb == "DPUB" {
            let max = self.shared.config.max_req_timeout.as_millis() as i64;
            match params.get(2).map(|p| p.parse::<i64>()) {
                Some(Ok(ms)) if (0..=max).contains(&ms) => {
                    defer = Some(Duration::from_millis(ms as u64))
                }
                Some(Ok(ms)) => {
                    return self.fatal(&format!("E_INVALID DPUB timeout {ms} out of range 0-{max}"))
                }
                _ => return self.fatal("E_INVALID DPUB could not parse timeout"),
            }
        }
        let bodies = if verb == "MPUB" {
            let mut b = body;
            if b.len() < 4 {
                return self.fatal("E_BAD_BODY MPUB failed to read message count");
            }
            let count = b.get_u32();
            if count == 0 {
                return self.fatal("E_BAD_BODY MPUB invalid message count 0");
            }
            let mut v = Vec::new();
            for _ in 0..count {
                if b.len() < 4 {
                    return self.fatal("E_BAD_MESSAGE MPUB failed to read message body size");
                }
                let size = b.get_u32() as usize;
                if size == 0 {
                    return self.fatal("E_BAD_MESSAGE MPUB invalid message body size 0");
                }
                if size > self.shared.config.max_msg_size {
                    return self.fatal(&format!(
                        "E_BAD_MESSAGE MPUB message too big {size} > {}",
                        self.shared.config.max_msg_size
                    ));
                }
                if b.len() < size {
                    return self.fatal("E_BAD_MESSAGE MPUB failed to read message body");
                }
                v.push(b.split_to(size));
            }
            v
        } else {
            if body.is_empty() {
                return self.fatal(&format!("E_BAD_MESSAGE {verb} invalid message body size 0"));
            }
            vec![body]
        };
        if let Some(text) = self.check_auth(verb, topic, "") {
            return self.fatal(&text);
        }
        let mut st = self.shared.lock();
        if st.fail_publishes > 0 {
            st.fail_publishes -= 1;
            drop(st);
            self.error(&format!("E_{verb}_FAILED {verb} failed injected fault"));
            return Next::Continue;
        }
        let st = &mut *st;
        if verb == "MPUB" {
            st.stats.mpub_commands += 1;
        } else {
            st.stats.pub_commands += 1;
        }
        for body in bodies {
            match defer {
                Some(d) if !d.is_zero() => {
                    let m = new_msg(&self.shared, st, body.clone());
                    st.stats.published += 1;
                    let t = st.topics.entry(topic.to_string()).or_default();
                    t.log.push(body);
                    t.deferred.push((Instant::now() + d, m));
                }
                _ => publish_now(&self.shared, st, topic, body),
            }
        }
        frame(&mut self.out, 0, b"OK");
        Next::Continue
    }
}
