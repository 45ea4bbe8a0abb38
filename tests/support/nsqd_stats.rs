//! Stand-ins for nsqd's ports as `size --nsqd-http-address` sees them: an HTTP server that
//! answers `/stats?format=json` in nsqd v1.3.0's shape with the message counts the test
//! chooses, an HTTP server that answers something else, and a TCP port that answers HTTP as
//! nsqd's TCP port does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;

/// What a stub answers.
#[derive(Debug, Clone)]
enum Serve {
    /// nsqd with one topic, whose n-th read (`/stats?topic=`) shows the n-th count; the last
    /// count is repeated.
    Topic { name: String, counts: Vec<u64> },
    /// Any request: status 200 and this body.
    Text(&'static str),
}

/// A running stub; stops when dropped.
pub struct NsqdStub {
    /// Where it listens.
    pub addr: SocketAddr,
    reads: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for NsqdStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NsqdStub {
    /// nsqd's HTTP API with topic `name`, whose n-th read of the topic shows `counts[n]`.
    pub async fn topic(name: &str, counts: &[u64]) -> NsqdStub {
        Self::start(Serve::Topic {
            name: name.to_owned(),
            counts: counts.to_vec(),
        })
        .await
    }

    /// An HTTP server that answers every request with status 200 and `body`.
    pub async fn text(body: &'static str) -> NsqdStub {
        Self::start(Serve::Text(body)).await
    }

    /// Reads of the topic so far.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    async fn start(serve: Serve) -> NsqdStub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = reads.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (serve, counter) = (serve.clone(), counter.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request: hyper::Request<_>| {
                        let body = answer(&serve, request.uri(), &counter);
                        async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        NsqdStub { addr, reads, task }
    }
}

/// The body for one request.
fn answer(serve: &Serve, uri: &hyper::Uri, reads: &AtomicUsize) -> Bytes {
    let (name, counts) = match serve {
        Serve::Text(body) => return Bytes::from_static(body.as_bytes()),
        Serve::Topic { name, counts } => (name, counts),
    };
    let query = uri.query().unwrap_or("");
    assert!(query.contains("format=json"), "{uri}");
    let asked = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("topic="));
    let count = |nth: usize| counts[nth.min(counts.len() - 1)];
    let topics = match asked {
        Some(asked) if asked == name => {
            let nth = reads.fetch_add(1, Ordering::SeqCst);
            format!("[{}]", topic_json(name, count(nth)))
        }
        // nsqd answers `null` for a topic it does not have.
        Some(_) => "null".to_owned(),
        None => format!(
            "[{}]",
            topic_json(name, count(reads.load(Ordering::SeqCst)))
        ),
    };
    Bytes::from(format!(
        r#"{{"version":"1.3.0","health":"OK","start_time":1795522339,"topics":{topics},"producers":null}}"#
    ))
}

fn topic_json(name: &str, count: u64) -> String {
    format!(
        r#"{{"topic_name":"{name}","channels":[],"depth":0,"backend_depth":0,"message_count":{count},"message_bytes":{},"paused":false,"e2e_processing_latency":{{"count":0,"percentiles":null}}}}"#,
        count * 10
    )
}

/// A port that answers as nsqd's TCP port does to an HTTP request: nsqd reads the first four
/// bytes as the protocol's magic, answers the error frame `E_BAD_PROTOCOL` and closes.
pub struct TcpPortStub {
    /// Where it listens.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for TcpPortStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpPortStub {
    /// Starts it on a free loopback port.
    pub async fn start() -> TcpPortStub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut magic = [0u8; 4];
                    if stream.read_exact(&mut magic).await.is_ok() {
                        // Frame: size 18, type 1 (error), then the text.
                        let mut frame = vec![0, 0, 0, 18, 0, 0, 0, 1];
                        frame.extend_from_slice(b"E_BAD_PROTOCOL");
                        let _ = stream.write_all(&frame).await;
                    }
                });
            }
        });
        TcpPortStub { addr, task }
    }
}
