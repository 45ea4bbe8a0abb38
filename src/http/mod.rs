//! HTTP for the sidecar, on hyper: a pooled keep-alive client with HTTPS (the http sink and
//! nsqlookupd queries) and a small server (the metrics endpoint).
//!
//! - `client`: [`HttpClient`], connections kept alive and reused, `https://` through rustls
//!   with the system's roots plus an optional CA file, a connect and a request time limit;
//!   a URL's user info is sent as basic authentication (`basic_auth`).
//! - `pool`: [`BoundedClient`], for the http sink: per endpoint at most N connections, each
//!   reused request after request, callers beyond the bound waiting; one TLS session cache.
//! - `limit`: how many of the N a pool may hold now, learnt from how fast the endpoint takes
//!   connections (more while connects are fast and requests wait, half on a stalled connect).
//! - `server`: `serve`, answers `GET`/`HEAD` of a few fixed paths.

// Without the sidecar (the `nsq` layer alone), nothing re-exports the client's settings and
// errors: the http sink does (`sink::HttpClientConfig`, `sink::HttpError`).
#![cfg_attr(not(feature = "sidecar"), allow(unreachable_pub))]

mod basic_auth;
mod client;
#[cfg(feature = "sidecar")]
mod limit;
#[cfg(feature = "sidecar")]
mod pool;
#[cfg(feature = "sidecar")]
pub(crate) mod server;

#[cfg(feature = "sidecar")]
pub(crate) use client::check_url;
pub(crate) use client::HttpClient;
pub use client::HttpClientConfig;
#[cfg(feature = "sidecar")]
pub use client::HttpError;
#[cfg(feature = "sidecar")]
pub(crate) use client::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
#[cfg(feature = "sidecar")]
pub(crate) use pool::BoundedClient;
#[cfg(feature = "sidecar")]
pub(crate) use server::serve;
