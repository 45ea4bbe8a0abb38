//! The `http` sink: POSTs each unique body to one or more URLs, as `nsq_to_http` does, over a
//! bounded pool of keep-alive connections per endpoint, opened as the load needs and the
//! endpoint takes them, with HTTPS.
//!
//! Status rules: 2xx is success; 5xx, 408, 429, timeouts and connection errors are retried
//! (the message is requeued; after a 429 or 503 with `Retry-After`, no sooner than it says);
//! any other status (4xx, and 1xx/3xx, which are not followed) sends the message to the
//! dead-letter. Every request carries an idempotency key (see [`HttpSink`]). A burst of
//! records is sent at once, one request per record or, with a batch size above 1, one per
//! batch cut from the burst ([`batch`]); each record is answered with its request's outcome.
//!
//! - [`config`]: [`HttpSinkConfig`] and the defaults.
//! - [`batch`]: gathering and framing batches.
//! - `settings`: its keys of `[sink]`, validated into [`HttpSinkConfig`]; its summary and
//!   build.

mod batch;
mod config;
pub(super) mod settings;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Method, StatusCode, Uri};

pub(crate) use config::DEFAULT_BATCH_SIZE;
pub use config::{
    with_content_type, BatchFormat, HttpMode, HttpSinkConfig, DEFAULT_BATCH_TIMEOUT,
    DEFAULT_CONCURRENCY, DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER,
};
pub(crate) use settings::sink_keys;
pub use settings::OneOrMany;

use super::{BuiltIn, Handler, HandlerError};
use crate::http::{BoundedClient, HttpError};
use batch::BatchPoster;

/// POSTs each body, or each batch, to its URLs with fixed headers and an idempotency key.
/// `Debug` shows no secret.
///
/// The key is the XXH3-128 digest of the body, in hex; for a batch, the digest of its records'
/// digests. A retry of a record alone carries the same key, so a receiver can drop the copy
/// that a timed-out request it did take makes.
#[derive(Debug)]
pub struct HttpSink {
    poster: Arc<Poster>,
    /// Present with a batch size above 1.
    batches: Option<BatchPoster>,
}

impl HttpSink {
    /// A sink built from `config`.
    ///
    /// # Errors
    ///
    /// [`HttpError::RootCaFile`] when the client's CA file is unusable.
    ///
    /// # Panics
    ///
    /// When `config.urls` is empty or `config.concurrency` is 0 (the configuration rules both
    /// out), or outside a Tokio runtime.
    pub fn new(config: &HttpSinkConfig) -> Result<Self, HttpError> {
        assert!(!config.urls.is_empty(), "the http sink needs a URL");
        let poster = Arc::new(Poster {
            client: BoundedClient::new(&config.urls, &config.client, config.concurrency)?,
            urls: config.urls.clone(),
            mode: config.mode,
            headers: config.headers.clone(),
            idempotency_header: config.idempotency_header.clone(),
            next: AtomicUsize::new(0),
        });
        let batches = (config.batch_size > 1).then(|| {
            BatchPoster::start(
                Arc::clone(&poster),
                config.batch_size,
                config.batch_timeout,
                config.batch_format,
            )
        });
        Ok(HttpSink { poster, batches })
    }
}

impl Handler for HttpSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        match &self.batches {
            Some(batches) => batches.handle(body).await,
            None => {
                let key = digest(&body);
                self.poster.deliver(body, key).await
            }
        }
    }

    /// With a batch size of 1, every body is POSTed at once (the pool bounds how many are
    /// sent together); above 1, the burst is cut into batches of that size, sent at once, and
    /// the records left over wait (up to the batch timeout) to fill a batch with the next.
    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        match &self.batches {
            Some(batches) => batches.handle_batch(bodies).await,
            None => {
                let posts = bodies.into_iter().map(|body| {
                    let key = digest(&body);
                    self.poster.deliver(body, key)
                });
                futures::future::join_all(posts).await
            }
        }
    }

    fn handles_batches(&self) -> bool {
        true
    }
}

impl BuiltIn for HttpSink {}

/// Sends request bodies to the URLs by the mode, and judges the answers.
struct Poster {
    client: BoundedClient,
    urls: Vec<Uri>,
    mode: HttpMode,
    headers: Vec<(HeaderName, HeaderValue)>,
    idempotency_header: Option<HeaderName>,
    /// The round-robin cursor.
    next: AtomicUsize,
}

impl std::fmt::Debug for Poster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poster")
            .field("urls", &config::redacted_urls(&self.urls))
            .field("mode", &self.mode)
            .field("headers", &crate::redact::Headers(&self.headers))
            .field("idempotency_header", &self.idempotency_header)
            .finish_non_exhaustive()
    }
}

impl Poster {
    /// Delivers one request body, whose idempotency key is `key`, by the mode.
    async fn deliver(&self, body: Bytes, key: u128) -> Result<(), HandlerError> {
        let mut headers = self.headers.clone();
        if let Some(name) = &self.idempotency_header {
            let value = HeaderValue::from_str(&format!("{key:032x}"))
                .expect("hex digits are a valid header value");
            headers.push((name.clone(), value));
        }
        match self.mode {
            HttpMode::RoundRobin => {
                let n = self.urls.len();
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let mut last = None;
                for k in 0..n {
                    let url = &self.urls[(start + k) % n];
                    match self.post(url, &headers, body.clone()).await {
                        Ok(()) => return Ok(()),
                        // A refusal of the record itself would be the same elsewhere.
                        Err(reject @ HandlerError::Reject(_)) => return Err(reject),
                        Err(retry) => last = Some(retry),
                    }
                }
                Err(last.unwrap_or_else(|| HandlerError::Retry("no URL to POST to".into())))
            }
            HttpMode::Multicast => {
                let posts = self
                    .urls
                    .iter()
                    .map(|url| self.post(url, &headers, body.clone()));
                let results = futures::future::join_all(posts).await;
                // Any retryable failure requeues the message: the URLs that took it get it
                // again on the retry (a duplicate downstream, never a loss). Without one, a
                // refusal sends it to the dead-letter.
                if let Some(retry) = results
                    .iter()
                    .filter_map(|r| r.as_ref().err())
                    .filter(|e| !matches!(e, HandlerError::Reject(_)))
                    .max_by_key(|e| e.retry_after())
                {
                    return Err(retry.clone());
                }
                results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
            }
        }
    }

    /// One POST, judged by the status rules.
    async fn post(
        &self,
        url: &Uri,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Result<(), HandlerError> {
        match self.client.send(Method::POST, url, headers, body).await {
            Ok(answer) => judge(url, answer.status, &answer.headers, SystemTime::now()),
            Err(error) => Err(HandlerError::Retry(error.to_string())),
        }
    }
}

/// The status rules, for an answer from `url` read at `now`.
fn judge(
    url: &Uri,
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<(), HandlerError> {
    if status.is_success() {
        return Ok(());
    }
    let reason = format!(
        "{} answered HTTP {status}",
        crate::redact::url(&url.to_string())
    );
    if matches!(status.as_u16(), 429 | 503) {
        if let Some(after) = headers.get(RETRY_AFTER).and_then(|v| retry_after(v, now)) {
            return Err(HandlerError::RetryAfter { reason, after });
        }
    }
    if status.is_server_error() || matches!(status.as_u16(), 408 | 429) {
        Err(HandlerError::Retry(reason))
    } else {
        Err(HandlerError::Reject(reason))
    }
}

/// A `Retry-After` value, delay-seconds or an HTTP date, as a delay from `now`; `None` when it
/// is neither (RFC 9110, section 10.2.3).
fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// The digest an idempotency key is made of.
fn digest(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(status: u16, retry_after: Option<&'static str>) -> Result<(), HandlerError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
        }
        let now = httpdate::parse_http_date("Tue, 24 Nov 2026 12:00:00 GMT").unwrap();
        judge(
            &"http://127.0.0.1/in".parse().unwrap(),
            StatusCode::from_u16(status).unwrap(),
            &headers,
            now,
        )
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date() {
        assert_eq!(
            judged(429, Some("7")).unwrap_err().retry_after(),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            judged(503, Some("Tue, 24 Nov 2026 12:01:30 GMT"))
                .unwrap_err()
                .retry_after(),
            Some(Duration::from_secs(90))
        );
        // A date already past: retry at once (after the usual backoff).
        assert_eq!(
            judged(503, Some("Tue, 24 Nov 2026 11:00:00 GMT"))
                .unwrap_err()
                .retry_after(),
            Some(Duration::ZERO)
        );
        // Unreadable, or on a status that does not define it: the usual retry.
        assert_eq!(
            judged(429, Some("soon")),
            Err(HandlerError::Retry(
                "http://127.0.0.1/in answered HTTP 429 Too Many Requests".into()
            ))
        );
        assert_eq!(judged(500, Some("5")).unwrap_err().retry_after(), None);
    }

    #[test]
    fn statuses_are_judged() {
        assert_eq!(judged(204, None), Ok(()));
        assert!(matches!(judged(408, None), Err(HandlerError::Retry(_))));
        assert!(matches!(judged(502, None), Err(HandlerError::Retry(_))));
        assert!(matches!(judged(404, None), Err(HandlerError::Reject(_))));
        assert!(matches!(judged(302, None), Err(HandlerError::Reject(_))));
    }

    #[test]
    fn keys_are_stable_digests() {
        assert_eq!(digest(b"abc"), digest(b"abc"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
    }
}
