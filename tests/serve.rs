//! The serve sink end to end: test brokers upstream (`support::broker`), the sidecar's
//! pipeline in the middle, and NSQ consumers downstream: the project's own [`Consumer`], and
//! a raw wire client for what a well-behaved consumer never does (dying mid-stream, going
//! silent, sending bad commands).
//!
//! Every wait is bounded; every server is on loopback and stops when its test ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use nsq_dedupe::nsq::frame::{Command, Frame, FrameCodec, MessageId, RawMessage, MAGIC_V2};
use nsq_dedupe::nsq::{Consumer, ConsumerConfig, Message};
use nsq_dedupe::serve::{ServeConfig, ServeSink};
use nsq_dedupe::sink::{Delivery, Handler, HandlerError, Part};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::codec::Decoder;

use crate::sidecar::{drained, payload, raw_config, Running, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::util::wait_until_or;

/// The serve sink shared between the sidecar (its handler) and the test (its stats).
#[derive(Clone)]
pub(crate) struct Served(pub(crate) Arc<ServeSink>);

impl Handler for Served {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.0.handle(body).await
    }

    fn handle_in_parts(&self, deliveries: Vec<Delivery>) -> impl Stream<Item = Part> + Send {
        self.0.handle_in_parts(deliveries)
    }

    fn handles_batches(&self) -> bool {
        self.0.handles_batches()
    }

    fn backs_off(&self) -> bool {
        self.0.backs_off()
    }
}

pub(crate) fn serve_config() -> ServeConfig {
    let mut config = ServeConfig::new(TOPIC, CHANNEL);
    config.tcp_address = "127.0.0.1:0".parse().unwrap();
    config.http_address = Some("127.0.0.1:0".parse().unwrap());
    config
}

pub(crate) async fn start_serve(config: ServeConfig) -> Served {
    Served(Arc::new(
        ServeSink::start(config)
            .await
            .expect("the serve sink starts"),
    ))
}

/// The sidecar consuming `brokers`, keyed on `/id`, serving through `served`.
pub(crate) async fn sidecar(brokers: &[&Broker], served: &Served) -> Running {
    let addrs: Vec<SocketAddr> = brokers.iter().map(|b| b.tcp_addr()).collect();
    let mut raw = raw_config(&addrs);
    raw.dedupe.key = Some("json:/id".into());
    Running::start(raw.validate().unwrap(), served.clone()).await
}

/// A downstream consumer of the served port with short timers.
pub(crate) fn downstream(addr: SocketAddr, max_in_flight: u32) -> Consumer {
    let mut config = ConsumerConfig::new(TOPIC, CHANNEL);
    config.nsqd_tcp_addresses = vec![addr.to_string()];
    config.max_in_flight = max_in_flight;
    config.max_attempts = 0;
    config.heartbeat_interval = Duration::from_secs(1);
    config.backoff_multiplier = Duration::from_millis(10);
    config.max_backoff = Duration::from_millis(50);
    Consumer::new(config).expect("the downstream consumer starts")
}

/// What a downstream consumer saw: each body with the attempts of each delivery.
pub(crate) type Seen = Arc<Mutex<HashMap<Bytes, Vec<u16>>>>;

/// Runs `consumer`, answering each message with `answer` (true: FIN, false: REQ 0).
pub(crate) fn consume(
    mut consumer: Consumer,
    answer: fn(&Message) -> bool,
) -> (Seen, JoinHandle<Consumer>) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(message) = consumer.next().await {
            let fin = answer(&message);
            record
                .lock()
                .unwrap()
                .entry(message.body().clone())
                .or_default()
                .push(message.attempts());
            let _ = if fin {
                message.finish()
            } else {
                message.requeue(Some(Duration::ZERO))
            };
        }
        consumer
    });
    (seen, task)
}

pub(crate) fn finished_once(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

/// Nothing waits in or is in flight through the serve sink.
pub(crate) fn serve_idle(served: &Served) -> bool {
    let stats = served.0.stats();
    stats.waiting == 0 && stats.in_flight == 0
}

/// Waits, up to 60 s, until `seen` holds `n` distinct payloads, `brokers` are drained and
/// nothing waits in or is in flight through the serve sink; `what` names the wait.
pub(crate) async fn wait_all_finished(
    seen: &Seen,
    brokers: &[&Broker],
    served: &Served,
    n: usize,
    what: &str,
) {
    wait_until_or(
        what,
        Duration::from_secs(60),
        || finished_once(seen) == n && brokers.iter().all(|b| drained(b)) && serve_idle(served),
        || {
            format!(
                "{} distinct downstream, {:?}",
                finished_once(seen),
                served.0.stats()
            )
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_payload_of_two_replicated_brokers_reaches_a_downstream_consumer_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).rev().map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&a, &b], &served).await;
    let (seen, task) = consume(downstream(served.0.tcp_address(), 50), |_| true);
    wait_all_finished(
        &seen,
        &[&a, &b],
        &served,
        N,
        "every payload downstream and both brokers drained",
    )
    .await;
    running.stop().await;
    task.abort();
    let seen = seen.lock().unwrap();
    for i in 0..N {
        assert_eq!(
            seen.get(&payload(i)).map(Vec::len),
            Some(1),
            "payload {i}: {:?}",
            seen.get(&payload(i))
        );
    }
    let counters = served.0.stats().counters;
    assert_eq!(
        (counters.delivered, counters.finished),
        (N as u64, N as u64)
    );
    assert_eq!(
        a.finished(TOPIC, CHANNEL).len() + b.finished(TOPIC, CHANNEL).len(),
        2 * N
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_req_erases_the_claim_and_the_payload_comes_back() {
    let broker = Broker::start(BrokerConfig {
        log_flow: true,
        ..BrokerConfig::default()
    })
    .await;
    const N: usize = 200;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&broker], &served).await;
    // The first delivery of each payload is requeued downstream, the second finished.
    let (seen, task) = consume(downstream(served.0.tcp_address(), 20), |m| m.attempts() > 1);
    let twice = || {
        seen.lock()
            .unwrap()
            .values()
            .filter(|a| a.len() == 2)
            .count()
    };
    wait_until_or(
        "every payload requeued downstream, then delivered again and finished",
        Duration::from_secs(60),
        || twice() == N && drained(&broker) && serve_idle(&served),
        || format!("{} payloads seen twice, {:?}", twice(), served.0.stats()),
    )
    .await;
    // The downstream consumer backs off itself: the sidecar's upstream consumer does not
    // stop the whole stream for one consumer's failures (its RDY never falls back to 0).
    let flow = broker.flow_log();
    let raised = flow
        .iter()
        .position(|e| e.rdy > 0)
        .expect("the sidecar sent RDY");
    let stalls = flow[raised..].iter().filter(|e| e.rdy == 0).count();
    assert_eq!(stalls, 0, "the sidecar's RDY fell to 0 {stalls} times");
    running.stop().await;
    task.abort();
    for (body, attempts) in seen.lock().unwrap().iter() {
        // The served attempts are upstream's: the REQ went back to the broker, which
        // delivered the message again.
        assert_eq!(attempts, &[1, 2], "{body:?}");
    }
    let counters = served.0.stats().counters;
    assert_eq!((counters.requeued, counters.finished), (N as u64, N as u64));
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), N);
}

/// A raw NSQ client for the protocol's corners.
pub(crate) struct Raw {
    stream: TcpStream,
    input: BytesMut,
}

enum Read {
    Frame(Frame),
    Closed,
    Nothing,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(MAGIC_V2).await.unwrap();
        Raw {
            stream,
            input: BytesMut::new(),
        }
    }

    async fn send(&mut self, command: Command) {
        let mut wire = BytesMut::new();
        command.encode(&mut wire);
        self.stream.write_all(&wire).await.unwrap();
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        // The server may already have closed on an earlier fatal error.
        let _ = self.stream.write_all(bytes).await;
    }

    async fn identify(&mut self, json: &str) {
        self.send(Command::Identify(Bytes::copy_from_slice(json.as_bytes())))
            .await;
        self.expect_response().await;
    }

    /// IDENTIFY with `json`, SUB to the served topic and channel, then `RDY rdy`.
    pub(crate) async fn subscribed(addr: SocketAddr, json: &str, rdy: u32) -> Raw {
        let mut raw = Raw::connect(addr).await;
        raw.identify(json).await;
        raw.send(Command::Sub {
            topic: TOPIC.into(),
            channel: CHANNEL.into(),
        })
        .await;
        assert_eq!(raw.expect_response().await, "OK");
        raw.send(Command::Rdy(rdy)).await;
        raw
    }

    async fn read(&mut self, within: Duration) -> Read {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(frame) = FrameCodec::default().decode(&mut self.input).unwrap() {
                return Read::Frame(frame);
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.input)).await {
                Err(_) => return Read::Nothing,
                Ok(Ok(0)) | Ok(Err(_)) => return Read::Closed,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next frame that is not a heartbeat.
    async fn next(&mut self, within: Duration) -> Read {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read(left).await {
                Read::Frame(Frame::Response(r)) if r == "_heartbeat_" => continue,
                other => return other,
            }
        }
    }

    async fn expect_response(&mut self) -> String {
        match self.next(Duration::from_secs(5)).await {
            Read::Frame(Frame::Response(r)) => String::from_utf8_lossy(&r).into_owned(),
            Read::Frame(other) => panic!("expected a response, got {other:?}"),
            _ => panic!("expected a response, got nothing"),
        }
    }

    pub(crate) async fn expect_message(&mut self) -> RawMessage {
        match self.next(Duration::from_secs(10)).await {
            Read::Frame(Frame::Message(m)) => m,
            Read::Frame(other) => panic!("expected a message, got {other:?}"),
            _ => panic!("expected a message, got nothing"),
        }
    }

    async fn expect_error(&mut self) -> String {
        match self.next(Duration::from_secs(5)).await {
            Read::Frame(Frame::Error(e)) => String::from_utf8_lossy(&e).into_owned(),
            Read::Frame(other) => panic!("expected an error, got {other:?}"),
            _ => panic!("expected an error, got nothing"),
        }
    }

    /// Messages arriving within `within`.
    async fn messages_within(&mut self, within: Duration) -> Vec<RawMessage> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Read::Frame(Frame::Message(m)) => out.push(m),
                Read::Frame(other) => panic!("expected messages, got {other:?}"),
                Read::Nothing | Read::Closed => return out,
            }
        }
    }

    /// Whether the server closes the connection within `within` (frames before are skipped).
    async fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read(left).await {
                Read::Closed => return true,
                Read::Nothing => return false,
                Read::Frame(_) => {}
            }
        }
    }
}

pub(crate) const NEGOTIATE: &str = r#"{"feature_negotiation":true}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_stream_loses_nothing() {
    let broker = Broker::start(BrokerConfig::default()).await;
    const N: usize = 300;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&broker], &served).await;
    let mut doomed = Raw::subscribed(served.0.tcp_address(), NEGOTIATE, 40).await;
    for _ in 0..40 {
        doomed.expect_message().await;
    }
    drop(doomed);
    let (seen, task) = consume(downstream(served.0.tcp_address(), 50), |_| true);
    wait_all_finished(
        &seen,
        &[&broker],
        &served,
        N,
        "every payload finished downstream after the first consumer died",
    )
    .await;
    running.stop().await;
    task.abort();
    assert_eq!(served.0.stats().counters.abandoned, 40);
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stops_answering_is_timed_out_and_its_messages_requeued() {
    let broker = Broker::start(BrokerConfig::default()).await;
    const N: usize = 100;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&broker], &served).await;
    let mut silent = Raw::subscribed(
        served.0.tcp_address(),
        r#"{"feature_negotiation":true,"msg_timeout":1000}"#,
        5,
    )
    .await;
    let held: Vec<MessageId> = {
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(silent.expect_message().await.id);
        }
        held
    };
    // It takes no more and answers none of what it holds.
    silent.send(Command::Rdy(0)).await;
    let (seen, task) = consume(downstream(served.0.tcp_address(), 20), |_| true);
    wait_all_finished(
        &seen,
        &[&broker],
        &served,
        N,
        "every payload finished by the consumer that answers",
    )
    .await;
    assert_eq!(served.0.stats().counters.timed_out, 5);
    // The silent consumer is still connected; its late FIN is refused as nsqd refuses it.
    silent.send(Command::Fin(held[0])).await;
    assert_eq!(
        silent.expect_error().await,
        format!("E_FIN_FAILED FIN {} failed ID not in flight", held[0])
    );
    running.stop().await;
    task.abort();
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), N);
}

/// Records handed to the serve sink directly, as the pipeline would, each in its own task.
fn submit(
    served: &Served,
    bodies: impl IntoIterator<Item = Bytes>,
) -> Vec<JoinHandle<Result<(), HandlerError>>> {
    bodies
        .into_iter()
        .map(|body| {
            let served = served.clone();
            tokio::spawn(async move { served.handle(body).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_in_flight_to_a_consumer_than_its_rdy() {
    let served = start_serve(serve_config()).await;
    let calls = submit(&served, (0..20).map(payload));
    let mut raw = Raw::subscribed(served.0.tcp_address(), NEGOTIATE, 3).await;
    let first = raw.messages_within(Duration::from_millis(1500)).await;
    assert_eq!(first.len(), 3, "RDY 3 gets 3 messages");
    raw.send(Command::Fin(first[0].id)).await;
    let second = raw.messages_within(Duration::from_millis(1000)).await;
    assert_eq!(second.len(), 1, "one FIN makes room for one");
    assert!(
        !first.iter().any(|m| m.id == second[0].id),
        "IDs are unique in flight"
    );
    raw.send(Command::Rdy(0)).await;
    for message in first[1..].iter().chain(&second) {
        raw.send(Command::Fin(message.id)).await;
    }
    assert!(
        raw.messages_within(Duration::from_millis(1000))
            .await
            .is_empty(),
        "RDY 0 gets none"
    );
    let stats = served.0.stats();
    assert_eq!(
        (stats.waiting, stats.in_flight, stats.counters.finished),
        (16, 0, 4)
    );
    raw.send(Command::Rdy(100)).await;
    assert_eq!(
        raw.messages_within(Duration::from_millis(1000)).await.len(),
        16
    );
    drop(raw);
    let mut finished = 0;
    for call in calls {
        if call.await.unwrap().is_ok() {
            finished += 1;
        }
    }
    assert_eq!(
        finished, 4,
        "the 16 held by the closed connection fail, to be retried"
    );
}

/// A consumer that holds many messages and writes each FIN on its own, as go-nsq does: the
/// endpoint gathers its answers before reading them, and settles every one, the last ones
/// too, which are far fewer bytes than the mark the socket gathers under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fin_of_a_consumer_holding_many_messages_is_settled() {
    const N: usize = 600;
    let served = start_serve(serve_config()).await;
    let calls = submit(&served, (0..N).map(payload));
    let mut raw = Raw::subscribed(served.0.tcp_address(), NEGOTIATE, 200).await;
    let mut bodies = std::collections::HashSet::new();
    while bodies.len() < N {
        let message = raw.expect_message().await;
        raw.send(Command::Fin(message.id)).await;
        bodies.insert(message.body);
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut finished = 0;
        for call in calls {
            if call.await.unwrap().is_ok() {
                finished += 1;
            }
        }
        finished
    });
    assert_eq!(answered.await.expect("every call answered"), N);
    let stats = served.0.stats();
    assert_eq!(
        (stats.waiting, stats.in_flight, stats.counters.finished),
        (0, 0, N as u64)
    );
}

/// A consumer that FINs only once it holds its `max_in_flight` messages, as `nsq_to_file`
/// does, reading more messages than the sidecar takes upstream at once: each of its batches is
/// settled upstream as it FINs it, so the RDY those messages held brings the next ones, though
/// a burst of the sidecar's spans two of its batches. Nothing waits for a timeout: each message
/// reaches it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_fins_in_batches_gets_every_message_once_without_a_timeout() {
    // The sidecar takes 200 upstream; the consumer FINs batches of 150.
    const N: usize = 600;
    const BATCH: usize = 150;
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&broker], &served).await;
    // A short message timeout: a batch left waiting for more is handed back within 2 s.
    let identify = r#"{"feature_negotiation":true,"msg_timeout":2000}"#;
    let mut raw = Raw::subscribed(served.0.tcp_address(), identify, BATCH as u32).await;
    let mut seen: HashMap<Bytes, u32> = HashMap::new();
    let mut held = BytesMut::new();
    let mut holding = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < N && tokio::time::Instant::now() < deadline {
        match raw.next(Duration::from_millis(500)).await {
            Read::Frame(Frame::Message(message)) => {
                *seen.entry(message.body).or_default() += 1;
                Command::Fin(message.id).encode(&mut held);
                holding += 1;
                if holding == BATCH {
                    raw.send_raw(&held.split()).await;
                    holding = 0;
                }
            }
            // A FIN of a message handed back after its timeout.
            Read::Frame(Frame::Error(_)) | Read::Nothing => {}
            Read::Frame(other) => panic!("expected messages, got {other:?}"),
            Read::Closed => panic!("the endpoint closed the connection"),
        }
    }
    let counters = served.0.stats().counters;
    let twice = seen.values().filter(|&&n| n > 1).count();
    assert_eq!(
        (seen.len(), twice, counters.timed_out),
        (N, 0, 0),
        "(distinct messages, messages served more than once, timeouts) within 60 s"
    );
    wait_until_or(
        "the broker drained",
        Duration::from_secs(10),
        || drained(&broker) && serve_idle(&served),
        || format!("{:?}", served.0.stats()),
    )
    .await;
    running.stop().await;
    let records = broker.records(TOPIC, CHANNEL);
    assert_eq!(records.len(), N);
    for record in records {
        assert_eq!(
            (record.deliveries, record.fin_ok, record.timeouts),
            (1, 1, 0),
            "{record:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_go_out_and_a_consumer_that_misses_two_is_closed() {
    let served = start_serve(serve_config()).await;
    let identify = r#"{"feature_negotiation":true,"heartbeat_interval":1000}"#;
    let mut alive = Raw::subscribed(served.0.tcp_address(), identify, 1).await;
    let mut silent = Raw::subscribed(served.0.tcp_address(), identify, 1).await;
    let calls = submit(&served, [payload(1)]);
    let held = alive.expect_message().await;
    let mut beats = 0;
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(3500) {
        match alive.read(Duration::from_millis(200)).await {
            Read::Frame(Frame::Response(r)) if r == "_heartbeat_" => {
                beats += 1;
                alive.send(Command::Nop).await;
            }
            Read::Closed => panic!("a consumer that answers heartbeats was closed"),
            _ => {}
        }
    }
    assert!(beats >= 2, "{beats} heartbeats in 3.5 s at 1 s");
    assert!(
        silent.closed_within(Duration::from_secs(2)).await,
        "the silent consumer is closed"
    );
    assert_eq!(served.0.heartbeat_timeouts(), 1);
    alive.send(Command::Touch(held.id)).await;
    alive.send(Command::Fin(held.id)).await;
    for call in calls {
        assert_eq!(call.await.unwrap(), Ok(()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_are_answered_as_nsqd_answers_them() {
    let served = start_serve(serve_config()).await;
    let addr = served.0.tcp_address();
    let fatal: Vec<(Vec<u8>, String)> = vec![
        (b"FOO\n".to_vec(), "E_INVALID invalid command FOO".into()),
        (b"RDY 1\n".to_vec(), "E_INVALID cannot RDY in current state".into()),
        (b"FIN 0123456789abcdef\n".to_vec(), "E_INVALID cannot FIN in current state".into()),
        (b"CLS\n".to_vec(), "E_INVALID cannot CLS in current state".into()),
        (b"SUB other app\n".to_vec(), format!("E_BAD_TOPIC SUB topic \"other\" is not served here: this endpoint serves topic \"{TOPIC}\" channel \"{CHANNEL}\"")),
        (format!("SUB {TOPIC} other\n").into_bytes(), format!("E_BAD_CHANNEL SUB channel \"other\" is not served here: this endpoint serves topic \"{TOPIC}\" channel \"{CHANNEL}\"")),
        (b"SUB bad!name app\n".to_vec(), "E_BAD_TOPIC SUB topic name \"bad!name\" is not valid".into()),
        (b"PUB events\n\0\0\0\x01x".to_vec(), format!("E_INVALID PUB refused: this endpoint only serves consumers (this endpoint serves topic \"{TOPIC}\" channel \"{CHANNEL}\"); publish to nsqd")),
        (b"MPUB events\n".to_vec(), format!("E_INVALID MPUB refused: this endpoint only serves consumers (this endpoint serves topic \"{TOPIC}\" channel \"{CHANNEL}\"); publish to nsqd")),
        (b"IDENTIFY\n\x00\x10\x00\x01".to_vec(), "E_BAD_BODY IDENTIFY body too big 1048577 > 65536".into()),
        (b"IDENTIFY\n\0\0\0\x02{]".to_vec(), "E_BAD_BODY IDENTIFY failed to decode JSON body".into()),
        (b"AUTH\n\0\0\0\x01x".to_vec(), "E_AUTH_DISABLED AUTH disabled".into()),
        (vec![b'X'; 20_000], "E_INVALID command line longer than 16384 bytes".into()),
    ];
    for (input, expected) in fatal {
        let mut raw = Raw::connect(addr).await;
        raw.send_raw(&input).await;
        assert_eq!(raw.expect_error().await, expected);
        assert!(
            raw.closed_within(Duration::from_secs(2)).await,
            "{expected} closes"
        );
    }
    // Subscribed: a FIN, REQ or TOUCH of an unknown ID is not fatal; RDY above the maximum is.
    let mut raw = Raw::subscribed(addr, NEGOTIATE, 1).await;
    let id = MessageId(*b"0123456789abcdef");
    raw.send(Command::Fin(id)).await;
    assert_eq!(
        raw.expect_error().await,
        "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    );
    raw.send(Command::Req(id, 10)).await;
    assert_eq!(
        raw.expect_error().await,
        "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"
    );
    raw.send(Command::Touch(id)).await;
    assert_eq!(
        raw.expect_error().await,
        "E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"
    );
    raw.send(Command::Cls).await;
    assert_eq!(raw.expect_response().await, "CLOSE_WAIT");
    raw.send(Command::Rdy(2501)).await;
    assert!(
        !raw.closed_within(Duration::from_millis(300)).await,
        "RDY after CLS is ignored"
    );
    let mut raw = Raw::subscribed(addr, NEGOTIATE, 1).await;
    raw.send(Command::Rdy(2501)).await;
    assert_eq!(
        raw.expect_error().await,
        "E_INVALID RDY count 2501 out of range 0-2500"
    );
    assert!(raw.closed_within(Duration::from_secs(2)).await);
    // Heartbeats off: no SUB.
    let mut raw = Raw::connect(addr).await;
    raw.identify(r#"{"heartbeat_interval":-1}"#).await;
    raw.send(Command::Sub {
        topic: TOPIC.into(),
        channel: CHANNEL.into(),
    })
    .await;
    assert_eq!(
        raw.expect_error().await,
        "E_INVALID cannot SUB with heartbeats disabled"
    );
    // A wrong magic.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"  V1").await.unwrap();
    let mut raw = Raw {
        stream,
        input: BytesMut::new(),
    };
    assert_eq!(raw.expect_error().await, "E_BAD_PROTOCOL");
    // One connection beyond the limit.
    let mut config = serve_config();
    config.max_connections = 2;
    let small = start_serve(config).await;
    let _held = [
        Raw::subscribed(small.0.tcp_address(), NEGOTIATE, 0).await,
        Raw::subscribed(small.0.tcp_address(), NEGOTIATE, 0).await,
    ];
    let mut third = Raw::connect(small.0.tcp_address()).await;
    assert_eq!(
        third.expect_error().await,
        "E_INVALID too many connections: the endpoint takes 2 consumers (max_connections)"
    );
}

/// GET `path` from `addr` with `headers`: the status, the headers and the body.
async fn http_get(addr: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_ping_lookup_as_nsqlookupd_and_stats_as_nsqd() {
    let served = start_serve(serve_config()).await;
    let http = served.0.http_address().unwrap();
    let tcp = served.0.tcp_address();
    assert_eq!(http_get(http, "/ping", "").await.2, "OK");

    let v1 = "X-NSQ-Content-Type: nsq; version=1.0\r\n";
    let (status, head, body) = http_get(http, &format!("/lookup?topic={TOPIC}"), v1).await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("x-nsq-content-type: nsq; version=1.0"),
        "{head}"
    );
    let lookup: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(lookup["channels"], serde_json::json!([CHANNEL]));
    let producer = &lookup["producers"][0];
    assert_eq!(producer["broadcast_address"], "127.0.0.1");
    assert_eq!(producer["tcp_port"], tcp.port());
    assert_eq!(producer["http_port"], http.port());
    // Without the request header (pynsq, nsq_stat, scripts): the same bare answer, as
    // nsqlookupd 1.x gives it; go-nsq reads it as is because of the response header.
    let (status, head, body) = http_get(http, &format!("/lookup?topic={TOPIC}"), "").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("x-nsq-content-type: nsq; version=1.0"),
        "{head}"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        lookup
    );
    let (status, _, body) = http_get(http, "/nonexistent", "").await;
    assert_eq!((status, body.as_str()), (404, r#"{"message":"NOT_FOUND"}"#));
    // `/info`, which `nsq_stat` reads for the TCP port before it reads `/stats`.
    let (status, _, body) = http_get(http, "/info", "").await;
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, &info["tcp_port"]), (200, &tcp.port().into()));
    let (status, _, body) = http_get(http, "/lookup?topic=other", v1).await;
    assert_eq!(
        (status, body.as_str()),
        (404, r#"{"message":"TOPIC_NOT_FOUND"}"#)
    );
    let (status, _, body) = http_get(http, "/lookup", v1).await;
    assert_eq!(
        (status, body.as_str()),
        (400, r#"{"message":"MISSING_ARG_TOPIC"}"#)
    );

    // Two waiting, one in flight to a consumer.
    let _calls = submit(&served, (0..3).map(payload));
    let mut raw = Raw::subscribed(tcp, NEGOTIATE, 1).await;
    raw.expect_message().await;
    wait_until_or(
        "two records waiting",
        Duration::from_secs(5),
        || served.0.stats().waiting == 2,
        || format!("{:?}", served.0.stats()),
    )
    .await;
    let (status, _, body) = http_get(http, "/stats?format=json", v1).await;
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let topic = &stats["topics"][0];
    assert_eq!(topic["topic_name"], TOPIC);
    let channel = &topic["channels"][0];
    assert_eq!(channel["channel_name"], CHANNEL);
    assert_eq!(
        (
            &channel["depth"],
            &channel["in_flight_count"],
            &channel["client_count"]
        ),
        (&2.into(), &1.into(), &1.into())
    );
    assert_eq!(channel["clients"][0]["ready_count"], 1);
    assert_eq!(channel["clients"][0]["in_flight_count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_finds_the_served_port_through_lookup() {
    let served = start_serve(serve_config()).await;
    let calls = submit(&served, (0..10).map(payload));
    let mut config = ConsumerConfig::new(TOPIC, CHANNEL);
    config.lookupd_http_addresses = vec![format!("http://{}", served.0.http_address().unwrap())];
    config.max_in_flight = 10;
    let (seen, task) = consume(Consumer::new(config).unwrap(), |_| true);
    wait_until_or(
        "10 payloads through lookup",
        Duration::from_secs(30),
        || finished_once(&seen) == 10,
        || format!("{:?}", served.0.stats()),
    )
    .await;
    for call in calls {
        assert_eq!(call.await.unwrap(), Ok(()));
    }
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_auth_are_offered_as_nsqd_offers_them() {
    use nsq_dedupe::nsq::{AuthSecret, Transport};
    use nsq_dedupe::serve::{ServeSecret, ServeTls};
    use nsq_dedupe::tls::TlsSettings;

    let pki = crate::support::wire::Pki::new();
    let (cert_file, key_file) = pki.server_files();
    let mut config = serve_config();
    config.tls = Some(ServeTls {
        cert_file,
        key_file,
        required: true,
    });
    config.auth_secret = Some(ServeSecret::new("s3cret").unwrap());
    let served = start_serve(config).await;
    let tcp = served.0.tcp_address();
    let transport = |secret: &str| Transport {
        tls: Some(TlsSettings {
            root_ca_file: Some(pki.ca_file()),
            ..TlsSettings::default()
        }),
        auth_secret: Some(AuthSecret::new(secret).unwrap()),
        ..Transport::default()
    };
    let consumer = |secret: &str| {
        let mut config = ConsumerConfig::new(TOPIC, CHANNEL);
        config.nsqd_tcp_addresses = vec![tcp.to_string()];
        config.transport = transport(secret);
        Consumer::new(config).unwrap()
    };
    // A wrong secret is refused for good.
    let wrong = consumer("guess");
    let refusal = tokio::time::timeout(Duration::from_secs(10), wrong.refused())
        .await
        .expect("the wrong secret is refused");
    assert!(refusal.to_string().contains("E_AUTH_FAILED"), "{refusal}");
    drop(wrong);
    // Without TLS, nothing but IDENTIFY.
    let mut plain = Raw::connect(tcp).await;
    plain.identify("{}").await;
    plain
        .send(Command::Sub {
            topic: TOPIC.into(),
            channel: CHANNEL.into(),
        })
        .await;
    assert_eq!(
        plain.expect_error().await,
        "E_INVALID cannot SUB in current state (TLS required)"
    );
    // The right secret over TLS gets the message.
    let calls = submit(&served, [payload(7)]);
    let (seen, task) = consume(consumer("s3cret"), |_| true);
    wait_until_or(
        "the payload over TLS",
        Duration::from_secs(15),
        || finished_once(&seen) == 1,
        || format!("{:?}", served.0.stats()),
    )
    .await;
    for call in calls {
        assert_eq!(call.await.unwrap(), Ok(()));
    }
    let consumers = served.0.stats().consumers;
    assert!(
        consumers[0].info.tls && consumers[0].info.authed,
        "{consumers:?}"
    );
    task.abort();
}
