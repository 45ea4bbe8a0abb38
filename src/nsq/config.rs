//! The consumer's settings ([`ConsumerConfig`]): defaults as go-nsq's, validation that names
//! the setting, and the IDENTIFY body they become.

use std::time::Duration;

use super::error::Error;
use super::frame::DEFAULT_MAX_FRAME_SIZE;
use super::identify::{Identify, USER_AGENT};
use super::lookupd;
use super::names::is_valid_name;
use super::transport::Transport;

/// The heartbeat interval asked of nsqd when none is given: go-nsq's.
pub(crate) const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Deliveries of a message before it counts as failing for good: go-nsq's.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u16 = 5;

/// The first handler-failure backoff, doubled per failure: go-nsq's.
pub(crate) const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);

/// The longest handler-failure backoff: go-nsq's.
pub(crate) const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(120);

/// How often nsqlookupd is polled: go-nsq's.
pub(crate) const DEFAULT_LOOKUPD_POLL_INTERVAL: Duration = Duration::from_secs(60);

/// Everything a [`Consumer`](super::Consumer) needs. Build it with [`ConsumerConfig::new`] and adjust fields.
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
    /// Bytes nsqd buffers before writing to us (nsqd accepts 64 B up to its
    /// `--max-output-buffer-size`, 64 KiB; -1 turns buffering off). Defaults to: `None` (nsqd's
    /// default, 16 KiB).
    pub output_buffer_size: Option<i64>,
    /// Percent of the channel's messages nsqd sends this consumer (1-99); 0 sends all.
    /// Defaults to: `0`.
    pub sample_rate: u8,
    /// TLS, compression and AUTH asked of every nsqd. Defaults to: none.
    pub transport: Transport,
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
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            default_requeue_delay: Duration::from_secs(90),
            max_requeue_delay: Duration::from_secs(15 * 60),
            backoff_multiplier: DEFAULT_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            lookupd_poll_interval: DEFAULT_LOOKUPD_POLL_INTERVAL,
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
            output_buffer_size: None,
            sample_rate: 0,
            transport: Transport::default(),
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
        self.transport.validate()?;
        if self.sample_rate > 99 {
            return bad(
                "sample_rate",
                format!("must be 0 (all) to 99 percent, got {}", self.sample_rate),
            );
        }
        if let Some(size) = self.output_buffer_size {
            if size != -1 && size < 64 {
                return bad(
                    "output_buffer_size",
                    format!("nsqd accepts -1 (off) or at least 64 bytes, got {size}"),
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
        // go-nsq's bounds: shorter polls load nsqlookupd for nothing, longer ones find new
        // nsqd too late.
        let poll = self.lookupd_poll_interval;
        if poll < Duration::from_millis(10) || poll > Duration::from_secs(300) {
            return bad(
                "lookupd_poll_interval",
                format!("must be 10ms to 5m (as go-nsq's), got {poll:?}"),
            );
        }
        if self.rdy_redistribute_interval.is_zero() {
            return bad(
                "rdy_redistribute_interval",
                "the redistribute interval must be above zero".into(),
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

    pub(super) fn identify(&self) -> Identify {
        let mut identify = Identify {
            client_id: self.client_id.clone(),
            hostname: self.hostname.clone(),
            user_agent: self.user_agent.clone(),
            feature_negotiation: true,
            heartbeat_interval: self.heartbeat_interval.as_millis() as i64,
            msg_timeout: self.msg_timeout.map_or(0, |t| t.as_millis() as u64),
            output_buffer_size: self.output_buffer_size.unwrap_or(0),
            sample_rate: self.sample_rate,
            output_buffer_timeout: match self.output_buffer_timeout {
                None => 0,
                Some(t) if t.is_zero() => -1,
                Some(t) => i64::try_from(t.as_millis()).unwrap_or(i64::MAX),
            },
            tls_v1: false,
            snappy: false,
            deflate: false,
            deflate_level: 0,
        };
        self.transport.ask(&mut identify);
        identify
    }
}

/// The host name up to its first dot, as NSQ's tools show it.
#[cfg(feature = "sidecar")]
pub(crate) fn short_hostname() -> String {
    hostname().split('.').next().unwrap_or("").to_string()
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
}
