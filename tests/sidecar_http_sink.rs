//! The http sink through the sidecar, against a test endpoint: 5xx answers and timeouts
//! retried and 4xx dead-lettered, 2,000 records in flight on its bounded connections, and
//! batches: filled by a trickle within the batch timeout, nothing lost to a 500, and what lines
//! cannot frame dead-lettered.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::{Dur, OneOrMany, SinkKind};
use nsq_dedupe::metrics::get;
use tokio::task::JoinHandle;

use crate::sidecar::{drained, payload, raw_config, Running, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::http::{Answer as HttpAnswer, HttpServer};
use crate::util::wait_until_or;

/// A test HTTP endpoint: answers 503 to the first POST of each body, 400 to bodies containing
/// `reject`, holds the first POST of bodies containing `slow` past the sink's timeout, and
/// 200 otherwise. Records the bodies it answered 200 to, and the headers it saw.
struct TestEndpoint {
    addr: SocketAddr,
    accepted: Arc<Mutex<HashMap<Bytes, u32>>>,
    seen_header: Arc<Mutex<bool>>,
    task: JoinHandle<()>,
}

impl Drop for TestEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestEndpoint {
    async fn start() -> TestEndpoint {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted: Arc<Mutex<HashMap<Bytes, u32>>> = Arc::default();
        let seen_header: Arc<Mutex<bool>> = Arc::default();
        let posts: Arc<Mutex<HashMap<Bytes, u32>>> = Arc::default();
        let (acc, hdr) = (accepted.clone(), seen_header.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (acc, hdr, posts) = (acc.clone(), hdr.clone(), posts.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (head_end, length) = loop {
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if head.contains("x-test: yes") {
                                *hdr.lock().unwrap() = true;
                            }
                            break (i + 4, length);
                        }
                    };
                    while buf.len() < head_end + length {
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body = Bytes::copy_from_slice(&buf[head_end..head_end + length]);
                    let attempt = {
                        let mut p = posts.lock().unwrap();
                        let n = p.entry(body.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let status = if text.contains("reject") {
                        "400 Bad Request"
                    } else if attempt == 1 && text.contains("slow") {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        "200 OK"
                    } else if attempt == 1 {
                        "503 Service Unavailable"
                    } else {
                        *acc.lock().unwrap().entry(body).or_default() += 1;
                        "200 OK"
                    };
                    let _ = s
                        .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                        .await;
                });
            }
        });
        TestEndpoint {
            addr,
            accepted,
            seen_header,
            task,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_retries_5xx_and_timeouts_and_dead_letters_4xx() {
    let endpoint = TestEndpoint::start().await;
    let a = Broker::start(BrokerConfig::default()).await;
    let mut bodies: Vec<Bytes> = (0..50).map(payload).collect();
    bodies.push(Bytes::from_static(b"{\"id\":\"slow-1\"}"));
    bodies.push(Bytes::from_static(b"{\"id\":\"reject-1\"}"));
    bodies.push(Bytes::from_static(b"{\"id\":\"reject-2\"}"));
    a.publish_many(TOPIC, bodies.iter().cloned());
    a.publish_many(TOPIC, (0..50).map(payload)); // copies
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join("dead.ndjson");
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!(
        "http://{}/ingest?src=test",
        endpoint.addr
    )));
    raw.sink.headers = Some([("X-Test".to_string(), "yes".to_string())].into());
    raw.sink.http_client_request_timeout = Some(Dur(Duration::from_millis(500)));
    raw.dead_letter =
        Some(toml::from_str(&format!("kind = \"file\"\npath = \"{}\"\n", dead.display())).unwrap());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    let accepted = || endpoint.accepted.lock().unwrap().clone();
    wait_until_or(
        "51 bodies accepted, 2 dead-lettered, broker drained",
        Duration::from_secs(30),
        || {
            accepted().len() == 51
                && drained(&a)
                && std::fs::read_to_string(&dead)
                    .unwrap_or_default()
                    .lines()
                    .count()
                    == 2
        },
        || {
            format!(
                "{} accepted, depth {:?}",
                accepted().len(),
                a.depth(TOPIC, CHANNEL)
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    for body in &bodies[..51] {
        assert_eq!(accepted().get(body), Some(&1), "{body:?}");
    }
    assert!(
        *endpoint.seen_header.lock().unwrap(),
        "the configured header was not sent"
    );
    let dead_lines = std::fs::read_to_string(&dead).unwrap();
    let mut ids: Vec<String> = dead_lines
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["reason"].as_str().unwrap().contains("HTTP 400"), "{l}");
            assert_eq!(v["source"], a.tcp_addr().to_string());
            serde_json::from_str::<serde_json::Value>(v["body"].as_str().unwrap()).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["reject-1", "reject-2"]);
    assert_eq!(get(&metrics.dead_lettered), 2);
    // 51 first tries failed with 503 or a timeout.
    assert_eq!(get(&metrics.retries), 51);
    assert_eq!(get(&metrics.duplicates), 50);
}

/// The records of one `lines` request body.
fn lines_of(body: &Bytes) -> Vec<Bytes> {
    body.split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(Bytes::copy_from_slice)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_holds_2000_in_flight_to_its_connection_bound() {
    let server = HttpServer::start(HttpAnswer::default()).await;
    let a = Broker::start(BrokerConfig::default()).await;
    let bodies: Vec<Bytes> = (0..2000).map(payload).collect();
    a.publish_many(TOPIC, bodies.iter().cloned());
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/pub", server.addr)));
    raw.sink.http_concurrency = Some(10);
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "2000 bodies POSTed and the broker drained",
        Duration::from_secs(30),
        || server.received().len() >= 2000 && drained(&a),
        || format!("{} POSTed", server.received().len()),
    )
    .await;
    running.stop().await;
    let received: HashSet<Bytes> = server.received().into_iter().map(|r| r.body).collect();
    assert_eq!(received, bodies.into_iter().collect::<HashSet<_>>());
    assert!(
        server.most_open() <= 10,
        "{} open at once",
        server.most_open()
    );
    assert!(
        server.connections() <= 10,
        "{} accepted",
        server.connections()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_of_records_fills_http_batches_within_the_batch_timeout() {
    // One record every 20 ms reaches the sidecar in bursts of one: each burst's record waits
    // for the next ones instead of making a request of its own.
    let server = HttpServer::start(HttpAnswer::default()).await;
    let a = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/mpub", server.addr)));
    raw.sink.http_batch_size = Some(10);
    raw.sink.http_batch_timeout = Some(Dur(Duration::from_secs(2)));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    const N: usize = 60;
    for i in 0..N {
        a.publish_many(TOPIC, [payload(i)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered = || -> Vec<Bytes> {
        server
            .received()
            .iter()
            .flat_map(|r| lines_of(&r.body))
            .collect()
    };
    wait_until_or(
        "every record delivered and the broker drained",
        Duration::from_secs(30),
        || delivered().len() >= N && drained(&a),
        || format!("{} delivered", delivered().len()),
    )
    .await;
    running.stop().await;
    let mut records = delivered();
    records.sort();
    let mut expected: Vec<Bytes> = (0..N).map(payload).collect();
    expected.sort();
    assert_eq!(records, expected, "each record once");
    let sizes: Vec<usize> = server
        .received()
        .iter()
        .map(|r| lines_of(&r.body).len())
        .collect();
    // Six full batches, unless the machine stalled for the whole batch timeout.
    assert!(sizes.len() <= 8, "requests of {sizes:?} records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_batches_lose_nothing_to_a_500_and_dead_letter_what_lines_cannot_frame() {
    // The third request fails: its whole batch is requeued and comes back in later ones.
    let server = HttpServer::start(HttpAnswer {
        first_statuses: vec![200, 200, 500],
        ..HttpAnswer::default()
    })
    .await;
    let a = Broker::start(BrokerConfig::default()).await;
    let bodies: Vec<Bytes> = (0..1000).map(payload).collect();
    let two_lines = Bytes::from_static(b"{\"id\":\"two\",\n\"lines\":true}");
    a.publish_many(TOPIC, bodies.iter().take(500).cloned());
    a.publish_many(TOPIC, [two_lines.clone()]);
    a.publish_many(TOPIC, bodies.iter().skip(500).cloned());
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join("dead.ndjson");
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/mpub", server.addr)));
    raw.sink.http_batch_size = Some(50);
    raw.sink.http_concurrency = Some(4);
    raw.dead_letter =
        Some(toml::from_str(&format!("kind = \"file\"\npath = \"{}\"\n", dead.display())).unwrap());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    let delivered = || -> HashSet<Bytes> {
        server
            .received()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 2)
            .flat_map(|(_, r)| lines_of(&r.body))
            .collect()
    };
    wait_until_or(
        "1000 records delivered, 1 dead-lettered, broker drained",
        Duration::from_secs(30),
        || {
            delivered().len() == 1000
                && drained(&a)
                && std::fs::read_to_string(&dead)
                    .unwrap_or_default()
                    .lines()
                    .count()
                    == 1
        },
        || {
            format!(
                "{} delivered, {} requests",
                delivered().len(),
                server.received().len()
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(delivered(), bodies.iter().cloned().collect::<HashSet<_>>());
    let received = server.received();
    let failed = lines_of(&received[2].body);
    assert!(!failed.is_empty());
    for record in &failed {
        let again = received[3..]
            .iter()
            .filter(|r| lines_of(&r.body).contains(record))
            .count();
        assert_eq!(again, 1, "{record:?} of the failed batch sent again once");
    }
    assert_eq!(get(&metrics.retries), failed.len() as u64);
    assert!(
        received.len() < 100,
        "{} requests for 1000 records",
        received.len()
    );
    assert!(
        server.connections() <= 4,
        "{} accepted",
        server.connections()
    );
    let line = std::fs::read_to_string(&dead).unwrap();
    let record: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(record["body"], std::str::from_utf8(&two_lines).unwrap());
    assert!(
        record["reason"].as_str().unwrap().contains("line break"),
        "{line}"
    );
}
