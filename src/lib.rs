//! nsq-dedupe removes duplicate messages from NSQ streams with bounded memory.
//!
//! NSQ delivers at least once, and producers that publish every message to two or more nsqd
//! for resilience make consumers receive each message several times, each copy with its own
//! ID. nsq-dedupe recognises copies by content: a [`Keyer`] turns a body into a [`Digest`],
//! and a [`Store`] remembers recent digests in a fixed amount of memory.
//!
//! # Layout
//!
//! With no feature the crate is the table and what feeds it:
//!
//! - [`dedup`]: the [`Store`] trait, [`Claim`], [`Geometry`], digests and keys, the table file
//!   and its journal.
//! - [`Table`]: the in-process, lock-free, set-associative table.
//! - [`filter_stream`] for plain streams of records; [`filter`] for newline-delimited input.
//! - [`sizing`]: pure functions between slots, catch probability and window.
//! - [`error`]: error types whose messages name the knob to turn; [`wording`]: the
//!   settings a message names, as fields, said as the user gave them.
//!
//! Each feature adds a layer (the binary's default, `cli`, enables them all):
//!
//! - `nsq`: our NSQ TCP client ([`Consumer`], [`Message`], [`Producer`], nsqlookupd; TLS,
//!   snappy, deflate and AUTH in `nsq::Transport`), `tls` (client settings shared by the NSQ
//!   connections and the HTTP client), `http` (the pooled keep-alive HTTPS client, on hyper)
//!   and the `Metrics` counters, which the pipeline updates (the client counts in its own
//!   `ConsumerStats`).
//! - `memcached` and `redis`: the shared stores, `MemcachedStore` and `RedisStore`. With
//!   `nsq` or `redis` comes the crate's own `redact` (URLs, headers and secrets as they may
//!   be printed).
//! - `sidecar` (all of the above, and more): `pipeline` with `Dedupe`, the de-duplicating step
//!   (claim, handle, commit or erase, FIN or REQ); `sink` (the `Handler` trait, the sidecar's
//!   sinks and the dead-letter); `config` (the TOML configuration and its validation into
//!   `Settings`); `serve` (the serve sink, `sink::serve`: the sidecar as an nsqd for any NSQ
//!   consumer); `sidecar` (`run`, the `nsq-dedupe run` service, and `Sidecar` for custom
//!   handlers); the metrics endpoint in Prometheus' text format.
//! - `cli`: the binary's flags, logs, completions, man pages and plots, as private modules
//!   (the binary calls a hidden entry point), so nothing only the binary needs is public.
//!
//! The public items are listed in `docs/public-api.txt`, which a check keeps in step with
//! these docs: an item joins or leaves the API only on purpose.
//!
//! # Example: de-duplicating a stream of records
//!
//! ```
//! use bytes::Bytes;
//! use futures::StreamExt;
//! use nsq_dedupe::{filter_stream, Keyer, Table};
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
#![warn(unreachable_pub, unnameable_types, missing_docs)]

#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod cmd;
#[cfg(feature = "sidecar")]
pub mod config;
#[cfg(any(feature = "nsq", feature = "memcached", feature = "redis"))]
mod decimal;
pub mod dedup;
pub mod error;
pub mod filter;
#[cfg(any(feature = "nsq", feature = "memcached", feature = "redis"))]
mod fold_hash;
#[cfg(feature = "nsq")]
pub(crate) mod http;
#[cfg(feature = "nsq")]
pub mod metrics;
#[cfg(feature = "nsq")]
pub mod nsq;
#[cfg(any(feature = "nsq", feature = "redis"))]
pub(crate) mod percent;
#[cfg(feature = "sidecar")]
pub mod pipeline;
#[cfg(any(feature = "nsq", feature = "redis"))]
pub(crate) mod redact;
#[cfg(feature = "sidecar")]
pub(crate) mod setting;
#[cfg(feature = "sidecar")]
pub mod sidecar;
#[cfg(feature = "sidecar")]
pub mod sink;
pub mod sizing;
mod stream;
#[cfg(feature = "nsq")]
pub mod tls;
pub(crate) mod units;
pub mod wording;

#[cfg(feature = "sidecar")]
pub use config::Settings;
#[cfg(feature = "sidecar")]
pub use dedup::backend::Backend;
pub use dedup::digest::{DigestAlgorithm, DigestKey, KeySpec, Keyer};
#[cfg(any(feature = "memcached", feature = "redis"))]
pub use dedup::fleet::{FleetCounters, FLEET_BUCKETS};
#[cfg(any(feature = "memcached", feature = "redis"))]
pub use dedup::generational::{Descriptor, Generation, Generations, Resized, Shape};
pub use dedup::local::LocalTable;
#[cfg(feature = "memcached")]
pub use dedup::memcached::{MemcachedConfig, MemcachedStore};
#[cfg(feature = "redis")]
pub use dedup::redis::{RedisConfig, RedisPassword, RedisStore};
pub use dedup::table::{Resizing, Table};
pub use dedup::{Claim, Digest, Geometry, NoStore, Store};
#[cfg(feature = "nsq")]
pub use metrics::Metrics;
#[cfg(feature = "nsq")]
pub use nsq::{Consumer, ConsumerConfig, Message, Producer, ProducerConfig};
#[cfg(feature = "sidecar")]
pub use pipeline::Dedupe;
#[cfg(feature = "sidecar")]
pub use sidecar::{run, Sidecar};
#[cfg(feature = "sidecar")]
pub use sink::serve;
pub use stream::filter_stream;

/// The README's examples, compiled and run as doc tests (with no feature too: they use only
/// the table).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's examples (a custom handler), compiled as doc tests.
#[cfg(all(doctest, feature = "sidecar"))]
#[doc = include_str!("../docs/guide.md")]
struct GuideDoctests;

/// The `nsq-dedupe` binary's `main` (`src/main.rs` calls it). Not part of the library's API:
/// the binary's flags and subcommands live in the library only to reach what the library
/// keeps to itself.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub fn binary_main() -> std::process::ExitCode {
    cmd::entry::main()
}
