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
//! old value for [`RDY_SETTLE`] (so nsqd has applied the decrease before another connection is
//! raised) and with its in-flight count for as long as messages are unanswered.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connection::{broker_error, ConnHandle, Connection, Identify, Writer, USER_AGENT};
use super::error::Error;
use super::frame::{is_non_fatal_error, Command, Frame, DEFAULT_MAX_FRAME_SIZE, HEARTBEAT};
use super::lookupd;
use super::message::Message;

/// How long a lowered RDY keeps counting at its old value before its budget is given to
/// another connection. Loopback and LAN deliver the lower RDY well within this.
pub const RDY_SETTLE: Duration = Duration::from_millis(50);

/// Everything a [`Consumer`] needs. Build it with [`ConsumerConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Topic to subscribe to.
    pub topic: String,
    /// Channel to subscribe to.
    pub channel: String,
    /// nsqd TCP addresses (`host:port`) to connect to directly. Never dropped.
    pub nsqd_tcp_addresses: Vec<String>,
    /// nsqlookupd HTTP addresses (`host:port` or `http://host:port`) to discover nsqd from.
    pub lookupd_http_addresses: Vec<String>,
    /// Upper bound on messages in flight over all connections. Defaults to: `1` (go-nsq).
    pub max_in_flight: u32,
    /// Asks nsqd to redeliver unfinished messages after this long. Defaults to: `None`
    /// (nsqd's `--msg-timeout`, 60 s). nsqd accepts 1 s up to its `--max-msg-timeout`.
    pub msg_timeout: Option<Duration>,
    /// Heartbeat interval asked of nsqd (1 s to 60 s). A connection silent for two and a half
    /// intervals is considered dead. Defaults to: 30 s.
    pub heartbeat_interval: Duration,
    /// Messages delivered more often than this are logged and finished without being handed
    /// out; 0 disables the check. Defaults to: `5` (go-nsq).
    ///
    /// Finishing drops the message for good. A consumer that must not lose messages sets 0 and
    /// decides itself what to do with a message that keeps failing, as the sidecar does with
    /// its dead-letter.
    pub max_attempts: u16,
    /// `requeue(None)` waits this long times the attempt count... Defaults to: 90 s.
    pub default_requeue_delay: Duration,
    /// ...capped at this, as is any explicit requeue delay (keep it at or below nsqd's
    /// `--max-req-timeout`, 1 h by default, or nsqd closes the connection). Defaults to: 15 min.
    pub max_requeue_delay: Duration,
    /// First handler-failure backoff; each further failure doubles it. Zero disables backoff.
    /// Defaults to: 1 s.
    pub backoff_multiplier: Duration,
    /// Longest handler-failure backoff. Defaults to: 2 min.
    pub max_backoff: Duration,
    /// How often nsqlookupd is polled. Defaults to: 60 s.
    pub lookupd_poll_interval: Duration,
    /// Fraction of the poll interval added or removed at random. Defaults to: `0.3`.
    pub lookupd_poll_jitter: f64,
    /// How often RDY moves between connections when there are more connections than
    /// `max_in_flight`. Defaults to: 5 s (go-nsq's `rdy_redistribute_interval`).
    pub rdy_redistribute_interval: Duration,
    /// Largest frame accepted from nsqd. Defaults to: 1 MiB + 1 KiB (nsqd's `--max-msg-size`).
    pub max_frame_size: usize,
    /// Bound on connecting, IDENTIFY and SUB. Defaults to: 5 s.
    pub connect_timeout: Duration,
    /// First reconnect delay; it doubles per failed attempt, with jitter. Defaults to: 250 ms.
    pub reconnect_backoff_min: Duration,
    /// Longest reconnect delay; reconnection never gives up. Defaults to: 30 s.
    pub reconnect_backoff_max: Duration,
    /// How long a connection to an nsqd that vanished from nsqlookupd may drain its in-flight
    /// messages before they are requeued and it is closed. Defaults to: 30 s.
    pub removal_grace: Duration,
    /// Reported in IDENTIFY. Defaults to: the host name.
    pub client_id: String,
    /// Reported in IDENTIFY. Defaults to: the host name.
    pub hostname: String,
    /// Reported in IDENTIFY. Defaults to: `nsq-dedupe/<version>`.
    pub user_agent: String,
    /// How long nsqd may hold messages in its output buffer before writing them. nsqd flushes
    /// at once when the client's RDY is used up, but with spare RDY and sparse traffic a message
    /// can wait up to this long. `Some(Duration::ZERO)` turns buffering off (IDENTIFY sends -1);
    /// other values must be at least nsqd's `--min-output-buffer-timeout` (25 ms by default) or
    /// nsqd refuses IDENTIFY. Defaults to: `None` (nsqd's default, 250 ms).
    pub output_buffer_timeout: Option<Duration>,
}

impl ConsumerConfig {
    /// A configuration for `topic`/`channel` with go-nsq-like defaults and no addresses.
    pub fn new(topic: impl Into<String>, channel: impl Into<String>) -> Self {
        let host = hostname();
        ConsumerConfig {
            topic: topic.into(),
            channel: channel.into(),
            nsqd_tcp_addresses: Vec::new(),
            lookupd_http_addresses: Vec::new(),
            max_in_flight: 1,
            msg_timeout: None,
            heartbeat_interval: Duration::from_secs(30),
            max_attempts: 5,
            default_requeue_delay: Duration::from_secs(90),
            max_requeue_delay: Duration::from_secs(15 * 60),
            backoff_multiplier: Duration::from_secs(1),
            max_backoff: Duration::from_secs(120),
            lookupd_poll_interval: Duration::from_secs(60),
            lookupd_poll_jitter: 0.3,
            rdy_redistribute_interval: Duration::from_secs(5),
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            connect_timeout: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(250),
            reconnect_backoff_max: Duration::from_secs(30),
            removal_grace: Duration::from_secs(30),
            client_id: host.split('.').next().unwrap_or("").to_string(),
            hostname: host,
            user_agent: USER_AGENT.to_string(),
            output_buffer_timeout: None,
        }
    }

    /// Checks every setting, naming the first one that is wrong.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the setting.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field, reason: String| Err(Error::Config { field, reason });
        if !is_valid_name(&self.topic) {
            return bad("topic", format!("{:?} is not a valid NSQ topic name (1-64 of [.a-zA-Z0-9_-], optionally ending in #ephemeral)", self.topic));
        }
        if !is_valid_name(&self.channel) {
            return bad("channel", format!("{:?} is not a valid NSQ channel name (1-64 of [.a-zA-Z0-9_-], optionally ending in #ephemeral)", self.channel));
        }
        if self.nsqd_tcp_addresses.is_empty() && self.lookupd_http_addresses.is_empty() {
            return bad(
                "nsqd_tcp_addresses",
                "give at least one nsqd TCP address or one nsqlookupd HTTP address".into(),
            );
        }
        for addr in &self.lookupd_http_addresses {
            lookupd::parse_address(addr)?;
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1".into());
        }
        let hb = self.heartbeat_interval;
        if hb < Duration::from_secs(1) || hb > Duration::from_secs(60) {
            return bad(
                "heartbeat_interval",
                format!("nsqd accepts 1 s to 60 s, got {hb:?}"),
            );
        }
        if let Some(t) = self.msg_timeout {
            if t < Duration::from_secs(1) {
                return bad(
                    "msg_timeout",
                    format!("nsqd accepts at least 1 s, got {t:?}"),
                );
            }
        }
        if self.max_frame_size < 64 {
            return bad(
                "max_frame_size",
                format!("must be at least 64 bytes, got {}", self.max_frame_size),
            );
        }
        if !(0.0..1.0).contains(&self.lookupd_poll_jitter) {
            return bad(
                "lookupd_poll_jitter",
                format!("must be in [0, 1), got {}", self.lookupd_poll_jitter),
            );
        }
        if self.lookupd_poll_interval.is_zero() || self.rdy_redistribute_interval.is_zero() {
            return bad(
                "lookupd_poll_interval",
                "poll and redistribute intervals must be above zero".into(),
            );
        }
        if self.reconnect_backoff_min.is_zero()
            || self.reconnect_backoff_max < self.reconnect_backoff_min
        {
            return bad(
                "reconnect_backoff_min",
                format!(
                    "need 0 < reconnect_backoff_min <= reconnect_backoff_max, got {:?} and {:?}",
                    self.reconnect_backoff_min, self.reconnect_backoff_max
                ),
            );
        }
        Ok(())
    }

    fn identify(&self) -> Identify {
        Identify {
            client_id: self.client_id.clone(),
            hostname: self.hostname.clone(),
            user_agent: self.user_agent.clone(),
            feature_negotiation: true,
            heartbeat_interval: self.heartbeat_interval.as_millis() as i64,
            msg_timeout: self.msg_timeout.map_or(0, |t| t.as_millis() as u64),
            output_buffer_size: 0,
            output_buffer_timeout: match self.output_buffer_timeout {
                None => 0,
                Some(t) if t.is_zero() => -1,
                Some(t) => i64::try_from(t.as_millis()).unwrap_or(i64::MAX),
            },
        }
    }
}

/// nsqd's rule for topic and channel names.
pub(crate) fn is_valid_name(name: &str) -> bool {
    let base = name.strip_suffix("#ephemeral").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 64
        && !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// A uniformly random number in `[0, 1)`, good enough for jitter (not for anything else).
pub(crate) fn random_unit() -> f64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x9e37_79b9_7f4a_7c15);
            h.finish() | 1
        });
    }
    STATE.with(|s| {
        // xorshift64*
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// Something that happened to the consumer, for logs, metrics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerEvent {
    /// A connection was established and subscribed.
    Connected {
        /// The nsqd address.
        addr: String,
    },
    /// A connection ended; `in_flight` messages on it will be redelivered by nsqd.
    Disconnected {
        /// The nsqd address.
        addr: String,
        /// Why.
        error: String,
        /// Messages that were unanswered when it ended.
        in_flight: usize,
    },
    /// Connecting failed.
    ConnectFailed {
        /// The nsqd address.
        addr: String,
        /// Why.
        error: String,
    },
    /// A reconnect is scheduled.
    ReconnectScheduled {
        /// The nsqd address.
        addr: String,
        /// Failed attempts so far.
        attempt: u32,
        /// Wait before the next attempt.
        delay: Duration,
    },
    /// nsqd reported a non-fatal error; the connection stays up.
    NonFatalError {
        /// The nsqd address.
        addr: String,
        /// The error text.
        text: String,
    },
    /// nsqlookupd reported a new nsqd.
    NsqdDiscovered {
        /// The nsqd address.
        addr: String,
    },
    /// An nsqd vanished from nsqlookupd; its connection is drained and closed.
    NsqdRemoved {
        /// The nsqd address.
        addr: String,
    },
    /// Querying an nsqlookupd failed.
    LookupdFailed {
        /// The lookupd address.
        addr: String,
        /// Why.
        error: String,
    },
    /// Handler failures started or deepened backoff.
    BackoffStarted {
        /// Backoff level (1 = first failure).
        level: u32,
        /// Pause before testing with RDY 1.
        delay: Duration,
    },
    /// Backoff ended; full RDY is restored.
    BackoffEnded,
    /// A message exceeded `max_attempts` and was finished without being handed out.
    MaxAttemptsExceeded {
        /// The message ID.
        id: String,
        /// Its attempts.
        attempts: u16,
    },
}

/// Counters since the consumer started. See [`Consumer::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Message frames received (including those finished for exceeding `max_attempts`).
    pub messages_received: u64,
    /// FINs queued.
    pub finished: u64,
    /// REQs queued (by handlers, drops and shutdown).
    pub requeued: u64,
    /// TOUCHes queued.
    pub touched: u64,
    /// Non-fatal error frames received.
    pub non_fatal_errors: u64,
    /// Heartbeats answered with NOP.
    pub heartbeats: u64,
    /// Successful connects (first ones and reconnects).
    pub connects: u64,
    /// Connections that ended other than by shutdown or removal.
    pub disconnects: u64,
    /// Messages finished without being handed out because of `max_attempts`.
    pub max_attempts_exceeded: u64,
    /// Connections up now.
    pub connections: u64,
    /// Sum of the RDY last sent over live connections.
    pub rdy_total: u64,
}

#[derive(Default)]
struct Counters {
    messages_received: AtomicU64,
    finished: AtomicU64,
    requeued: AtomicU64,
    touched: AtomicU64,
    non_fatal_errors: AtomicU64,
    heartbeats: AtomicU64,
    connects: AtomicU64,
    disconnects: AtomicU64,
    max_attempts_exceeded: AtomicU64,
    connections: AtomicU64,
    rdy_total: AtomicU64,
    requeued_at_deadline: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// State shared by the consumer's tasks and its messages.
pub(crate) struct ConsumerShared {
    counters: Counters,
    default_requeue_delay: Duration,
    max_requeue_delay: Duration,
    /// True while backing off: only then do finishes report to the control task.
    backoff_active: AtomicBool,
    /// True once shutdown began: dropped messages are requeued with no delay.
    shutting_down: AtomicBool,
    control: mpsc::UnboundedSender<Control>,
    events: broadcast::Sender<ConsumerEvent>,
}

impl ConsumerShared {
    pub(crate) fn default_requeue_delay(&self, attempts: u16) -> Duration {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        self.default_requeue_delay
            .saturating_mul(u32::from(attempts.max(1)))
            .min(self.max_requeue_delay)
    }

    pub(crate) fn clamp_requeue_delay(&self, delay: Duration) -> Duration {
        delay.min(self.max_requeue_delay)
    }

    pub(crate) fn on_finished(&self) {
        inc(&self.counters.finished);
        if self.backoff_active.load(Ordering::Relaxed) {
            let _ = self.control.send(Control::Outcome { success: true });
        }
    }

    pub(crate) fn on_requeued(&self, backoff: bool) {
        inc(&self.counters.requeued);
        if backoff {
            let _ = self.control.send(Control::Outcome { success: false });
        }
    }

    pub(crate) fn on_touched(&self) {
        inc(&self.counters.touched);
    }

    fn event(&self, event: ConsumerEvent) {
        // No receivers is fine: events are optional.
        let _ = self.events.send(event);
    }
}

/// What the consumer's tasks tell its control task.
pub(crate) enum Control {
    Up {
        addr: Arc<str>,
        conn: Arc<ConnHandle>,
        max_rdy: u32,
    },
    Down {
        addr: Arc<str>,
    },
    Outcome {
        success: bool,
    },
    Lookup(Vec<(String, Result<Vec<String>, Error>)>),
    Shutdown {
        grace: Duration,
        done: oneshot::Sender<ShutdownReport>,
    },
}

/// What [`Consumer::shutdown`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Messages received but never handed out, requeued with no delay.
    pub requeued_unseen: usize,
    /// Messages still unanswered when the grace period ended, requeued with no delay.
    pub requeued_at_deadline: usize,
    /// Whether every connection closed before the grace period (plus a second) ran out.
    pub clean: bool,
}

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
    /// Receiving end of the message channel; the supervisors hold the senders.
    messages: mpsc::UnboundedReceiver<Message>,
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
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(ConsumerShared {
            counters: Counters::default(),
            default_requeue_delay: config.default_requeue_delay,
            max_requeue_delay: config.max_requeue_delay,
            backoff_active: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            control: control_tx.clone(),
            events,
        });
        let (msg_tx, messages) = mpsc::unbounded_channel();
        let hard_stop = CancellationToken::new();
        let mut control = ControlTask {
            identify: Arc::new(config.identify()),
            config: Arc::new(config),
            shared: shared.clone(),
            control_tx,
            control_rx,
            msg_tx,
            hard_stop: hard_stop.clone(),
            entries: HashMap::new(),
            backoff_level: 0,
            backoff: BackoffPhase::Normal,
            test_rotor: 0,
            rotation_offset: 0,
            last_rotation: Instant::now(),
            lookup_in_progress: false,
        };
        for addr in control.config.nsqd_tcp_addresses.clone() {
            control.add(addr, true);
        }
        let control_task = tokio::spawn(control.run());
        Ok(Consumer {
            messages,
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
        self.messages.recv().await
    }

    /// A subscription to the consumer's events from now on. A receiver that falls more than
    /// 1024 events behind loses the oldest.
    pub fn events(&self) -> broadcast::Receiver<ConsumerEvent> {
        self.shared.events.subscribe()
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
        while let Ok(message) = self.messages.try_recv() {
            if message
                .requeue_without_backoff(Some(Duration::ZERO))
                .is_ok()
            {
                requeued_unseen += 1;
            }
        }
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

impl Drop for Consumer {
    fn drop(&mut self) {
        self.hard_stop.cancel();
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum BackoffPhase {
    Normal,
    Waiting { until: Instant },
    Testing,
}

/// The live state of the connection to `addr`, which the caller has just seen to be live.
///
/// # Panics
///
/// If `addr` has no live connection: `rebalance` lists live connections first and changes
/// none in between, so that would be a broken invariant.
fn live_mut<'a>(entries: &'a mut HashMap<Arc<str>, Entry>, addr: &str) -> &'a mut Live {
    entries
        .get_mut(addr)
        .and_then(|e| e.live.as_mut())
        .expect("rebalance lists only live connections")
}

struct Entry {
    from_lookupd: bool,
    /// Set to a deadline to make the supervisor drain and stop.
    drain: watch::Sender<Option<Instant>>,
    retiring: bool,
    task: JoinHandle<()>,
    live: Option<Live>,
}

struct Live {
    conn: Arc<ConnHandle>,
    max_rdy: u32,
    rdy_sent: u32,
    /// What this connection may still have from nsqd: at least `rdy_sent`, and a lowered
    /// RDY's old value until `release_at`.
    rdy_held: u32,
    release_at: Option<Instant>,
}

struct ControlTask {
    config: Arc<ConsumerConfig>,
    identify: Arc<Identify>,
    shared: Arc<ConsumerShared>,
    control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
    msg_tx: mpsc::UnboundedSender<Message>,
    hard_stop: CancellationToken,
    entries: HashMap<Arc<str>, Entry>,
    backoff_level: u32,
    backoff: BackoffPhase,
    test_rotor: usize,
    rotation_offset: usize,
    last_rotation: Instant,
    lookup_in_progress: bool,
}

impl ControlTask {
    async fn run(mut self) {
        let has_lookupd = !self.config.lookupd_http_addresses.is_empty();
        let mut next_lookup = Instant::now();
        let mut tick = tokio::time::interval(RDY_SETTLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.hard_stop.cancelled() => break,
                msg = self.control_rx.recv() => {
                    let Some(msg) = msg else { break };
                    match msg {
                        Control::Shutdown { grace, done } => {
                            self.shutdown(grace, done);
                            return;
                        }
                        other => self.handle(other),
                    }
                }
                _ = tokio::time::sleep_until(next_lookup), if has_lookupd && !self.lookup_in_progress => {
                    self.spawn_lookup();
                    let jitter = self.config.lookupd_poll_jitter * (2.0 * random_unit() - 1.0);
                    next_lookup = Instant::now() + self.config.lookupd_poll_interval.mul_f64(1.0 + jitter);
                }
                _ = tick.tick() => self.on_tick(),
            }
        }
        // Hard stop: supervisors watch the same token.
    }

    fn handle(&mut self, msg: Control) {
        match msg {
            Control::Up {
                addr,
                conn,
                max_rdy,
            } => {
                if let Some(entry) = self.entries.get_mut(&addr) {
                    entry.live = Some(Live {
                        conn,
                        max_rdy,
                        rdy_sent: 0,
                        rdy_held: 0,
                        release_at: None,
                    });
                    inc(&self.shared.counters.connections);
                }
                self.rebalance();
            }
            Control::Down { addr } => {
                let retiring = match self.entries.get_mut(&addr) {
                    Some(entry) => {
                        if entry.live.take().is_some() {
                            self.shared
                                .counters
                                .connections
                                .fetch_sub(1, Ordering::Relaxed);
                        }
                        entry.retiring
                    }
                    None => false,
                };
                if retiring {
                    self.entries.remove(&addr);
                }
                self.rebalance();
            }
            Control::Outcome { success } => self.on_outcome(success),
            Control::Lookup(results) => self.on_lookup(results),
            Control::Shutdown { .. } => unreachable!("handled in run"),
        }
    }

    fn add(&mut self, addr: String, is_static: bool) {
        let addr: Arc<str> = addr.into();
        if self.entries.contains_key(&addr) {
            return;
        }
        let (drain, drain_rx) = watch::channel(None);
        let supervisor = Supervisor {
            addr: addr.clone(),
            config: self.config.clone(),
            identify: self.identify.clone(),
            shared: self.shared.clone(),
            control: self.control_tx.clone(),
            messages: self.msg_tx.clone(),
            hard_stop: self.hard_stop.clone(),
            drain: drain_rx,
        };
        let task = tokio::spawn(supervisor.run());
        self.entries.insert(
            addr,
            Entry {
                from_lookupd: !is_static,
                drain,
                retiring: false,
                task,
                live: None,
            },
        );
    }

    fn spawn_lookup(&mut self) {
        self.lookup_in_progress = true;
        let addrs = self.config.lookupd_http_addresses.clone();
        let topic = self.config.topic.clone();
        let timeout = self.config.connect_timeout;
        let control = self.control_tx.clone();
        tokio::spawn(async move {
            let queries = addrs.into_iter().map(|addr| {
                let topic = topic.clone();
                async move {
                    let result = lookupd::lookup(&addr, &topic, timeout).await;
                    (addr, result)
                }
            });
            let results = futures::future::join_all(queries).await;
            let _ = control.send(Control::Lookup(results));
        });
    }

    fn on_lookup(&mut self, results: Vec<(String, Result<Vec<String>, Error>)>) {
        self.lookup_in_progress = false;
        let mut all_ok = true;
        let mut found = HashSet::new();
        for (lookupd, result) in results {
            match result {
                Ok(producers) => found.extend(producers),
                Err(error) => {
                    all_ok = false;
                    tracing::warn!(lookupd = %lookupd, %error, "nsqlookupd query failed; keeping current connections.");
                    self.shared.event(ConsumerEvent::LookupdFailed {
                        addr: lookupd,
                        error: error.to_string(),
                    });
                }
            }
        }
        for addr in &found {
            if !self.entries.contains_key(addr.as_str()) {
                tracing::info!(nsqd = %addr, "Discovered nsqd through nsqlookupd.");
                self.shared
                    .event(ConsumerEvent::NsqdDiscovered { addr: addr.clone() });
                self.add(addr.clone(), false);
            }
        }
        // Only a complete answer can prove an nsqd is gone.
        if all_ok {
            let deadline = Instant::now() + self.config.removal_grace;
            for (addr, entry) in self.entries.iter_mut() {
                if entry.from_lookupd && !entry.retiring && !found.contains(&**addr) {
                    tracing::info!(nsqd = %addr, "nsqd vanished from nsqlookupd; draining its connection.");
                    self.shared.event(ConsumerEvent::NsqdRemoved {
                        addr: addr.to_string(),
                    });
                    entry.retiring = true;
                    let _ = entry.drain.send(Some(deadline));
                }
            }
            // Entries with no live connection retire at once.
            self.entries
                .retain(|_, e| !(e.retiring && e.live.is_none() && e.task.is_finished()));
        }
        self.rebalance();
    }

    fn backoff_delay(&self) -> Duration {
        let exp = self.backoff_level.saturating_sub(1).min(30);
        self.config
            .backoff_multiplier
            .saturating_mul(1u32 << exp)
            .min(self.config.max_backoff)
    }

    fn on_outcome(&mut self, success: bool) {
        if self.config.backoff_multiplier.is_zero() {
            return;
        }
        match (self.backoff, success) {
            // Answers to messages delivered before the pause say nothing new.
            (BackoffPhase::Waiting { .. }, _) => return,
            (BackoffPhase::Normal, true) => return,
            (BackoffPhase::Normal, false) | (BackoffPhase::Testing, false) => {
                self.backoff_level = (self.backoff_level + 1).min(31);
            }
            (BackoffPhase::Testing, true) => {
                self.backoff_level = self.backoff_level.saturating_sub(1);
            }
        }
        if self.backoff_level == 0 {
            self.backoff = BackoffPhase::Normal;
            self.shared.backoff_active.store(false, Ordering::Relaxed);
            tracing::info!("Handler backoff ended; restoring RDY.");
            self.shared.event(ConsumerEvent::BackoffEnded);
        } else {
            let delay = self.backoff_delay();
            self.backoff = BackoffPhase::Waiting {
                until: Instant::now() + delay,
            };
            self.shared.backoff_active.store(true, Ordering::Relaxed);
            tracing::warn!(
                level = self.backoff_level,
                delay_ms = delay.as_millis() as u64,
                "Handler failed; backing off."
            );
            self.shared.event(ConsumerEvent::BackoffStarted {
                level: self.backoff_level,
                delay,
            });
        }
        self.rebalance();
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        for entry in self.entries.values_mut() {
            if let Some(live) = entry.live.as_mut() {
                if live.release_at.is_some_and(|t| t <= now) {
                    live.rdy_held = live.rdy_sent;
                    live.release_at = None;
                }
            }
        }
        if let BackoffPhase::Waiting { until } = self.backoff {
            if until <= now {
                self.backoff = BackoffPhase::Testing;
                self.test_rotor = self.test_rotor.wrapping_add(1);
            }
        }
        if now.duration_since(self.last_rotation) >= self.config.rdy_redistribute_interval {
            self.last_rotation = now;
            self.rotation_offset = self
                .rotation_offset
                .wrapping_add(self.config.max_in_flight as usize);
            // The test phase waits for a message on one connection; if that nsqd has nothing
            // queued, none would ever come. Move the test RDY on, as go-nsq's redistribution
            // does, so that an idle nsqd cannot stall the consumer.
            if self.backoff == BackoffPhase::Testing {
                self.test_rotor = self.test_rotor.wrapping_add(1);
            }
        }
        self.rebalance();
    }

    /// Computes each live connection's RDY target and sends the changes: decreases first,
    /// then increases only as far as the budget (`max_in_flight` minus what every connection
    /// may still hold) allows.
    fn rebalance(&mut self) {
        let max = self.config.max_in_flight;
        let mut live: Vec<(Arc<str>, bool)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.live.is_some())
            .map(|(a, e)| (a.clone(), e.retiring))
            .collect();
        live.sort();
        let active: Vec<&Arc<str>> = live.iter().filter(|(_, r)| !r).map(|(a, _)| a).collect();
        let n = active.len();
        let mut targets: HashMap<Arc<str>, u32> = HashMap::with_capacity(live.len());
        match self.backoff {
            BackoffPhase::Waiting { .. } => {}
            BackoffPhase::Testing => {
                if n > 0 {
                    targets.insert(active[self.test_rotor % n].clone(), 1);
                }
            }
            BackoffPhase::Normal if n == 0 => {}
            BackoffPhase::Normal if n as u64 <= u64::from(max) => {
                let share = max / n as u32;
                let extra = (max % n as u32) as usize;
                for (i, addr) in active.iter().enumerate() {
                    targets.insert((*addr).clone(), share + u32::from(i < extra));
                }
            }
            BackoffPhase::Normal => {
                for k in 0..max as usize {
                    let addr = active[(self.rotation_offset + k) % n];
                    targets.insert(addr.clone(), 1);
                }
            }
        }
        let now = Instant::now();
        // Decreases first.
        for (addr, _) in &live {
            let live = live_mut(&mut self.entries, addr);
            let target = targets.get(addr).copied().unwrap_or(0).min(live.max_rdy);
            if target < live.rdy_sent {
                let _ = live.conn.send(Command::Rdy(target));
                live.rdy_sent = target;
                live.release_at = Some(now + RDY_SETTLE);
            }
        }
        let holding = |l: &Live| l.rdy_held.max(l.rdy_sent).max(l.conn.in_flight() as u32);
        let mut used: u64 = live
            .iter()
            .filter_map(|(a, _)| self.entries[a].live.as_ref())
            .map(|l| u64::from(holding(l)))
            .sum();
        for (addr, _) in &live {
            let live = live_mut(&mut self.entries, addr);
            let target = targets.get(addr).copied().unwrap_or(0).min(live.max_rdy);
            if target > live.rdy_sent {
                let old = u64::from(holding(live));
                let others = used - old;
                let allowed = u64::from(max)
                    .saturating_sub(others)
                    .min(u64::from(u32::MAX)) as u32;
                let grant = target.min(allowed);
                if grant > live.rdy_sent {
                    let _ = live.conn.send(Command::Rdy(grant));
                    live.rdy_sent = grant;
                    live.rdy_held = live.rdy_held.max(grant);
                    used = others + u64::from(holding(live));
                }
            }
        }
        let total: u64 = live
            .iter()
            .filter_map(|(a, _)| self.entries[a].live.as_ref())
            .map(|l| u64::from(l.rdy_sent))
            .sum();
        self.shared
            .counters
            .rdy_total
            .store(total, Ordering::Relaxed);
    }

    fn shutdown(self, grace: Duration, done: oneshot::Sender<ShutdownReport>) {
        let deadline = Instant::now() + grace;
        let mut tasks = Vec::new();
        // Keep the drain senders alive until the supervisors finish: a dropped sender reads as
        // "the control task is gone".
        let mut drains = Vec::new();
        for (_, entry) in self.entries {
            let _ = entry.drain.send(Some(deadline));
            tasks.push(entry.task);
            drains.push(entry.drain);
        }
        let shared = self.shared;
        drop(self.msg_tx);
        tokio::spawn(async move {
            let all = futures::future::join_all(tasks);
            let clean = tokio::time::timeout(grace + Duration::from_secs(1), all)
                .await
                .is_ok();
            let requeued_at_deadline =
                shared.counters.requeued_at_deadline.load(Ordering::Relaxed) as usize;
            drop(drains);
            let _ = done.send(ShutdownReport {
                requeued_unseen: 0,
                requeued_at_deadline,
                clean,
            });
        });
    }
}

/// Keeps one nsqd connected: connect, subscribe, serve, and on failure wait and reconnect.
struct Supervisor {
    addr: Arc<str>,
    config: Arc<ConsumerConfig>,
    identify: Arc<Identify>,
    shared: Arc<ConsumerShared>,
    /// To the control task; sends fail harmlessly once it has stopped.
    control: mpsc::UnboundedSender<Control>,
    /// To the [`Consumer`]; once it is closed, messages are dropped and so requeued.
    messages: mpsc::UnboundedSender<Message>,
    hard_stop: CancellationToken,
    /// `Some(deadline)`: drain this connection and stop, requeueing what is unanswered at the
    /// deadline.
    drain: watch::Receiver<Option<Instant>>,
}

/// How a served connection ended.
enum Served {
    /// Drained on request; do not reconnect.
    Drained,
    /// The consumer was dropped.
    Stopped,
}

impl Supervisor {
    async fn run(mut self) {
        let mut attempt: u32 = 0;
        loop {
            if self.hard_stop.is_cancelled() || self.drain.borrow().is_some() {
                return;
            }
            let connected = Connection::connect(
                &self.addr,
                &self.identify,
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
                        Some(self.serve(conn).await)
                    }
                    Err(error) => {
                        self.connect_failed(&error);
                        None
                    }
                },
                Err(error) => {
                    self.connect_failed(&error);
                    None
                }
            };
            match result {
                Some(Ok(Served::Drained | Served::Stopped)) => return,
                Some(Err(_)) | None => {}
            }
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
            tracing::info!(nsqd = %self.addr, attempt, delay_ms = delay.as_millis() as u64, "Reconnecting to nsqd after a delay.");
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

    fn connect_failed(&self, error: &Error) {
        tracing::warn!(nsqd = %self.addr, %error, "Could not connect to nsqd.");
        self.shared.event(ConsumerEvent::ConnectFailed {
            addr: self.addr.to_string(),
            error: error.to_string(),
        });
    }

    /// Runs one subscribed connection until it fails, is drained, or the consumer is dropped.
    async fn serve(&mut self, conn: Connection) -> Result<Served, Error> {
        let max_rdy = conn.settings().max_rdy_count;
        let (reader, write) = conn.into_parts();
        let (handle, commands) = ConnHandle::new(self.addr.clone());
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
            tokio::net::tcp::OwnedReadHalf,
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
                    let frame = match frame {
                        None => return Err(Error::ConnectionClosed { addr: addr.to_string() }),
                        Some(Err(source)) => return Err(Error::Protocol { addr: addr.to_string(), source }),
                        Some(Ok(frame)) => frame,
                    };
                    self.on_frame(frame, handle, &mut close_wait)?;
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

    fn on_frame(
        &self,
        frame: Frame,
        handle: &Arc<ConnHandle>,
        close_wait: &mut bool,
    ) -> Result<(), Error> {
        match frame {
            Frame::Message(raw) => {
                inc(&self.shared.counters.messages_received);
                handle.track(raw.id);
                let max = self.config.max_attempts;
                let attempts = raw.attempts;
                let message = Message::new(raw, handle.clone(), self.shared.clone());
                if max > 0 && attempts > max {
                    let id = message.id().to_string();
                    tracing::warn!(nsqd = %self.addr, %id, attempts, max_attempts = max, "Message exceeded max_attempts; finishing it without handling.");
                    inc(&self.shared.counters.max_attempts_exceeded);
                    self.shared
                        .event(ConsumerEvent::MaxAttemptsExceeded { id, attempts });
                    let _ = message.finish();
                } else if let Err(mpsc::error::SendError(message)) = self.messages.send(message) {
                    // The consumer is shutting down: requeue at once.
                    let _ = message.requeue_without_backoff(Some(Duration::ZERO));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> ConsumerConfig {
        let mut c = ConsumerConfig::new("events", "dedupe");
        c.nsqd_tcp_addresses = vec!["127.0.0.1:4150".into()];
        c
    }

    fn field_of(c: &ConsumerConfig) -> &'static str {
        match c.validate() {
            Err(Error::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_go_nsq() {
        let c = ConsumerConfig::new("t", "c");
        assert_eq!(c.max_in_flight, 1);
        assert_eq!(c.max_attempts, 5);
        assert_eq!(c.default_requeue_delay, Duration::from_secs(90));
        assert_eq!(c.max_requeue_delay, Duration::from_secs(900));
        assert_eq!(c.max_backoff, Duration::from_secs(120));
        assert_eq!(c.lookupd_poll_interval, Duration::from_secs(60));
        assert_eq!(
            c.user_agent,
            concat!("nsq-dedupe/", env!("CARGO_PKG_VERSION"))
        );
        assert!(valid().validate().is_ok());
    }

    #[test]
    fn validation_names_the_setting() {
        let mut c = valid();
        c.topic = "bad topic".into();
        assert_eq!(field_of(&c), "topic");
        let mut c = valid();
        c.channel = "x".repeat(65);
        assert_eq!(field_of(&c), "channel");
        let mut c = valid();
        c.nsqd_tcp_addresses.clear();
        assert_eq!(field_of(&c), "nsqd_tcp_addresses");
        let mut c = valid();
        c.lookupd_http_addresses = vec!["https://lookupd:4161".into()];
        assert_eq!(field_of(&c), "lookupd_http_addresses");
        let mut c = valid();
        c.max_in_flight = 0;
        assert_eq!(field_of(&c), "max_in_flight");
        let mut c = valid();
        c.heartbeat_interval = Duration::from_millis(500);
        assert_eq!(field_of(&c), "heartbeat_interval");
        let mut c = valid();
        c.msg_timeout = Some(Duration::from_millis(999));
        assert_eq!(field_of(&c), "msg_timeout");
    }

    #[test]
    fn names_follow_nsqd_rules() {
        assert!(is_valid_name("a.b_c-1"));
        assert!(is_valid_name("ch#ephemeral"));
        assert!(!is_valid_name("#ephemeral"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a\nCLS"));
        assert!(!is_valid_name(&"x".repeat(65)));
    }

    #[test]
    fn random_unit_stays_in_range() {
        for _ in 0..10_000 {
            let x = random_unit();
            assert!((0.0..1.0).contains(&x), "{x}");
        }
    }
}
