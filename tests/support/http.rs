//! An HTTP test server on hyper: counts connections, records each request, answers the status
//! the test chooses after the delay it chooses; plain, or HTTPS with a certificate made here.

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
}

impl Default for Answer {
    fn default() -> Self {
        Answer {
            status: 200,
            delay: Duration::ZERO,
            tls: false,
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

/// A running test server; stops when dropped.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA certificate (PEM) that signed its certificate, when it serves HTTPS.
    pub ca_pem: Option<String>,
    connections: Arc<AtomicU64>,
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
        let connections = Arc::new(AtomicU64::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (count, record) = (connections.clone(), received.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let (record, answer, acceptor) = (record.clone(), answer.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let (record, answer) = (record.clone(), answer.clone());
                            async move {
                                let headers = request.headers().clone();
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                record.lock().unwrap().push(Received { headers, body });
                                tokio::time::sleep(answer.delay).await;
                                let mut response = Response::new(Full::new(Bytes::from("ok")));
                                *response.status_mut() =
                                    StatusCode::from_u16(answer.status).unwrap();
                                Ok::<_, Infallible>(response)
                            }
                        });
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
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
            connections,
            received,
            task,
        }
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}
