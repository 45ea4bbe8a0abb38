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

mod basic_auth;
mod client;
mod limit;
mod pool;
#[cfg(feature = "sidecar")]
pub(crate) mod server;

pub use client::{check_url, HttpClient, HttpClientConfig, HttpError};
pub use pool::{BoundedClient, HttpAnswer};
#[cfg(feature = "sidecar")]
pub(crate) use server::serve;
