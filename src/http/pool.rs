//! A pool of keep-alive HTTP/1.1 connections to one endpoint (a scheme, host and port): at
//! most `max_connections` requests in flight and as many connections open, reused for request
//! after request; callers beyond the bound wait for a connection to come free.
//!
//! hyper-util's pooled client has no such bound: a request that finds no idle connection
//! opens a new one, and when an idle one frees up first the new one still completes and joins
//! the pool, so under load it opens connections by the thousand. Here a request takes a slot
//! before it looks for a connection, and opens one only when no idle one is left, so the
//! connections never outnumber the slots.
//!
//! The slots are not all there from the start: their number is a limit learnt per endpoint
//! ([`limit`](super::limit)), two at first, one more for a request that finds every slot taken
//! while connects complete fast, halved when a connect stalls (a full listen backlog makes the
//! kernel resend the SYN after a second). So a server that closes each connection and takes
//! few at once (Python's `http.server`) gets about as many connects at a time as it can take,
//! and a keep-alive one the `max_connections` its load needs. For `https://` every pool of a
//! client shares one rustls configuration, whose session cache lets a reconnect resume its TLS
//! session instead of a full handshake.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_rustls::TlsConnector;

use super::client::{chain, tls_config, HttpClientConfig, HttpError, MAX_BODY_BYTES};
use super::limit::ConnectionLimit;

/// An answer: its status and headers (its body is read and dropped).
#[derive(Debug, Clone)]
pub(crate) struct HttpAnswer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
}

/// The pools of one client, one per endpoint, sharing a TLS configuration. `Debug` shows no
/// secret.
pub(crate) struct BoundedClient {
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
    /// connections (fewer while the endpoint takes no more: see `limit`), with `config`'s time limits and trusted roots. A URL's user info is sent as
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
    pub(crate) fn new(
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
    pub(crate) async fn send(
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
    /// One per connection the pool may hold now; a request holds one ([`Slot`]) from before it
    /// looks for a connection until it has put the connection back. Together with those
    /// handed out, and less the ones [`Limits::owed`], as many as the limit.
    slots: Semaphore,
    /// The learnt limit. A lock never held across an `.await`.
    limits: Mutex<Limits>,
    /// Requests waiting for a slot: the demand that lets the limit rise when a slot comes
    /// back.
    waiting: AtomicUsize,
    /// Connections between requests, the most recently used last. A lock never held across an
    /// `.await`.
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

/// The limit, and the slots it still has to take back.
struct Limits {
    limit: ConnectionLimit,
    /// Slots handed out beyond a lowered limit: each is forgotten instead of given back,
    /// until none is owed.
    owed: usize,
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
        let limit = ConnectionLimit::new(max_connections, Instant::now());
        Ok(EndpointPool {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            host_header: HeaderValue::from_str(authority)
                .map_err(|error| PoolError::Url(error.to_string()))?,
            tls,
            slots: Semaphore::new(limit.get()),
            limits: Mutex::new(Limits { limit, owed: 0 }),
            waiting: AtomicUsize::new(0),
            idle: Mutex::new(Vec::new()),
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
        })
    }

    /// Sends `request` once a connection is free; `shown` names the URL in errors.
    ///
    /// A request whose new connection stalls gives its slot up and waits for another, under
    /// the lowered limit; the second time it waits for its connect as long as the connect
    /// bound allows.
    async fn send(
        &self,
        mut request: Request<Full<Bytes>>,
        shown: &str,
    ) -> Result<HttpAnswer, HttpError> {
        let mut patient = false;
        loop {
            let _slot = self.slot().await;
            let exchange = self.exchange(request, shown, patient);
            match tokio::time::timeout(self.request_timeout, exchange).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(Exchange::Stalled(unsent))) => {
                    request = unsent;
                    patient = true;
                }
                Ok(Err(Exchange::Failed(error))) => return Err(error),
                Err(_) => {
                    return Err(HttpError::Timeout {
                        url: shown.to_owned(),
                        after: self.request_timeout,
                    })
                }
            }
        }
    }

    /// The limit, locked.
    fn limits(&self) -> MutexGuard<'_, Limits> {
        self.limits.lock().expect("never poisoned")
    }

    /// A slot, at once if one is free; otherwise the limit rises for this request if it may,
    /// and the request waits its turn.
    async fn slot(&self) -> Slot<'_> {
        let permit = match self.slots.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let _waiting = Waiting(&self.waiting);
                self.grow();
                self.slots
                    .acquire()
                    .await
                    .expect("the semaphore is never closed")
            }
        };
        Slot {
            pool: self,
            permit: Some(permit),
        }
    }

    /// Raises the limit by one, if it may rise now: a slot more, or one less owed.
    fn grow(&self) {
        let mut limits = self.limits();
        if limits.limit.grow(Instant::now()) {
            if limits.owed > 0 {
                limits.owed -= 1;
            } else {
                self.slots.add_permits(1);
            }
        }
    }

    /// One request on an idle connection, or a new one when none is left. A request that an
    /// idle connection gives back unsent (the server closed it meanwhile) goes on the next;
    /// one whose new connection stalls comes back unsent, unless `patient`.
    async fn exchange(
        &self,
        mut request: Request<Full<Bytes>>,
        shown: &str,
        patient: bool,
    ) -> Result<HttpAnswer, Exchange> {
        let failed = |cause: String| {
            Exchange::Failed(HttpError::Request {
                url: shown.to_owned(),
                cause,
            })
        };
        loop {
            let (mut sender, reused) = match self.take_idle().await {
                Some(sender) => (sender, true),
                None => match self.connect(patient).await {
                    Ok(sender) => (sender, false),
                    Err(ConnectError::Stalled) => return Err(Exchange::Stalled(request)),
                    Err(ConnectError::Failed(cause)) => return Err(failed(cause)),
                },
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    // The body is read to its end, so the connection can carry the next
                    // request; no sink reads it.
                    Limited::new(body, MAX_BODY_BYTES)
                        .collect()
                        .await
                        .map_err(|error| failed(format!("reading the answer: {error}")))?;
                    self.put_idle(sender);
                    return Ok(HttpAnswer {
                        status: parts.status,
                        headers: parts.headers,
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

    /// Keeps `sender` for the next request, unless the server closed it or the limit has
    /// fallen to the connections already idle.
    fn put_idle(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let limit = self.limits().limit.get();
        let mut idle = self.idle.lock().expect("never poisoned");
        if idle.len() < limit {
            idle.push(sender);
        }
    }

    /// A new connection: TCP ([`tcp`](Self::tcp)), the TLS handshake for `https://`, and
    /// its task.
    async fn connect(&self, patient: bool) -> Result<SendRequest<Full<Bytes>>, ConnectError> {
        let tcp = self.tcp(patient).await?;
        // Requests are written whole; waiting for more would only delay them.
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => start(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|error| {
                        ConnectError::Failed(format!("TLS handshake: {}", chain(&error)))
                    })?;
                start(tls).await
            }
        }
        .map_err(ConnectError::Failed)
    }

    /// A TCP connection, timed: one not open within the stall bound lowers the limit and,
    /// unless `patient`, is given up ([`ConnectError::Stalled`]): its SYN was most likely
    /// dropped, and the kernel would send it again only after a second, together with the
    /// others of the crowd. A time-out lowers the limit too. Only the TCP handshake is timed:
    /// a full backlog is what it shows, while a TLS handshake's time is mostly the
    /// endpoint's work.
    async fn tcp(&self, patient: bool) -> Result<TcpStream, ConnectError> {
        let started = Instant::now();
        let connect = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        );
        tokio::pin!(connect);
        let stall_after = self.limits().limit.stall_after();
        // The stall, if any, lasts until the end of this call.
        let (connected, stall) = match stall_after {
            None => (connect.await, None),
            Some(bound) => match tokio::time::timeout(bound, &mut connect).await {
                Ok(connected) => (connected, None),
                Err(_) => {
                    let stall = self.stalled(started);
                    if !patient {
                        return Err(ConnectError::Stalled);
                    }
                    (connect.await, Some(stall))
                }
            },
        };
        match connected {
            Ok(Ok(tcp)) => {
                self.limits().limit.connected(started.elapsed());
                Ok(tcp)
            }
            Ok(Err(error)) => Err(ConnectError::Failed(format!("connecting: {error}"))),
            Err(_) => {
                if stall.is_none() {
                    // Timed out within the stall bound, or before any bound: a stall too,
                    // over at once.
                    drop(self.stalled(started));
                }
                Err(ConnectError::Failed(format!(
                    "connecting took longer than {:?}",
                    self.connect_timeout
                )))
            }
        }
    }

    /// Reports a stalled connect begun at `started`; the limit's lost slots are taken back
    /// now if free, or owed. The stall lasts until the returned guard is dropped.
    fn stalled(&self, started: Instant) -> Stall<'_> {
        let mut limits = self.limits();
        let lost = limits.limit.stalled(started, Instant::now());
        if lost > 0 {
            let taken = self.slots.forget_permits(lost);
            limits.owed += lost - taken;
            tracing::debug!(
                host = %self.host,
                port = self.port,
                limit = limits.limit.get(),
                "Connecting stalled; fewer connections at once."
            );
        }
        Stall(self)
    }
}

/// Why a connection could not be opened.
enum ConnectError {
    /// The TCP connect was not done within the stall bound, and was given up.
    Stalled,
    /// It failed: refused, unreachable, timed out, the TLS handshake.
    Failed(String),
}

/// Why a request got no answer.
enum Exchange {
    /// Its new connection stalled: the request, unsent, to try again with another slot.
    Stalled(Request<Full<Bytes>>),
    /// It failed.
    Failed(HttpError),
}

/// A request's hold on one of its endpoint's connections. On drop the slot goes back (or is
/// forgotten, while the lowered limit is owed slots), and a request still waiting may have
/// the limit rise for it.
struct Slot<'a> {
    pool: &'a EndpointPool,
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let permit = self.permit.take().expect("taken only here");
        {
            let mut limits = self.pool.limits();
            if limits.owed > 0 {
                limits.owed -= 1;
                permit.forget();
                return;
            }
        }
        drop(permit);
        if self.pool.waiting.load(Ordering::SeqCst) > 0 {
            self.pool.grow();
        }
    }
}

/// Counts a request among those waiting for a slot until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A stalled connect, pending until dropped: the limit does not rise meanwhile.
struct Stall<'a>(&'a EndpointPool);

impl Drop for Stall<'_> {
    fn drop(&mut self) {
        self.0.limits().limit.stall_ended();
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
