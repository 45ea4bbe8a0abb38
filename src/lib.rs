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
//! - [`units`]: sizes, durations and counts as people write and read them.
//! - `error`: error types whose messages name the knob to turn.
//! - [`nsq`]: our NSQ TCP client: [`Consumer`], [`Message`], [`Producer`], nsqlookupd; TLS,
//!   snappy, deflate and AUTH ([`nsq::Transport`]).
//! - [`tls`]: TLS client settings shared by the NSQ connections and the HTTP client.
//! - [`pipeline`]: [`Dedupe`], the de-duplicating step (claim, handle, commit or erase, FIN or
//!   REQ), and [`filter_stream`](pipeline::filter_stream) for plain streams of records.
//! - [`sink`]: the [`Handler`](sink::Handler) trait, the sidecar's sinks and the dead-letter.
//! - [`config`]: the TOML configuration and its validation into [`Settings`].
//! - [`redact`]: URLs, headers and secrets as they may be printed.
//! - [`sidecar`]: [`run`], the `nsq-dedupe run` service, and [`Sidecar`] for custom handlers.
//! - [`metrics`]: counters in Prometheus' text format; [`http`]: the pooled keep-alive HTTPS
//!   client (http sink, nsqlookupd) and the metrics server, on hyper.
//!
//! # Example: de-duplicating a stream of records
//!
//! ```
//! use bytes::Bytes;
//! use futures::StreamExt;
//! use nsq_dedupe::{pipeline::filter_stream, Keyer, Table};
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! runtime.block_on(async {
//!     let table = std::sync::Arc::new(Table::with_slots(1 << 16, 8).unwrap());
//!     let keyer = Keyer::new("json:/id".parse().unwrap(), Default::default());
//!     let records = futures::stream::iter([
//!         Bytes::from_static(br#"{"id":1,"v":"a"}"#),
//!         Bytes::from_static(br#"{"id":1,"v":"a (copy)"}"#),
//!         Bytes::from_static(br#"{"id":2,"v":"b"}"#),
//!     ]);
//!     let unique: Vec<Bytes> = filter_stream(table, keyer, records).collect().await;
//!     assert_eq!(unique.len(), 2);
//! });
//! ```
#![warn(unreachable_pub, missing_docs)]

pub mod config;
pub mod dedup;
pub mod error;
pub mod filter;
pub mod http;
pub mod metrics;
pub mod nsq;
pub mod percent;
pub mod pipeline;
pub mod redact;
pub mod sidecar;
pub mod sink;
pub mod sizing;
pub mod tls;
pub mod units;

pub use config::Settings;
pub use dedup::backend::Backend;
pub use dedup::digest::{DigestAlgorithm, DigestKey, KeySpec, Keyer};
pub use dedup::memcached::{
    MemcachedConfig, MemcachedStore, DEFAULT_FLEET_INTERVAL, FLEET_BUCKETS,
};
pub use dedup::redis::{RedisConfig, RedisPassword, RedisStore};
pub use dedup::table::Table;
pub use dedup::{Claim, Digest, Geometry, NoStore, Store};
pub use metrics::Metrics;
pub use nsq::{Consumer, ConsumerConfig, Message, Producer, ProducerConfig};
pub use pipeline::Dedupe;
pub use sidecar::{run, Sidecar};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's examples (a custom handler), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
struct GuideDoctests;
