//! What a connection tells nsqd about itself in IDENTIFY, and what nsqd answers.

use serde::{Deserialize, Serialize};

/// The user agent we announce: `nsq-dedupe/<version>`.
pub(crate) const USER_AGENT: &str = concat!("nsq-dedupe/", env!("CARGO_PKG_VERSION"));

/// What we tell nsqd about ourselves in IDENTIFY.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Identify {
    /// Shown in nsqd's stats. Defaults to the short host name.
    pub client_id: String,
    /// Our host name.
    pub hostname: String,
    /// Defaults to [`USER_AGENT`].
    pub user_agent: String,
    /// Always `true`: we want nsqd's settings back as JSON.
    pub feature_negotiation: bool,
    /// Milliseconds between heartbeats; nsqd accepts 1000..=60000 (or -1 to disable, which
    /// forbids SUB).
    pub heartbeat_interval: i64,
    /// Milliseconds before nsqd redelivers an unfinished message; 0 keeps nsqd's default.
    pub msg_timeout: u64,
    /// Asks for TLS ([`Transport`](super::Transport) fills in the upgrades).
    pub tls_v1: bool,
    /// Asks for snappy compression.
    pub snappy: bool,
    /// Asks for deflate compression.
    pub deflate: bool,
    /// The deflate level asked for (nsqd caps it at its `--max-deflate-level`).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub deflate_level: u32,
    /// Bytes nsqd buffers before writing to us; 0 keeps nsqd's default.
    #[serde(skip_serializing_if = "is_zero")]
    pub output_buffer_size: i64,
    /// Percent of messages nsqd sends this client; 0 sends all.
    #[serde(skip_serializing_if = "is_zero_u8")]
    pub sample_rate: u8,
    /// Milliseconds nsqd waits before flushing its buffer; 0 keeps nsqd's default, -1 turns
    /// buffering off.
    #[serde(skip_serializing_if = "is_zero")]
    pub output_buffer_timeout: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

/// nsqd's answer to IDENTIFY under feature negotiation. Missing fields take nsqd's defaults.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub(crate) struct IdentifyResponse {
    /// The largest RDY nsqd accepts (`--max-rdy-count`); above it is a fatal `E_INVALID`.
    pub max_rdy_count: u32,
    /// nsqd's version.
    pub version: String,
    /// The largest msg_timeout nsqd accepts, in milliseconds.
    pub max_msg_timeout: u64,
    /// The msg_timeout in force for this connection, in milliseconds.
    pub msg_timeout: u64,
    /// Whether nsqd wants AUTH before SUB or PUB.
    pub auth_required: bool,
    /// Whether nsqd agreed to TLS.
    pub tls_v1: bool,
    /// Whether nsqd agreed to deflate.
    pub deflate: bool,
    /// The deflate level nsqd chose (ours, capped by its maximum).
    pub deflate_level: u32,
    /// nsqd's `--max-deflate-level`.
    pub max_deflate_level: u32,
    /// Whether nsqd agreed to snappy.
    pub snappy: bool,
}

impl Default for IdentifyResponse {
    fn default() -> Self {
        IdentifyResponse {
            max_rdy_count: 2500,
            version: String::new(),
            max_msg_timeout: 15 * 60 * 1000,
            msg_timeout: 60_000,
            auth_required: false,
            tls_v1: false,
            deflate: false,
            deflate_level: 6,
            max_deflate_level: 6,
            snappy: false,
        }
    }
}
