//! The NSQ layer: our own client for NSQ's TCP protocol V2 and a minimal nsqlookupd client.
//!
//! Built on tokio, `bytes` and `tokio-util` codecs, because the acknowledgement semantics are
//! what a de-duplicator lives on: every message is finished or requeued exactly once, FIN/REQ
//! go out as soon as they are asked for, a non-fatal error frame never costs the connection, and
//! nothing is left in flight unknowingly at shutdown.
//!
//! # Layout
//!
//! - [`frame`]: frames from nsqd and commands to it, as a bounded, panic-free codec.
//! - `connection`: one open connection (SUB, frames in, the writer task out); `identify`:
//!   what IDENTIFY says and what nsqd answers.
//! - `transport`: opening it: magic, IDENTIFY, then TLS (`crate::tls`), snappy (`snappy`) or
//!   deflate (`deflate`) as async stream adapters (`stream`), and AUTH ([`AuthSecret`]); the
//!   answers no retry can change are sorted out by `refusal` (with [`Role`]).
//! - [`Consumer`] and [`Message`]: many nsqd, RDY flow control, reconnects, backoff, shutdown.
//!   Split as go-nsq splits it: `config` ([`ConsumerConfig`], IDENTIFY), `consumer` (the public
//!   handle), `control` (the task that owns connections, RDY, backoff and lookupd polls),
//!   `backoff` (handler-failure and outage backoff as a pure state machine), `rdy` (the RDY
//!   budget as pure functions), `supervisor` (one task per nsqd), `shared` (state
//!   the tasks share), `events` (events, counters, shutdown report), `delegate` (what a message
//!   calls back through), `names` (nsqd's name rule) and `jitter`.
//! - [`Producer`]: PUB, MPUB and DPUB with answers matched in order.
//! - `lookupd`: `GET /lookup?topic=` over plain HTTP/1.1.
//! - [`Error`]: the error type.

mod backoff;
mod config;
pub(crate) mod connection;
mod consumer;
mod control;
mod deflate;
mod delegate;
mod error;
mod events;
pub mod frame;
mod identify;
mod jitter;
pub(crate) mod lookupd;
mod message;
mod names;
mod producer;
mod rdy;
mod refusal;
mod secret;
mod shared;
mod snappy;
mod stream;
mod supervisor;
mod transport;

#[cfg(feature = "sidecar")]
pub(crate) use config::short_hostname;
pub use config::ConsumerConfig;
#[cfg(feature = "sidecar")]
pub(crate) use config::{
    DEFAULT_BACKOFF, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LOOKUPD_POLL_INTERVAL,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF,
};
pub use consumer::{ConnectionCount, Consumer};
pub use error::Error;
pub use events::{ConsumerEvent, ConsumerStats, ShutdownReport};
pub use frame::{Frame, FrameCodec, MessageId};
pub use message::{Answer, Message};
#[cfg(feature = "sidecar")]
pub(crate) use names::is_valid_name;
pub use producer::{Producer, ProducerConfig};
pub use refusal::Role;
pub use secret::AuthSecret;
#[cfg(feature = "sidecar")]
pub(crate) use transport::DEFAULT_DEFLATE_LEVEL;
pub use transport::{Compression, Transport};
