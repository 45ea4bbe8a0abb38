//! An HTTP test server on hyper: counts connections (accepted, and open at once at most) and
//! TLS handshakes (full and resumed), records each request, answers the status the test
//! chooses after the delay it chooses; plain, or HTTPS with a certificate made here.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

/// What the server answers.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status of every answer.
    pub status: u16,
    /// How long each answer waits.
    pub delay: Duration,
    /// Serve HTTPS with a certificate for `localhost`.
    pub tls: bool,
    /// Statuses of the first requests, in the order they arrive; `status` after them.
    pub first_statuses: Vec<u16>,
    /// A `Retry-After` value sent with every status that is not 2xx.
    pub retry_after: Option<&'static str>,
    /// Close each connection after its answer (`Connection: close`).
    pub close: bool,
}

impl Default for Answer {
    fn default() -> Self {
        Answer {
            status: 200,
            delay: Duration::ZERO,
            tls: false,
            first_statuses: Vec::new(),
            retry_after: None,
            close: false,
        }
    }
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// What the server counts.
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    open: AtomicU64,
    most_open: AtomicU64,
    full_handshakes: AtomicU64,
    resumed_handshakes: AtomicU64,
}

/// Counts an open connection until dropped.
struct Open(Arc<Counts>);

impl Open {
    fn new(counts: Arc<Counts>) -> Open {
        counts.accepted.fetch_add(1, Ordering::SeqCst);
        let now = counts.open.fetch_add(1, Ordering::SeqCst) + 1;
        counts.most_open.fetch_max(now, Ordering::SeqCst);
        Open(counts)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running test server; stops when dropped.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA certificate (PEM) that signed its certificate, when it serves HTTPS.
    pub ca_pem: Option<String>,
    counts: Arc<Counts>,
    received: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpServer {
    /// Starts a server on a free loopback port.
    pub async fn start(answer: Answer) -> HttpServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (acceptor, ca_pem) = if answer.tls {
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key)
                .unwrap();
            (
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
                Some(cert.cert.pem()),
            )
        } else {
            (None, None)
        };
        let counts = Arc::new(Counts::default());
        let received = Arc::new(Mutex::new(Vec::new()));
        let (count, record) = (counts.clone(), received.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let open = Open::new(count.clone());
                let (record, answer, acceptor) = (record.clone(), answer.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let open = open;
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let (record, answer) = (record.clone(), answer.clone());
                            async move {
                                let headers = request.headers().clone();
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                let status = {
                                    let mut record = record.lock().unwrap();
                                    record.push(Received { headers, body });
                                    let nth = record.len() - 1;
                                    answer
                                        .first_statuses
                                        .get(nth)
                                        .copied()
                                        .unwrap_or(answer.status)
                                };
                                tokio::time::sleep(answer.delay).await;
                                let mut response = Response::new(Full::new(Bytes::from("ok")));
                                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                                if let Some(after) = answer.retry_after {
                                    if !(200..300).contains(&status) {
                                        response
                                            .headers_mut()
                                            .insert("retry-after", after.parse().unwrap());
                                    }
                                }
                                if answer.close {
                                    response
                                        .headers_mut()
                                        .insert("connection", "close".parse().unwrap());
                                }
                                Ok::<_, Infallible>(response)
                            }
                        });
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let kind = tls.get_ref().1.handshake_kind();
                                let counter = if kind == Some(rustls::HandshakeKind::Resumed) {
                                    &open.0.resumed_handshakes
                                } else {
                                    &open.0.full_handshakes
                                };
                                counter.fetch_add(1, Ordering::SeqCst);
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(tls), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        HttpServer {
            addr,
            ca_pem,
            counts,
            received,
            task,
        }
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once so far.
    pub fn most_open(&self) -> u64 {
        self.counts.most_open.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed so far: full ones, and those that resumed a session.
    pub fn handshakes(&self) -> (u64, u64) {
        (
            self.counts.full_handshakes.load(Ordering::SeqCst),
            self.counts.resumed_handshakes.load(Ordering::SeqCst),
        )
    }

    /// Requests received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A server as small as Python's `http.server`: it listens with a backlog of 1, takes one
/// connection at a time on a thread of its own, reads one request, answers
/// `HTTP/1.0 200 OK` after [`SmallServer::WORK`] and closes the connection. Connections beyond the backlog wait in the
/// client's kernel, which resends their SYN after 1 s, 3 s, ...; stops when dropped.
pub struct SmallServer {
    /// Where it listens.
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SmallServer {
    /// How long each request takes: less than a millisecond would let the server keep up
    /// with a flood of connects on a quiet machine.
    pub const WORK: Duration = Duration::from_millis(1);

    /// Starts a server on a free loopback port.
    pub fn start() -> SmallServer {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (listening, listens) = std::sync::mpsc::channel();
        let record = bodies.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let listener = socket.listen(1).unwrap();
                listening.send(listener.local_addr().unwrap()).unwrap();
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        if let Some(body) = answer_once(stream).await {
                            record.lock().unwrap().push(body);
                        }
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        SmallServer {
            addr: listens.recv().unwrap(),
            bodies,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The bodies of the requests answered so far, in order.
    pub fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().unwrap().clone()
    }
}

impl Drop for SmallServer {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

/// Reads one request from `stream`, answers `200 OK` and closes; the request's body, unless
/// the client went away first.
async fn answer_once(mut stream: tokio::net::TcpStream) -> Option<Bytes> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        read.extend_from_slice(&buf[..n]);
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = std::str::from_utf8(&read[..head_end])
        .ok()?
        .to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(Some(0), |v| v.trim().parse().ok())?;
    while read.len() < head_end + length {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        read.extend_from_slice(&buf[..n]);
    }
    tokio::time::sleep(SmallServer::WORK).await;
    stream
        .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK")
        .await
        .ok()?;
    let _ = stream.shutdown().await;
    Some(Bytes::copy_from_slice(&read[head_end..head_end + length]))
}

/// Watches, on a thread of its own, how many of this machine's TCP sockets towards a port are
/// still connecting (SYN sent, no answer yet: the connections a full backlog turned away);
/// keeps the most seen at once. Reads `/proc/net/tcp` every millisecond; stops when dropped.
pub struct ConnectingWatch {
    most: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConnectingWatch {
    /// Starts watching the sockets connecting to `port`.
    pub fn start(port: u16) -> ConnectingWatch {
        let most = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, stopped) = (most.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                seen.fetch_max(connecting_to(port), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        ConnectingWatch {
            most,
            stop,
            thread: Some(thread),
        }
    }

    /// The most sockets seen connecting at once so far.
    pub fn most(&self) -> u64 {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for ConnectingWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.take().unwrap().join();
    }
}

/// The IPv4 sockets in state SYN_SENT (`02` in `/proc/net/tcp`) whose remote port is `port`.
fn connecting_to(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[2].ends_with(&remote) && fields[3] == "02"
        })
        .count() as u64
}
