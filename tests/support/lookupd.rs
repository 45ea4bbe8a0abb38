//! A test nsqlookupd: `GET /lookup?topic=` and `GET /ping` over HTTP/1.1, with a producer list
//! per topic that tests change while clients poll.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

struct Shared {
    producers: Mutex<HashMap<String, Vec<SocketAddr>>>,
    lookups: AtomicU64,
    cancel: CancellationToken,
}

/// A running test nsqlookupd on 127.0.0.1. Dropping it stops it.
pub struct Lookupd {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Lookupd {
    /// Starts on a free loopback port with no topics.
    pub async fn start() -> Lookupd {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            producers: Mutex::new(HashMap::new()),
            lookups: AtomicU64::new(0),
            cancel: CancellationToken::new(),
        });
        let s = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = s.cancel.cancelled() => return,
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            let s = s.clone();
                            tokio::spawn(async move {
                                tokio::select! {
                                    _ = s.cancel.cancelled() => {}
                                    _ = serve(stream, &s) => {}
                                }
                            });
                        }
                    }
                }
            }
        });
        Lookupd { addr, shared }
    }

    /// `host:port` of the HTTP endpoint.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the nsqd (TCP addresses) that have `topic`.
    pub fn set_producers(&self, topic: &str, nsqd: &[SocketAddr]) {
        self.shared
            .producers
            .lock()
            .unwrap()
            .insert(topic.to_string(), nsqd.to_vec());
    }

    /// How many `/lookup` requests were answered.
    pub fn lookups(&self) -> u64 {
        self.shared.lookups.load(Ordering::Relaxed)
    }
}

impl Drop for Lookupd {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

async fn serve(mut stream: TcpStream, shared: &Shared) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 16 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let target = head.split(' ').nth(1).unwrap_or("/").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let (status, body) = match path {
        "/ping" => ("200 OK", "OK".to_string()),
        "/lookup" => {
            shared.lookups.fetch_add(1, Ordering::Relaxed);
            let topic = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("topic="))
                .unwrap_or("")
                .to_string();
            match shared.producers.lock().unwrap().get(&topic) {
                None => (
                    "404 Not Found",
                    r#"{"message":"TOPIC_NOT_FOUND"}"#.to_string(),
                ),
                Some(list) => {
                    let producers: Vec<serde_json::Value> = list
                        .iter()
                        .map(|a| {
                            serde_json::json!({
                                "remote_address": a.to_string(),
                                "hostname": "test",
                                "broadcast_address": a.ip().to_string(),
                                "tcp_port": a.port(),
                                "http_port": 0,
                                "version": "1.3.0"
                            })
                        })
                        .collect();
                    (
                        "200 OK",
                        serde_json::json!({"channels": [], "producers": producers}).to_string(),
                    )
                }
            }
        }
        _ => ("404 Not Found", r#"{"message":"NOT_FOUND"}"#.to_string()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
