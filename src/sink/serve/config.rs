//! The serve endpoint's settings ([`ServeConfig`]), each default written once as a constant.
//!
//! The limits a consumer negotiates in IDENTIFY (heartbeat interval, message timeout) are
//! checked against these as nsqd checks them against its flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::auth::ServeSecret;

/// The served TCP port: loopback, nsqd's port plus 100. Defaults to: `127.0.0.1:4250`.
pub const DEFAULT_TCP_ADDRESS: &str = "127.0.0.1:4250";
/// The served HTTP port (`/ping`, `/lookup`, `/stats`). Defaults to: `127.0.0.1:4251`.
pub const DEFAULT_HTTP_ADDRESS: &str = "127.0.0.1:4251";
/// A message not answered by its consumer within this is taken back (nsqd's `--msg-timeout`).
/// Defaults to: 60 s.
pub const DEFAULT_MSG_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest message timeout a consumer may ask for in IDENTIFY, and the longest a TOUCHed
/// message stays out (nsqd's `--max-msg-timeout`). Defaults to: 15 min.
pub const DEFAULT_MAX_MSG_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The heartbeat interval before IDENTIFY changes it (nsqd: `--client-timeout` / 2).
/// Defaults to: 30 s.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// The longest heartbeat interval IDENTIFY may ask for (nsqd's `--max-heartbeat-interval`).
/// Defaults to: 60 s.
pub const DEFAULT_MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);
/// The largest RDY a consumer may send (nsqd's `--max-rdy-count`). Defaults to: 2500.
pub const DEFAULT_MAX_RDY_COUNT: u32 = 2500;
/// Consumers connected at once; further connections are closed at once. Defaults to: 64.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// The largest IDENTIFY or AUTH body read. nsqd allows its `--max-body-size` (5 MiB); an
/// IDENTIFY is a few hundred bytes. Defaults to: 64 KiB.
pub const DEFAULT_MAX_BODY_SIZE: usize = 64 * 1024;
/// The longest command line read (nsqd reads lines through a 16 KiB buffer).
/// Defaults to: 16 KiB.
pub(crate) const DEFAULT_MAX_LINE_SIZE: usize = 16 * 1024;
/// The longest REQ delay; longer ones are shortened to it (nsqd's `--max-req-timeout`).
/// Defaults to: 1 h.
pub const DEFAULT_MAX_REQ_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Commands a connection may send before SUB (IDENTIFY, AUTH, NOP): a client that only
/// talks holds no connection slot for ever. Defaults to: 64.
pub(crate) const DEFAULT_MAX_COMMANDS_BEFORE_SUB: u32 = 64;
/// What IDENTIFY answers for `output_buffer_size` when the consumer leaves it to us (nsqd's
/// default). Messages are written as soon as they are handed out, whatever it says.
pub(crate) const DEFAULT_OUTPUT_BUFFER_SIZE: i64 = 16 * 1024;
/// What IDENTIFY answers for `output_buffer_timeout`, in milliseconds (nsqd's default).
pub(crate) const DEFAULT_OUTPUT_BUFFER_TIMEOUT_MS: i64 = 250;
/// How long a connection waits after a read before it reads again, while its consumer holds
/// at least [`GATHER_MIN_HELD`] messages: a consumer such as go-nsq writes each FIN on its
/// own, and reading each as it comes costs a wake-up of the endpoint per message. Waiting
/// gathers them into one read; the consumer still has what it holds to work on, so it is
/// not kept waiting, but its answers reach the pipeline up to this much later. nsqd makes the
/// same trade on its writes (`output_buffer_timeout`, 250 ms).
pub(crate) const GATHER_WINDOW: Duration = Duration::from_millis(1);
/// The fewest messages a consumer holds for its connection to gather its answers: one that
/// holds fewer reads each at once, so a consumer that takes one message at a time is never
/// slowed, and none is held to fewer than this many messages per [`GATHER_WINDOW`].
pub(crate) const GATHER_MIN_HELD: u64 = 64;
/// How often messages in flight to consumers are checked for their timeout.
/// Defaults to: 100 ms.
pub const DEFAULT_SCAN_INTERVAL: Duration = Duration::from_millis(100);

/// TLS offered on the served port, as nsqd offers it: a consumer asks with `tls_v1` in
/// IDENTIFY and the handshake follows the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeTls {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// Refuse every command but IDENTIFY before the upgrade (nsqd's `--tls-required`).
    /// Defaults to: `false`.
    pub required: bool,
}

/// Everything the serve endpoint needs. [`ServeConfig::new`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// The topic consumers SUB to; anything else is refused with `E_BAD_TOPIC`.
    pub topic: String,
    /// The channel consumers SUB to; anything else is refused with `E_BAD_CHANNEL`.
    pub channel: String,
    /// Where consumers connect. Defaults to: [`DEFAULT_TCP_ADDRESS`].
    pub tcp_address: SocketAddr,
    /// Where `/ping`, `/lookup` and `/stats` answer; `None` serves no HTTP.
    /// Defaults to: `None` (the sidecar's flag defaults to [`DEFAULT_HTTP_ADDRESS`]).
    pub http_address: Option<SocketAddr>,
    /// Defaults to: [`DEFAULT_MSG_TIMEOUT`].
    pub msg_timeout: Duration,
    /// Defaults to: [`DEFAULT_MAX_MSG_TIMEOUT`].
    pub max_msg_timeout: Duration,
    /// Defaults to: [`DEFAULT_HEARTBEAT_INTERVAL`].
    pub heartbeat_interval: Duration,
    /// Defaults to: [`DEFAULT_MAX_HEARTBEAT_INTERVAL`].
    pub max_heartbeat_interval: Duration,
    /// Defaults to: [`DEFAULT_MAX_RDY_COUNT`].
    pub max_rdy_count: u32,
    /// Defaults to: [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Defaults to: [`DEFAULT_MAX_BODY_SIZE`].
    pub max_body_size: usize,
    /// Defaults to: [`DEFAULT_MAX_REQ_TIMEOUT`].
    pub max_req_timeout: Duration,
    /// Defaults to: none.
    pub tls: Option<ServeTls>,
    /// The secret AUTH must carry; with it, IDENTIFY answers `auth_required: true` and SUB
    /// needs AUTH first. Defaults to: none.
    pub auth_secret: Option<ServeSecret>,
    /// Defaults to: [`DEFAULT_SCAN_INTERVAL`].
    pub scan_interval: Duration,
}

impl ServeConfig {
    /// Serves `topic`/`channel` with the documented defaults.
    pub fn new(topic: impl Into<String>, channel: impl Into<String>) -> Self {
        ServeConfig {
            topic: topic.into(),
            channel: channel.into(),
            tcp_address: DEFAULT_TCP_ADDRESS.parse().expect("a valid address"),
            http_address: None,
            msg_timeout: DEFAULT_MSG_TIMEOUT,
            max_msg_timeout: DEFAULT_MAX_MSG_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_heartbeat_interval: DEFAULT_MAX_HEARTBEAT_INTERVAL,
            max_rdy_count: DEFAULT_MAX_RDY_COUNT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_body_size: DEFAULT_MAX_BODY_SIZE,
            max_req_timeout: DEFAULT_MAX_REQ_TIMEOUT,
            tls: None,
            auth_secret: None,
            scan_interval: DEFAULT_SCAN_INTERVAL,
        }
    }

    /// Checks the settings, naming the first one that is wrong.
    ///
    /// # Errors
    ///
    /// [`ServeError::Config`](super::ServeError::Config) naming the setting.
    pub fn validate(&self) -> Result<(), super::ServeError> {
        let bad = |field: &'static str, value: String, reason: String| {
            Err(super::ServeError::Config {
                field,
                value,
                reason,
            })
        };
        let duration = |d: Duration| crate::units::format_duration(d);
        for (field, name) in [("topic", &self.topic), ("channel", &self.channel)] {
            if !crate::nsq::is_valid_name(name) {
                return bad(field, format!("{name:?}"), format!("not a valid NSQ {field} name (1-64 of [.a-zA-Z0-9_-], optionally ending in #ephemeral)"));
            }
        }
        if self.max_msg_timeout < Duration::from_secs(1) {
            return bad(
                "max_msg_timeout",
                duration(self.max_msg_timeout),
                "must be at least 1s".into(),
            );
        }
        if self.msg_timeout < Duration::from_secs(1) || self.msg_timeout > self.max_msg_timeout {
            return bad(
                "msg_timeout",
                duration(self.msg_timeout),
                format!(
                    "must be from 1s to `max_msg_timeout`, {}",
                    duration(self.max_msg_timeout)
                ),
            );
        }
        let hb = self.heartbeat_interval;
        if hb < Duration::from_secs(1) || hb > self.max_heartbeat_interval {
            return bad(
                "heartbeat_interval",
                duration(hb),
                format!(
                    "must be from 1s to {}, the longest heartbeat interval a consumer may ask for",
                    duration(self.max_heartbeat_interval)
                ),
            );
        }
        if self.max_rdy_count == 0 {
            return bad("max_rdy_count", "0".into(), "must be at least 1".into());
        }
        if self.max_connections == 0 {
            return bad("max_connections", "0".into(), "must be at least 1".into());
        }
        if self.max_body_size < 1024 {
            return bad(
                "max_body_size",
                self.max_body_size.to_string(),
                "must be at least 1024 bytes".into(),
            );
        }
        if self.scan_interval.is_zero() {
            return bad("scan_interval", "0s".into(), "must be above zero".into());
        }
        Ok(())
    }
}
