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
//! - [`connection`]: one connection's handshake (magic, IDENTIFY, SUB) and its writer task.
//! - [`Consumer`] and [`Message`]: many nsqd, RDY flow control, reconnects, backoff, shutdown.
//! - [`Producer`]: PUB, MPUB and DPUB with answers matched in order.
//! - [`lookupd`]: `GET /lookup?topic=` over plain HTTP/1.1.
//! - [`Error`]: the error type.

pub mod connection;
mod consumer;
mod error;
pub mod frame;
pub mod lookupd;
mod message;
mod producer;

pub(crate) use consumer::is_valid_name;
pub use consumer::{
    Consumer, ConsumerConfig, ConsumerEvent, ConsumerStats, ShutdownReport, RDY_SETTLE,
};
pub use error::Error;
pub use frame::{Frame, FrameCodec, MessageId};
pub use message::Message;
pub use producer::{Producer, ProducerConfig};
