//! A bounded pool of keep-alive HTTP/1.1 connections to one endpoint (a scheme, host and
//! port): at most `max_connections` requests in flight and as many connections open, reused
//! for request after request; callers beyond the bound wait for a connection to come free.
//!
//! hyper-util's pooled client has no such bound: a request that finds no idle connection
//! opens a new one, and when an idle one frees up first the new one still completes and joins
//! the pool, so under load it opens connections by the thousand. Here a request takes a permit
//! before it looks for a connection, and opens one only when no idle one is left, so the
//! connections never outnumber the permits. For `https://` every pool of a client shares one
//! rustls configuration, whose session cache lets a reconnect resume its TLS session instead of
//! a full handshake.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

use super::client::{chain, tls_config, HttpClientConfig, HttpError, MAX_BODY_BYTES};

/// An answer: its status, headers and body.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

/// The pools of one client, one per endpoint, sharing a TLS configuration. `Debug` shows no
/// secret.
pub struct BoundedClient {
    targets: Vec<Target>,
}

impl std::fmt::Debug for BoundedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.targets.iter().map(|t| (&t.shown, &t.pool)))
            .finish()
    }
}

/// One of the client's URLs, ready for requests.
struct Target {
    url: Uri,
    /// The origin-form target of the request line: the path and query.
    path: Uri,
    /// The URL as it may be printed ([`crate::redact::url`]).
    shown: String,
    /// Basic authentication from the URL's user info (see `basic_auth`).
    authorization: Option<HeaderValue>,
    pool: Arc<EndpointPool>,
}

impl BoundedClient {
    /// A pool for each endpoint among `urls`, each holding at most `max_connections`
    /// connections, with `config`'s time limits and trusted roots. A URL's user info is sent as
    /// basic authentication, unless the request's headers authorize.
    ///
    /// # Errors
    ///
    /// [`HttpError::RootCaFile`] when the CA file cannot be read or holds no certificate;
    /// [`HttpError::Request`] for a URL without a host, or an `https://` host that is no name.
    ///
    /// # Panics
    ///
    /// When `max_connections` is 0.
    pub fn new(
        urls: &[Uri],
        config: &HttpClientConfig,
        max_connections: usize,
    ) -> Result<Self, HttpError> {
        assert!(max_connections > 0, "a pool needs a connection");
        let mut tls = None;
        let mut pools: Vec<(String, Arc<EndpointPool>)> = Vec::new();
        let mut targets = Vec::with_capacity(urls.len());
        for url in urls {
            let shown = crate::redact::url(&url.to_string());
            let invalid = |cause: String| HttpError::Request {
                url: shown.clone(),
                cause,
            };
            let (bare, authorization) = match super::basic_auth::split(url) {
                Some((bare, value)) => (bare, Some(value)),
                None => (url.clone(), None),
            };
            let path = bare
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse::<Uri>()
                .map_err(|error| invalid(error.to_string()))?;
            let key = endpoint_key(&bare);
            let pool = match pools.iter().find(|(k, _)| *k == key) {
                Some((_, pool)) => Arc::clone(pool),
                None => {
                    let pool = Arc::new(
                        EndpointPool::new(&bare, config, max_connections, &mut tls).map_err(
                            |error| match error {
                                PoolError::Tls(error) => error,
                                PoolError::Url(cause) => invalid(cause),
                            },
                        )?,
                    );
                    pools.push((key, Arc::clone(&pool)));
                    pool
                }
            };
            targets.push(Target {
                url: url.clone(),
                path,
                shown,
                authorization,
                pool,
            });
        }
        Ok(BoundedClient { targets })
    }

    /// Sends `method` to `url` (one of the URLs the client was built for) with `headers` and
    /// `body`, once a connection to its endpoint is free.
    ///
    /// # Errors
    ///
    /// [`HttpError::Request`] when no answer could be had, [`HttpError::Timeout`] past the
    /// request bound (counted from when a connection was free); both name the URL without
    /// its secrets.
    ///
    /// # Panics
    ///
    /// When `url` is not one of the client's.
    pub async fn send(
        &self,
        method: Method,
        url: &Uri,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Result<HttpAnswer, HttpError> {
        let target = self
            .targets
            .iter()
            .find(|t| t.url == *url)
            .expect("the client was built for each URL it is given");
        let failed = |cause: String| HttpError::Request {
            url: target.shown.clone(),
            cause,
        };
        let pool = &target.pool;
        let mut request = Request::builder()
            .method(method)
            .uri(target.path.clone())
            .header(HOST, pool.host_header.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(value) = &target.authorization {
            if !headers.iter().any(|(name, _)| name == AUTHORIZATION) {
                request = request.header(AUTHORIZATION, value.clone());
            }
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| failed(error.to_string()))?;
        pool.send(request, &target.shown).await
    }
}

/// Why an endpoint's pool could not be made.
enum PoolError {
    Tls(HttpError),
    Url(String),
}

/// Connections to one endpoint.
struct EndpointPool {
    host: String,
    port: u16,
    host_header: HeaderValue,
    /// The connector and the name the certificate must carry, for `https://`.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// One per connection the pool may hold; a request holds one from before it looks for a
    /// connection until it has put the connection back.
    permits: Semaphore,
    /// Connections between requests, the most recently used last. A lock never held across an
    /// `.await`.
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl std::fmt::Debug for EndpointPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointPool")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl EndpointPool {
    /// The pool for `url`'s endpoint (a URL without user info); `tls` is the client's rustls
    /// configuration, made by the first `https://` endpoint and shared by the rest.
    fn new(
        url: &Uri,
        config: &HttpClientConfig,
        max_connections: usize,
        tls: &mut Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, PoolError> {
        let host = url
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| PoolError::Url("the URL has no host".into()))?;
        let https = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let shared = match tls {
                Some(shared) => Arc::clone(shared),
                None => {
                    let mut built = tls_config(config).map_err(PoolError::Tls)?;
                    built.alpn_protocols = vec![b"http/1.1".to_vec()];
                    Arc::clone(tls.insert(Arc::new(built)))
                }
            };
            Some((
                TlsConnector::from(shared),
                crate::tls::server_name(host).map_err(PoolError::Url)?,
            ))
        } else {
            None
        };
        let authority = url.authority().map_or(host, |a| a.as_str());
        Ok(EndpointPool {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            host_header: HeaderValue::from_str(authority)
                .map_err(|error| PoolError::Url(error.to_string()))?,
            tls,
            permits: Semaphore::new(max_connections),
            idle: Mutex::new(Vec::with_capacity(max_connections)),
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
        })
    }

    /// Sends `request` once a connection is free; `shown` names the URL in errors.
    async fn send(
        &self,
        request: Request<Full<Bytes>>,
        shown: &str,
    ) -> Result<HttpAnswer, HttpError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the semaphore is never closed");
        tokio::time::timeout(self.request_timeout, self.exchange(request, shown))
            .await
            .map_err(|_| HttpError::Timeout {
                url: shown.to_owned(),
                after: self.request_timeout,
            })?
    }

    /// One request on an idle connection, or a new one when none is left. A request that an
    /// idle connection gives back unsent (the server closed it meanwhile) goes on the next.
    async fn exchange(
        &self,
        mut request: Request<Full<Bytes>>,
        shown: &str,
    ) -> Result<HttpAnswer, HttpError> {
        let failed = |cause: String| HttpError::Request {
            url: shown.to_owned(),
            cause,
        };
        loop {
            let (mut sender, reused) = match self.take_idle().await {
                Some(sender) => (sender, true),
                None => (self.connect().await.map_err(failed)?, false),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let body = Limited::new(body, MAX_BODY_BYTES)
                        .collect()
                        .await
                        .map_err(|error| failed(format!("reading the answer: {error}")))?
                        .to_bytes();
                    if !sender.is_closed() {
                        self.idle.lock().expect("never poisoned").push(sender);
                    }
                    return Ok(HttpAnswer {
                        status: parts.status,
                        headers: parts.headers,
                        body,
                    });
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(failed(chain(&error.into_error()))),
                },
            }
        }
    }

    /// An idle connection ready for a request, dropping those the server closed.
    async fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let mut sender = self.idle.lock().expect("never poisoned").pop()?;
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A new connection: TCP, the TLS handshake for `https://`, and its task.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| format!("connecting took longer than {:?}", self.connect_timeout))?
        .map_err(|error| format!("connecting: {error}"))?;
        // Requests are written whole; waiting for more would only delay them.
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => start(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|error| format!("TLS handshake: {}", chain(&error)))?;
                start(tls).await
            }
        }
    }
}

/// The HTTP/1.1 handshake on `io`; the connection runs in its own task until its sender is
/// dropped or the server closes it.
async fn start<T>(io: T) -> Result<SendRequest<Full<Bytes>>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| chain(&error))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(error = %chain(&error), "HTTP connection ended.");
        }
    });
    Ok(sender)
}

/// Scheme, host and port: what makes two URLs one endpoint.
fn endpoint_key(url: &Uri) -> String {
    let https = url.scheme_str() == Some("https");
    format!(
        "{}://{}:{}",
        if https { "https" } else { "http" },
        url.host().unwrap_or_default().to_ascii_lowercase(),
        url.port_u16().unwrap_or(if https { 443 } else { 80 })
    )
}
