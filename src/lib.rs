//! nsq-dedupe removes duplicate messages from NSQ streams with bounded memory.
//!
//! NSQ delivers at least once, and producers that publish every message to two or more nsqd
//! for resilience make consumers receive each message several times, each copy with its own
//! ID. nsq-dedupe recognises copies by content: a [`Keyer`] turns a body into a [`Digest`],
//! and a [`Store`] remembers recent digests in a fixed amount of memory.
//!
//! # Layout
//!
//! - [`dedup`]: the [`Store`] trait, [`Claim`], [`Geometry`], digests and keys.
//! - [`Table`]: the in-process, lock-free, set-associative table.
//! - [`sizing`]: pure functions between slots, catch probability and window.
//! - `cmd`: the `size` and `filter` subcommands; `cli`: their flags.
//! - `error`: error types whose messages name the knob to turn.
//! - [`nsq`]: our NSQ TCP client: [`Consumer`], [`Message`], [`Producer`], nsqlookupd.
#![warn(unreachable_pub, missing_docs)]

pub mod cli;
mod cmd;
pub mod dedup;
pub mod error;
pub mod filter;
pub mod nsq;
pub mod sizing;

pub use dedup::digest::{DigestAlgorithm, KeySpec, Keyer};
pub use dedup::memcached::{MemcachedConfig, MemcachedStore};
pub use dedup::table::Table;
pub use dedup::{Claim, Digest, Geometry, NoStore, Store};
pub use nsq::{Consumer, ConsumerConfig, Message, Producer, ProducerConfig};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
