//! A pooled HTTP/1.1 client: keep-alive connections reused across requests, `https://`
//! through rustls (the system's roots, plus a CA file when given), and time limits on the
//! connect and on the whole request.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The most response body bytes read; the http sink reads only the status, nsqlookupd's
/// answers are far smaller.
pub(super) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The bound on opening a connection when none is given.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The bound on a whole request when none is given.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the crate's HTTP client: time limits, TLS and connection counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// Bound on opening a connection (TCP and, for `https://`, the TLS handshake is within the
    /// request bound). Defaults to: 2 s.
    pub connect_timeout: Duration,
    /// Bound on a whole request, from sending it to reading the answer's body. Defaults to:
    /// 10 s.
    pub request_timeout: Duration,
    /// A PEM file of CA certificates trusted besides the system's roots.
    pub root_ca_file: Option<PathBuf>,
    /// Idle keep-alive connections kept per host. Defaults to: 64.
    pub max_idle_per_host: usize,
}

impl Default for HttpClientConfig {
    fn default() -> Self {
        HttpClientConfig {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            root_ca_file: None,
            max_idle_per_host: 64,
        }
    }
}

/// Why a request got no answer, or a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Connecting, the TLS handshake, writing or reading failed.
    #[error("HTTP request to {url} failed: {cause}")]
    Request {
        /// The URL, without its secrets (`crate::redact::url`).
        url: String,
        /// What failed, with its causes.
        cause: String,
    },
    /// The request took longer than its bound.
    #[error("HTTP request to {url} got no answer within {after:?}")]
    Timeout {
        /// The URL, without its secrets (`crate::redact::url`).
        url: String,
        /// The bound.
        after: Duration,
    },
    /// The CA file could not be read or holds no certificate.
    #[error(transparent)]
    RootCaFile(#[from] crate::tls::TlsFileError),
}

/// A pooled keep-alive HTTP/1.1 client for `http://` and `https://` URLs. Cheap to clone;
/// clones share the pool.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    request_timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client with `config`'s limits and trusted roots.
    ///
    /// # Errors
    ///
    /// [`HttpError::RootCaFile`] when the CA file cannot be read or holds no certificate.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the pool's reaper is spawned on it).
    pub(crate) fn new(config: &HttpClientConfig) -> Result<Self, HttpError> {
        let tls = tls_config(config)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(config.max_idle_per_host)
            .build(connector);
        Ok(HttpClient {
            client,
            request_timeout: config.request_timeout,
        })
    }

    /// Sends `method` to `url` with `headers` and `body`; returns the status and the body.
    /// User info in `url` is sent as basic authentication, unless `headers` authorize.
    ///
    /// # Errors
    ///
    /// [`HttpError::Request`] when no answer could be had, [`HttpError::Timeout`] past the
    /// request bound.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Uri,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let basic = super::basic_auth::split(url);
        let target = basic.as_ref().map_or(url, |(bare, _)| bare);
        let mut request = Request::builder().method(method).uri(target.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some((_, value)) = basic {
            if !headers.iter().any(|(name, _)| name == AUTHORIZATION) {
                request = request.header(AUTHORIZATION, value);
            }
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| HttpError::Request {
                url: crate::redact::url(&url.to_string()),
                cause: error.to_string(),
            })?;
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|error| HttpError::Request {
                        url: crate::redact::url(&url.to_string()),
                        cause: chain(&error),
                    })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|error| HttpError::Request {
                    url: crate::redact::url(&url.to_string()),
                    cause: format!("reading the answer: {error}"),
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.request_timeout, exchange)
            .await
            .map_err(|_| HttpError::Timeout {
                url: crate::redact::url(&url.to_string()),
                after: self.request_timeout,
            })?
    }
}

/// The rustls settings for `config`'s trusted roots. One per client: its session cache is
/// what lets a reconnect resume a TLS session.
///
/// # Errors
///
/// [`HttpError::RootCaFile`] when the CA file cannot be read or holds no certificate.
pub(super) fn tls_config(config: &HttpClientConfig) -> Result<rustls::ClientConfig, HttpError> {
    let roots = crate::tls::roots(config.root_ca_file.as_deref())?;
    Ok(
        rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// An error and its causes, as one line: hyper's own message is often just "client error".
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Checks that `text` is an `http://` or `https://` URL with a host.
///
/// # Errors
///
/// What is wrong with it.
#[cfg(feature = "sidecar")]
pub(crate) fn check_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|error| format!("not a URL ({error})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("expected an http:// or https:// URL".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(check_url("http://127.0.0.1:8080/ingest?x=1").is_ok());
        assert!(check_url("https://example.com/a").is_ok());
        assert_eq!(
            check_url("ftp://x/").unwrap_err(),
            "expected an http:// or https:// URL"
        );
        assert!(check_url("http://").is_err());
        assert!(check_url("not a url").is_err());
    }
}
