//! The `http` sink: POSTs each unique body to one or more URLs, as `nsq_to_http` does, over a
//! pooled keep-alive client with HTTPS.
//!
//! Status rules: 2xx is success; 5xx, 408, 429, timeouts and connection errors are retried
//! (the message is requeued); any other status (4xx, and 1xx/3xx, which are not followed)
//! sends the message to the dead-letter.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Uri};
use serde::Deserialize;

use super::{Handler, HandlerError};
use crate::http::{HttpClient, HttpClientConfig, HttpError};

/// The content type sent when none is configured, as `nsq_to_http`.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

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

/// POSTs each body to its URLs with fixed headers and content type. `Debug` shows no secret.
pub struct HttpSink {
    client: HttpClient,
    urls: Vec<Uri>,
    mode: HttpMode,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The round-robin cursor.
    next: AtomicUsize,
}

impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|url| crate::redact::url(&url.to_string()))
            .collect();
        f.debug_struct("HttpSink")
            .field("urls", &urls)
            .field("mode", &self.mode)
            .field("headers", &crate::redact::Headers(&self.headers))
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    /// A sink POSTing to `urls` in `mode` with `headers` (a `Content-Type` among them), over a
    /// client built from `client`.
    ///
    /// # Errors
    ///
    /// [`HttpError::RootCaFile`] when the client's CA file is unusable.
    ///
    /// # Panics
    ///
    /// When `urls` is empty (the configuration requires one), or outside a Tokio runtime.
    pub fn new(
        urls: Vec<Uri>,
        mode: HttpMode,
        headers: Vec<(HeaderName, HeaderValue)>,
        client: &HttpClientConfig,
    ) -> Result<Self, HttpError> {
        assert!(!urls.is_empty(), "the http sink needs a URL");
        Ok(HttpSink {
            client: HttpClient::new(client)?,
            urls,
            mode,
            headers,
            next: AtomicUsize::new(0),
        })
    }

    /// One POST, judged by the status rules.
    async fn post(&self, url: &Uri, body: Bytes) -> Result<(), HandlerError> {
        let shown = || crate::redact::url(&url.to_string());
        match self
            .client
            .send(Method::POST, url, &self.headers, body)
            .await
        {
            Ok((status, _)) if status.is_success() => Ok(()),
            Ok((status, _)) if status.is_server_error() || matches!(status.as_u16(), 408 | 429) => {
                Err(HandlerError::Retry(format!(
                    "{} answered HTTP {status}",
                    shown()
                )))
            }
            Ok((status, _)) => Err(HandlerError::Reject(format!(
                "{} answered HTTP {status}",
                shown()
            ))),
            Err(error) => Err(HandlerError::Retry(error.to_string())),
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

impl Handler for HttpSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        match self.mode {
            HttpMode::RoundRobin => {
                let n = self.urls.len();
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let mut last = None;
                for k in 0..n {
                    match self.post(&self.urls[(start + k) % n], body.clone()).await {
                        Ok(()) => return Ok(()),
                        // A refusal of the record itself would be the same elsewhere.
                        Err(reject @ HandlerError::Reject(_)) => return Err(reject),
                        Err(retry) => last = Some(retry),
                    }
                }
                Err(last.unwrap_or_else(|| HandlerError::Retry("no URL to POST to".into())))
            }
            HttpMode::Multicast => {
                let posts = self.urls.iter().map(|url| self.post(url, body.clone()));
                let results = futures::future::join_all(posts).await;
                // Any retryable failure requeues the message: the URLs that took it get it
                // again on the retry (a duplicate downstream, never a loss). Without one, a
                // refusal sends it to the dead-letter.
                if let Some(retry) = results
                    .iter()
                    .find(|r| matches!(r, Err(HandlerError::Retry(_))))
                {
                    return retry.clone();
                }
                results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
            }
        }
    }
}
