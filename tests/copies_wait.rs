//! Copies that wait beside their original, as deployed: two replicated test brokers, the
//! sidecar, and a sink that takes its time (a downstream consumer of the serve sink that holds
//! each message, an HTTP endpoint that answers slowly). A copy that arrives while its original
//! is still being handled waits in the sidecar and is finished as a copy once the original is
//! delivered, instead of bouncing between nsqd and the sidecar; a copy of a message that a
//! consumer asked to have later comes back no sooner than the consumer asked.
//!
//! A copy is TOUCHed with its original while it waits, so that nsqd times out neither of
//! them behind a sink slower than the message timeout.
//!
//! Every wait is bounded; every server is on loopback and stops when its test ends.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nsq_dedupe::config::{OneOrMany, SinkKind};
use nsq_dedupe::metrics::get;
use nsq_dedupe::nsq::Consumer;
use tokio::task::JoinHandle;

use crate::serve::{
    consume, downstream, serve_config, serve_idle, sidecar, start_serve, wait_all_finished, Raw,
    NEGOTIATE,
};
use crate::sidecar::{drained, payload, raw_config, Running, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::http::{Answer as HttpAnswer, HttpServer};
use crate::util::wait_until_or;

/// Two brokers that each hold every one of `n` payloads, in the same order, so that the two
/// copies of a payload reach the sidecar at about the same time.
async fn replicated(n: usize) -> (Broker, Broker) {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..n).map(payload));
    b.publish_many(TOPIC, (0..n).map(payload));
    (a, b)
}

/// When each body reached the downstream consumer, each delivery.
type Deliveries = Arc<Mutex<HashMap<Bytes, Vec<Instant>>>>;

/// Runs `consumer`, holding each message `hold` before answering it: FIN, or REQ with
/// `first_req` on its first delivery downstream when that is given.
fn hold_each(
    mut consumer: Consumer,
    hold: Duration,
    first_req: Option<Duration>,
) -> (Deliveries, JoinHandle<()>) {
    let seen: Deliveries = Arc::default();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(message) = consumer.next().await {
            let record = record.clone();
            tokio::spawn(async move {
                let first = {
                    let mut seen = record.lock().unwrap();
                    let times = seen.entry(message.body().clone()).or_default();
                    times.push(Instant::now());
                    times.len() == 1
                };
                tokio::time::sleep(hold).await;
                let _ = match first_req.filter(|_| first) {
                    Some(delay) => message.requeue(Some(delay)),
                    None => message.finish(),
                };
            });
        }
    });
    (seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_wait_while_a_serve_consumer_holds_their_original() {
    const N: usize = 400;
    let (a, b) = replicated(N).await;
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&a, &b], &served).await;
    let (seen, task) = hold_each(
        downstream(served.0.tcp_address(), 50),
        Duration::from_millis(50),
        None,
    );
    let distinct = || seen.lock().unwrap().len();
    wait_until_or(
        "every payload finished downstream and both brokers drained",
        Duration::from_secs(60),
        || distinct() == N && drained(&a) && drained(&b) && serve_idle(&served),
        || format!("{} distinct downstream, {:?}", distinct(), served.0.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    task.abort();
    for (body, times) in seen.lock().unwrap().iter() {
        assert_eq!(times.len(), 1, "{body:?} served {} times", times.len());
    }
    assert_eq!(
        get(&metrics.in_flight_requeues),
        0,
        "every copy in flight waited beside its original"
    );
    assert!(get(&metrics.copies_held) > 0, "no copy arrived in flight");
    assert_eq!(get(&metrics.unique), N as u64);
    assert_eq!(
        get(&metrics.duplicates),
        N as u64,
        "each payload's copy finished"
    );
    assert_eq!(
        a.finished(TOPIC, crate::sidecar::CHANNEL).len()
            + b.finished(TOPIC, crate::sidecar::CHANNEL).len(),
        2 * N
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_wait_while_a_slow_http_endpoint_takes_their_original() {
    const N: usize = 300;
    let server = HttpServer::start(HttpAnswer {
        delay: Duration::from_millis(50),
        ..HttpAnswer::default()
    })
    .await;
    let (a, b) = replicated(N).await;
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/pub", server.addr)));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "every payload POSTed and both brokers drained",
        Duration::from_secs(60),
        || server.received().len() >= N && drained(&a) && drained(&b),
        || format!("{} POSTed", server.received().len()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let bodies: Vec<Bytes> = server.received().into_iter().map(|r| r.body).collect();
    let distinct: HashSet<&Bytes> = bodies.iter().collect();
    assert_eq!(
        (bodies.len(), distinct.len()),
        (N, N),
        "each payload POSTed once"
    );
    assert_eq!(get(&metrics.in_flight_requeues), 0);
    assert!(get(&metrics.copies_held) > 0, "no copy arrived in flight");
    assert_eq!(get(&metrics.duplicates), N as u64);
}

/// A consumer that REQs a message with a delay is asking for that content later: the copy
/// from the other broker waits as long, and the REQ is not a failure of the sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_req_delay_holds_back_the_copies_too() {
    const N: usize = 20;
    const DELAY: Duration = Duration::from_secs(3);
    let (a, b) = replicated(N).await;
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&a, &b], &served).await;
    let (seen, task) = hold_each(
        downstream(served.0.tcp_address(), 50),
        Duration::ZERO,
        Some(DELAY),
    );
    let twice = || {
        seen.lock()
            .unwrap()
            .values()
            .filter(|t| t.len() == 2)
            .count()
    };
    wait_until_or(
        "every payload requeued downstream, then served again and finished",
        Duration::from_secs(30),
        || twice() == N && drained(&a) && drained(&b) && serve_idle(&served),
        || format!("{} served twice, {:?}", twice(), served.0.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    task.abort();
    for (body, times) in seen.lock().unwrap().iter() {
        assert_eq!(times.len(), 2, "{body:?}");
        let waited = times[1] - times[0];
        // The REQ leaves the consumer at once: the content comes back no sooner than asked.
        assert!(
            waited >= DELAY - Duration::from_millis(100),
            "{body:?} served again {waited:?} after a REQ of {DELAY:?}"
        );
    }
    assert_eq!(get(&metrics.handler_requeues), N as u64);
    assert_eq!(
        get(&metrics.handler_failures),
        0,
        "a consumer's REQ is no failure"
    );
    assert_eq!(get(&metrics.retries), 0);
    assert_eq!(
        get(&metrics.unique),
        2 * N as u64,
        "each payload claimed again after its REQ"
    );
}

/// A consumer dies holding originals whose nsqd has crashed meanwhile, while their copies from
/// the other nsqd wait in the sidecar: the originals' claims are erased, and the copies are
/// decided again and served to the next consumer. Finishing them as copies would lose those
/// messages: the only other delivery of each was on the nsqd that crashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_held_beside_a_dead_consumers_messages_are_served_to_the_next() {
    // Fewer than half the sidecar's max_in_flight (200): the first nsqd's messages leave room
    // for the copies from the second, whichever connects first.
    const N: usize = 60;
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..N).map(payload));
    let served = start_serve(serve_config()).await;
    let running = sidecar(&[&a, &b], &served).await;
    let mut doomed = Raw::subscribed(served.0.tcp_address(), NEGOTIATE, 40).await;
    for _ in 0..40 {
        doomed.expect_message().await;
    }
    // The copies arrive while the doomed consumer holds the originals.
    b.publish_many(TOPIC, (0..N).map(payload));
    let metrics = running.metrics.clone();
    wait_until_or(
        "copies of the doomed consumer's messages held",
        Duration::from_secs(10),
        || get(&metrics.copies_held) >= 40,
        || format!("{} held, {:?}", get(&metrics.copies_held), served.0.stats()),
    )
    .await;
    drop(a);
    drop(doomed);
    let (seen, task) = consume(downstream(served.0.tcp_address(), 50), |_| true);
    wait_all_finished(
        &seen,
        &[&b],
        &served,
        N,
        "every payload finished downstream after the first consumer and nsqd died",
    )
    .await;
    running.stop().await;
    task.abort();
    assert_eq!(served.0.stats().counters.abandoned, 40);
}

/// Standard output behind a slow reader: each write blocks for `per_write`, as a pipe whose
/// reader takes its time; the lines written are kept.
#[derive(Clone)]
struct SlowPipe {
    per_write: Duration,
    written: Arc<Mutex<Vec<u8>>>,
}

impl std::io::Write for SlowPipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::thread::sleep(self.per_write);
        self.written.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The stdout sink behind a reader slower than nsqd's message timeout (2 s; each write takes
/// 3 s), on two replicated brokers: the copies that arrive while their original is being
/// written wait beside it, TOUCHed with it, and nsqd times out none of them, nor any
/// original.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_held_beside_an_original_a_slow_reader_holds_are_touched() {
    const N: usize = 40;
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let settings = raw_config(&[a.tcp_addr(), b.tcp_addr()])
        .validate()
        .unwrap();
    let pipe = SlowPipe {
        per_write: Duration::from_secs(3),
        written: Arc::default(),
    };
    let written = pipe.written.clone();
    let running = Running::start(settings, nsq_dedupe::sink::StdoutSink::new(pipe)).await;
    // The original from one broker first, its copy from the other a moment later, while the
    // original's write is blocked.
    a.publish_many(TOPIC, (0..N).map(payload));
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.publish_many(TOPIC, (0..N).map(payload));
    let lines = || {
        String::from_utf8_lossy(&written.lock().unwrap())
            .lines()
            .count()
    };
    wait_until_or(
        "every payload written and both brokers drained",
        Duration::from_secs(60),
        || lines() >= N && drained(&a) && drained(&b),
        || format!("{} written", lines()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(lines(), N, "each payload written once");
    assert!(get(&metrics.copies_held) > 0, "no copy was held");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.timeouts, sb.timeouts),
        (0, 0),
        "nsqd timed out messages ({} copies held, {} TOUCHes)",
        get(&metrics.copies_held),
        get(&metrics.touches)
    );
    assert!(sa.touch_ok + sb.touch_ok > 0, "no TOUCH reached nsqd");
}
