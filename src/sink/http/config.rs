//! The http sink's settings, with their defaults written once: the `[sink]` settings table
//! (`config::RawSink`) takes these constants as its entries' defaults, which the file, the
//! flags, `--help` and the docs show.

use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::Uri;
use serde::Deserialize;

use crate::http::HttpClientConfig;

/// The content type sent when none is configured, as `nsq_to_http`.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// The most requests in flight, and connections open, per endpoint when none is configured:
/// `nsq_to_http`'s `--n`. The pool opens them as the load needs and the endpoint takes them
/// (`crate::http::BoundedClient`).
pub const DEFAULT_CONCURRENCY: usize = 100;

/// The header carrying each request's idempotency key, the IETF httpapi draft's name.
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Records per request when none is configured: each body POSTed as it is.
pub(crate) const DEFAULT_BATCH_SIZE: usize = 1;

/// How long a batch waits to fill before it is sent as it is.
pub const DEFAULT_BATCH_TIMEOUT: Duration = Duration::from_millis(100);

/// How records are spread over several URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HttpMode {
    /// Each record to one URL in turn; on a retryable failure, the next URL.
    #[default]
    RoundRobin,
    /// Each record to every URL; done only when every URL took it.
    Multicast,
}

impl HttpMode {
    /// Every mode with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, HttpMode); 2] = [
        ("round-robin", HttpMode::RoundRobin),
        ("multicast", HttpMode::Multicast),
    ];
}

/// How the records of a batch make one request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchFormat {
    /// Each record followed by `\n`: nsqd's `/mpub` body, and NDJSON. A record holding a `\n`,
    /// or an empty one, cannot be framed.
    #[default]
    Lines,
    /// A JSON array of the records, each of which must be one JSON value.
    JsonArray,
}

impl BatchFormat {
    /// Every format with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, BatchFormat); 2] = [
        ("lines", BatchFormat::Lines),
        ("json-array", BatchFormat::JsonArray),
    ];
}

/// Everything the http sink is built from. `Debug` shows no secret: URLs lose their user info
/// and query values, headers their values (`crate::redact`).
#[derive(Clone, PartialEq)]
pub struct HttpSinkConfig {
    /// The URLs; at least one.
    pub urls: Vec<Uri>,
    /// How records are spread over them. Defaults to: round-robin.
    pub mode: HttpMode,
    /// Headers of every request, `Content-Type` among them (see [`with_content_type`]).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Time limits and trusted roots.
    pub client: HttpClientConfig,
    /// The most requests in flight, and connections open, per endpoint; more wait. Fewer
    /// while connects to the endpoint stall. Defaults to: [`DEFAULT_CONCURRENCY`].
    pub concurrency: usize,
    /// The header carrying the idempotency key, or none. Defaults to:
    /// [`DEFAULT_IDEMPOTENCY_HEADER`].
    pub idempotency_header: Option<HeaderName>,
    /// Records per request. Defaults to: 1 (each body POSTed as it is, unframed).
    pub batch_size: usize,
    /// How long a batch that is not full waits for more records: those of single
    /// [`handle`](crate::sink::Handler::handle) calls, and those a burst
    /// ([`handle_batch`](crate::sink::Handler::handle_batch)) leaves after its full batches,
    /// which are sent at once. Defaults to: [`DEFAULT_BATCH_TIMEOUT`].
    pub batch_timeout: Duration,
    /// How a batch's records are framed. Defaults to: lines.
    pub batch_format: BatchFormat,
}

impl std::fmt::Debug for HttpSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSinkConfig")
            .field("urls", &redacted_urls(&self.urls))
            .field("mode", &self.mode)
            .field("headers", &crate::redact::Headers(&self.headers))
            .field("client", &self.client)
            .field("concurrency", &self.concurrency)
            .field("idempotency_header", &self.idempotency_header)
            .field("batch_size", &self.batch_size)
            .field("batch_timeout", &self.batch_timeout)
            .field("batch_format", &self.batch_format)
            .finish()
    }
}

/// `urls` as they may be printed ([`crate::redact::url`]).
pub(super) fn redacted_urls(urls: &[Uri]) -> Vec<String> {
    urls.iter()
        .map(|url| crate::redact::url(&url.to_string()))
        .collect()
}

impl HttpSinkConfig {
    /// POSTs to `urls` with every other setting at its default.
    pub fn new(urls: Vec<Uri>) -> Self {
        HttpSinkConfig {
            urls,
            mode: HttpMode::default(),
            headers: with_content_type(DEFAULT_CONTENT_TYPE, Vec::new())
                .expect("the default content type is a valid header value"),
            client: HttpClientConfig::default(),
            concurrency: DEFAULT_CONCURRENCY,
            idempotency_header: Some(HeaderName::from_static("idempotency-key")),
            batch_size: DEFAULT_BATCH_SIZE,
            batch_timeout: DEFAULT_BATCH_TIMEOUT,
            batch_format: BatchFormat::default(),
        }
    }
}

/// The `Content-Type` header for `content_type`, put in front of `headers` unless they set
/// one themselves.
///
/// # Errors
///
/// When `content_type` is not a valid header value.
pub fn with_content_type(
    content_type: &str,
    mut headers: Vec<(HeaderName, HeaderValue)>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    if !headers.iter().any(|(name, _)| name == CONTENT_TYPE) {
        let value = HeaderValue::from_str(content_type)
            .map_err(|_| format!("{content_type:?} is not a valid header value"))?;
        headers.insert(0, (CONTENT_TYPE, value));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_idempotency_header_is_the_named_one() {
        let config = HttpSinkConfig::new(vec!["http://127.0.0.1/".parse().unwrap()]);
        assert_eq!(
            config.idempotency_header,
            Some(HeaderName::from_bytes(DEFAULT_IDEMPOTENCY_HEADER.as_bytes()).unwrap())
        );
    }
}
