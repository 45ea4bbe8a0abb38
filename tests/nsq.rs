//! The NSQ client against the test broker (`support::broker`) and test nsqlookupd.
//!
//! Every wait is bounded in time; every test ends by checking exact counts: what went in, what
//! was finished, and that nothing is left queued or in flight.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nsq_dedupe::nsq::{
    Consumer, ConsumerConfig, ConsumerEvent, Error, Message, Producer, ProducerConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::broker::{Broker, BrokerConfig, Fault, FlowEvent};
use crate::support::lookupd::Lookupd;
use crate::util::wait_until;

pub(crate) const TOPIC: &str = "events";
pub(crate) const CHANNEL: &str = "dedupe";

/// A consumer configuration with short timers, for `addrs`.
pub(crate) fn config(addrs: &[SocketAddr]) -> ConsumerConfig {
    let mut c = ConsumerConfig::new(TOPIC, CHANNEL);
    c.nsqd_tcp_addresses = addrs.iter().map(|a| a.to_string()).collect();
    c.heartbeat_interval = Duration::from_secs(1);
    c.msg_timeout = Some(Duration::from_secs(1));
    c.reconnect_backoff_min = Duration::from_millis(50);
    c.reconnect_backoff_max = Duration::from_millis(400);
    c.rdy_redistribute_interval = Duration::from_millis(100);
    c.lookupd_poll_interval = Duration::from_millis(100);
    c.connect_timeout = Duration::from_secs(2);
    c.backoff_multiplier = Duration::ZERO;
    c.removal_grace = Duration::from_secs(2);
    c
}

fn broker_config() -> BrokerConfig {
    BrokerConfig {
        log_flow: true,
        ..BrokerConfig::default()
    }
}

pub(crate) fn body(i: usize) -> Bytes {
    Bytes::from(format!("message-{i:05}"))
}

/// The next message, or a panic after `limit`.
async fn next(consumer: &mut Consumer, limit: Duration) -> Message {
    match tokio::time::timeout(limit, consumer.next()).await {
        Ok(Some(m)) => m,
        Ok(None) => panic!("consumer stopped"),
        Err(_) => panic!("no message within {limit:?}"),
    }
}

/// Nothing arrives within `d`.
async fn assert_quiet(consumer: &mut Consumer, d: Duration) {
    if let Ok(m) = tokio::time::timeout(d, consumer.next()).await {
        panic!("unexpected message {m:?}");
    }
}

/// Consumes until `n` messages were finished, finishing each in its own task after `work`.
pub(crate) async fn consume_finishing(
    consumer: &mut Consumer,
    n: usize,
    work: Duration,
    limit: Duration,
) -> Vec<Bytes> {
    let deadline = Instant::now() + limit;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut done = Vec::new();
    while done.len() < n {
        assert!(
            Instant::now() < deadline,
            "finished {} of {n} within {limit:?}",
            done.len()
        );
        tokio::select! {
            m = consumer.next() => {
                let m = m.expect("consumer running");
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(work).await;
                    let b = m.body().clone();
                    let r = m.finish();
                    let _ = tx.send((b, r.is_ok()));
                });
            }
            Some((b, ok)) = rx.recv() => if ok { done.push(b) },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    done
}

/// Largest sums of RDY and of in-flight over all clients of all brokers, replaying the logs
/// in time order.
fn max_sums(logs: &[Vec<FlowEvent>]) -> (u64, u64) {
    let mut events: Vec<(usize, FlowEvent)> = logs
        .iter()
        .enumerate()
        .flat_map(|(b, l)| l.iter().map(move |e| (b, *e)))
        .collect();
    events.sort_by_key(|(_, e)| e.at);
    let mut now: HashMap<(usize, u64), (u32, u32)> = HashMap::new();
    let (mut max_rdy, mut max_inf) = (0, 0);
    for (b, e) in events {
        now.insert((b, e.client), (e.rdy, e.in_flight));
        let rdy: u64 = now.values().map(|v| u64::from(v.0)).sum();
        let inf: u64 = now.values().map(|v| u64::from(v.1)).sum();
        max_rdy = max_rdy.max(rdy);
        max_inf = max_inf.max(inf);
    }
    (max_rdy, max_inf)
}

/// Every published message was finished exactly once and nothing is left on the channel.
pub(crate) fn assert_all_finished_once(broker: &Broker, n: usize) {
    let records = broker.records(TOPIC, CHANNEL);
    assert_eq!(records.len(), n, "distinct messages delivered");
    for r in &records {
        assert_eq!(r.fin_ok, 1, "message {} finished {} times", r.id, r.fin_ok);
    }
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), n);
    assert_eq!(
        broker.depth(TOPIC, CHANNEL),
        (0, 0, 0),
        "queued, deferred, in flight"
    );
}

#[tokio::test]
async fn consumes_and_finishes_every_message_once() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 10;
    let mut consumer = Consumer::new(c).unwrap();
    for i in 0..100 {
        broker.publish(TOPIC, body(i));
    }
    let mut got = consume_finishing(
        &mut consumer,
        100,
        Duration::from_millis(1),
        Duration::from_secs(10),
    )
    .await;
    got.sort();
    assert_eq!(got, (0..100).map(body).collect::<Vec<_>>());
    wait_until("broker saw 100 FINs", Duration::from_secs(5), || {
        broker.stats().fin_ok == 100
    })
    .await;
    assert_all_finished_once(&broker, 100);
    for r in broker.records(TOPIC, CHANNEL) {
        assert_eq!((r.deliveries, r.last_attempts), (1, 1));
    }
    let clients = broker.clients();
    assert_eq!(clients.len(), 1);
    assert_eq!(
        clients[0].user_agent,
        concat!("nsq-dedupe/", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(clients[0].msg_timeout, Duration::from_secs(1));
    assert_eq!(clients[0].heartbeat_interval, Some(Duration::from_secs(1)));
    assert_eq!(clients[0].rdy, 10);
    assert!(broker.stats().max_in_flight <= 10);
    let report = consumer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(
        (
            report.requeued_unseen,
            report.requeued_at_deadline,
            report.clean
        ),
        (0, 0, true)
    );
}

#[tokio::test]
async fn message_exposes_its_fields() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    broker.publish(TOPIC, "hello");
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    assert_eq!(&m.body()[..], b"hello");
    assert_eq!(m.attempts(), 1);
    assert!(m.timestamp() >= before && m.timestamp() - before < 5_000_000_000);
    assert_eq!(m.nsqd_address(), broker.tcp_addr().to_string());
    let id = m.id().to_string();
    assert_eq!(id.len(), 16);
    m.finish().unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    assert_eq!(broker.records(TOPIC, CHANNEL)[0].id, id);
}

/// Consumes `per_nsqd` messages from each of three nsqd with `max_in_flight`, finishing each
/// after `delay`, checks that every message was finished exactly once, and returns the largest
/// sums of RDY and of messages in flight over the three connections.
async fn rdy_scenario(max_in_flight: u32, per_nsqd: usize, delay: Duration) -> (u64, u64) {
    let brokers = [
        Broker::start(broker_config()).await,
        Broker::start(broker_config()).await,
        Broker::start(broker_config()).await,
    ];
    let addrs: Vec<SocketAddr> = brokers.iter().map(|b| b.tcp_addr()).collect();
    let mut c = config(&addrs);
    c.max_in_flight = max_in_flight;
    let mut consumer = Consumer::new(c).unwrap();
    for (k, b) in brokers.iter().enumerate() {
        for i in 0..per_nsqd {
            b.publish(TOPIC, body(k * 100 + i));
        }
    }
    let total = 3 * per_nsqd;
    let got = consume_finishing(&mut consumer, total, delay, Duration::from_secs(20)).await;
    assert_eq!(got.len(), total);
    for b in &brokers {
        wait_until("every FIN per nsqd", Duration::from_secs(5), || {
            b.stats().fin_ok == per_nsqd as u64
        })
        .await;
        assert_all_finished_once(b, per_nsqd);
    }
    let logs: Vec<Vec<FlowEvent>> = brokers.iter().map(|b| b.flow_log()).collect();
    max_sums(&logs)
}

#[tokio::test]
async fn rdy_sum_over_several_nsqd_stays_within_max_in_flight() {
    let (max_rdy, max_inf) = rdy_scenario(5, 30, Duration::from_millis(20)).await;
    assert!(max_rdy <= 5, "sum of RDY reached {max_rdy}");
    assert!(max_inf <= 5, "messages in flight reached {max_inf}");
    assert!(max_rdy >= 3, "every connection got RDY (max sum {max_rdy})");
}

#[tokio::test]
async fn rdy_rotates_when_connections_exceed_max_in_flight() {
    let (max_rdy, max_inf) = rdy_scenario(1, 5, Duration::from_millis(5)).await;
    assert_eq!(max_rdy, 1, "sum of RDY");
    assert_eq!(max_inf, 1, "messages in flight");
}

#[tokio::test]
async fn lookupd_joins_new_nsqd_and_drains_vanished_ones() {
    let a = Broker::start(broker_config()).await;
    let b = Broker::start(broker_config()).await;
    let lookupd = Lookupd::start().await;
    lookupd.set_producers(TOPIC, &[a.tcp_addr()]);
    let mut c = config(&[]);
    c.lookupd_http_addresses = vec![format!("http://{}", lookupd.http_addr())];
    c.max_in_flight = 4;
    let mut consumer = Consumer::new(c).unwrap();
    let mut events = consumer.events();
    a.publish(TOPIC, body(1));
    let got = consume_finishing(&mut consumer, 1, Duration::ZERO, Duration::from_secs(5)).await;
    assert_eq!(got, vec![body(1)]);
    assert!(b.clients().is_empty(), "not yet told about b");

    lookupd.set_producers(TOPIC, &[a.tcp_addr(), b.tcp_addr()]);
    wait_until("a subscribed client on b", Duration::from_secs(5), || {
        b.clients()
            .iter()
            .any(|c| c.subscription.is_some() && c.rdy > 0)
    })
    .await;
    b.publish(TOPIC, body(2));
    a.publish(TOPIC, body(3));
    let mut got = consume_finishing(&mut consumer, 2, Duration::ZERO, Duration::from_secs(5)).await;
    got.sort();
    assert_eq!(got, vec![body(2), body(3)]);

    lookupd.set_producers(TOPIC, &[b.tcp_addr()]);
    wait_until("a has no clients", Duration::from_secs(5), || {
        a.clients().is_empty()
    })
    .await;
    assert!(
        a.stats().cls >= 1,
        "the connection to a was closed with CLS"
    );
    a.publish(TOPIC, body(4));
    b.publish(TOPIC, body(5));
    let got = consume_finishing(&mut consumer, 1, Duration::ZERO, Duration::from_secs(5)).await;
    assert_eq!(got, vec![body(5)]);
    assert_quiet(&mut consumer, Duration::from_millis(300)).await;
    assert_eq!(
        a.depth(TOPIC, CHANNEL),
        (1, 0, 0),
        "a's new message waits on a"
    );
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    let b_addr = b.tcp_addr().to_string();
    let a_addr = a.tcp_addr().to_string();
    assert!(
        seen.contains(&ConsumerEvent::NsqdDiscovered { addr: b_addr }),
        "{seen:?}"
    );
    assert!(
        seen.contains(&ConsumerEvent::NsqdRemoved { addr: a_addr }),
        "{seen:?}"
    );
    assert!(lookupd.lookups() >= 3);
}

#[tokio::test]
async fn lookupd_failure_keeps_current_connections() {
    let a = Broker::start(broker_config()).await;
    let lookupd = Lookupd::start().await;
    lookupd.set_producers(TOPIC, &[a.tcp_addr()]);
    let mut c = config(&[]);
    c.lookupd_http_addresses = vec![lookupd.http_addr().to_string()];
    let mut consumer = Consumer::new(c).unwrap();
    let mut events = consumer.events();
    wait_until("connected through lookupd", Duration::from_secs(5), || {
        consumer.stats().connections == 1
    })
    .await;
    drop(lookupd);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no LookupdFailed event");
        if let Ok(Ok(ConsumerEvent::LookupdFailed { .. })) =
            tokio::time::timeout(Duration::from_secs(1), events.recv()).await
        {
            break;
        }
    }
    a.publish(TOPIC, "still subscribed");
    next(&mut consumer, Duration::from_secs(5))
        .await
        .finish()
        .unwrap();
    wait_until("FIN", Duration::from_secs(5), || a.stats().fin_ok == 1).await;
    assert_eq!(
        (a.stats().connections, a.stats().cls),
        (1, 0),
        "the connection was kept"
    );
}

#[tokio::test]
async fn redelivers_after_timeout_with_same_id_and_attempts_plus_one() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    broker.publish(TOPIC, "slow");
    let first = next(&mut consumer, Duration::from_secs(5)).await;
    assert_eq!(first.attempts(), 1);
    // Hold it past the 1 s msg_timeout without answering.
    let second = next(&mut consumer, Duration::from_secs(4)).await;
    assert_eq!(second.id(), first.id());
    assert_eq!(second.attempts(), 2);
    assert_eq!(second.body(), first.body());
    second.finish().unwrap();
    assert!(matches!(first.finish(), Err(Error::NotInFlight { .. })));
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    let r = &broker.records(TOPIC, CHANNEL)[0];
    assert_eq!(
        (r.deliveries, r.timeouts, r.fin_ok, r.fin_failed),
        (2, 1, 1, 0)
    );
    assert_all_finished_once(&broker, 1);
}

#[tokio::test]
async fn touch_keeps_a_slow_message_alive() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    broker.publish(TOPIC, "slow");
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    let started = Instant::now();
    // Work for 2.5 s, well past the 1 s msg_timeout, touching every 400 ms.
    while started.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        m.touch().unwrap();
    }
    m.finish().unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    let r = &broker.records(TOPIC, CHANNEL)[0];
    assert_eq!((r.deliveries, r.timeouts, r.fin_ok), (1, 0, 1));
    assert!(r.touch_ok >= 6, "{} touches", r.touch_ok);
    assert_eq!(consumer.stats().touched, u64::from(r.touch_ok));
    assert_all_finished_once(&broker, 1);
}

#[tokio::test]
async fn requeue_delay_is_honoured() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    broker.publish(TOPIC, "later");
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    m.requeue(Some(Duration::from_millis(700))).unwrap();
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    assert_eq!(m.attempts(), 2);
    m.finish().unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    let r = &broker.records(TOPIC, CHANNEL)[0];
    assert_eq!((r.deliveries, r.req_ok, r.fin_ok), (2, 1, 1));
    let (requeued_at, delay) = r.requeued_at[0];
    assert_eq!(delay, Duration::from_millis(700));
    let waited = r.delivered_at[1] - requeued_at;
    assert!(
        waited >= Duration::from_millis(700),
        "redelivered after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(1500),
        "redelivered after {waited:?}"
    );
    assert_all_finished_once(&broker, 1);
}

#[tokio::test]
async fn dropped_message_is_requeued_not_lost() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.default_requeue_delay = Duration::ZERO;
    let mut consumer = Consumer::new(c).unwrap();
    broker.publish(TOPIC, "dropped");
    drop(next(&mut consumer, Duration::from_secs(5)).await);
    let m = next(&mut consumer, Duration::from_secs(2)).await;
    assert_eq!(m.attempts(), 2);
    m.finish().unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    let r = &broker.records(TOPIC, CHANNEL)[0];
    assert_eq!((r.deliveries, r.req_ok, r.timeouts, r.fin_ok), (2, 1, 0, 1));
}

#[tokio::test]
async fn max_attempts_exceeded_is_finished_without_handing_out() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_attempts = 2;
    let mut consumer = Consumer::new(c).unwrap();
    broker.publish(TOPIC, "poison");
    for attempt in 1..=2 {
        let m = next(&mut consumer, Duration::from_secs(5)).await;
        assert_eq!(m.attempts(), attempt);
        m.requeue_without_backoff(Some(Duration::ZERO)).unwrap();
    }
    wait_until("auto FIN", Duration::from_secs(5), || {
        broker.stats().fin_ok == 1
    })
    .await;
    assert_quiet(&mut consumer, Duration::from_millis(300)).await;
    assert_eq!(consumer.stats().max_attempts_exceeded, 1);
    let r = &broker.records(TOPIC, CHANNEL)[0];
    assert_eq!(
        (r.deliveries, r.req_ok, r.fin_ok, r.last_attempts),
        (3, 2, 1, 3)
    );
}

#[tokio::test]
async fn non_fatal_errors_keep_the_connection() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    let mut events = consumer.events();
    wait_until("connected", Duration::from_secs(5), || {
        consumer.stats().connections == 1
    })
    .await;
    for text in [
        "E_FIN_FAILED FIN 0000000000000001 failed ID not in flight",
        "E_REQ_FAILED REQ 0000000000000001 failed ID not in flight",
        "E_TOUCH_FAILED TOUCH 0000000000000001 failed ID not in flight",
    ] {
        assert_eq!(
            broker.inject(Fault::Error {
                text: text.into(),
                fatal: false
            }),
            1
        );
    }
    wait_until("3 non-fatal errors", Duration::from_secs(5), || {
        consumer.stats().non_fatal_errors == 3
    })
    .await;
    broker.publish(TOPIC, "after");
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    m.finish().unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    let s = consumer.stats();
    assert_eq!((s.connects, s.disconnects), (1, 0));
    assert_eq!(broker.stats().connections, 1);
    let mut non_fatal = 0;
    while let Ok(e) = events.try_recv() {
        if let ConsumerEvent::NonFatalError { text, .. } = e {
            assert!(text.starts_with("E_"));
            non_fatal += 1;
        }
    }
    assert_eq!(non_fatal, 3);
}

#[tokio::test]
async fn fatal_error_reconnects() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    wait_until("connected", Duration::from_secs(5), || {
        consumer.stats().connections == 1
    })
    .await;
    broker.inject(Fault::Error {
        text: "E_INVALID injected".into(),
        fatal: true,
    });
    wait_until("reconnected", Duration::from_secs(5), || {
        let s = consumer.stats();
        s.connects == 2 && s.connections == 1
    })
    .await;
    assert_eq!(consumer.stats().disconnects, 1);
    broker.publish(TOPIC, "after");
    next(&mut consumer, Duration::from_secs(5))
        .await
        .finish()
        .unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
}

#[tokio::test]
async fn reconnects_after_a_drop_without_losing_or_double_finishing() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 8;
    let mut consumer = Consumer::new(c).unwrap();
    let mut events = consumer.events();
    for i in 0..60 {
        broker.publish(TOPIC, body(i));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut finished = Vec::new();
    let mut failed_finishes = 0;
    let mut received = 0;
    let mut dropped = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while finished.len() < 60 {
        assert!(
            Instant::now() < deadline,
            "finished {} of 60",
            finished.len()
        );
        tokio::select! {
            m = consumer.next() => {
                let m = m.unwrap();
                received += 1;
                if received == 10 && !dropped {
                    dropped = true;
                    assert_eq!(broker.drop_connections(), 1);
                }
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let b = m.body().clone();
                    let r = m.finish();
                    let _ = tx.send((b, r));
                });
            }
            Some((b, r)) = rx.recv() => match r {
                Ok(()) => finished.push(b),
                Err(Error::ConnectionClosed { .. }) => failed_finishes += 1,
                Err(e) => panic!("unexpected {e}"),
            },
        }
    }
    assert!(
        failed_finishes >= 1,
        "some finishes hit the dropped connection"
    );
    finished.sort();
    assert_eq!(
        finished,
        (0..60).map(body).collect::<Vec<_>>(),
        "each body finished once"
    );
    wait_until("60 FINs", Duration::from_secs(5), || {
        broker.stats().fin_ok == 60
    })
    .await;
    assert_all_finished_once(&broker, 60);
    let redelivered = broker
        .records(TOPIC, CHANNEL)
        .iter()
        .filter(|r| r.deliveries > 1)
        .count();
    assert_eq!(
        redelivered, failed_finishes,
        "exactly the lost messages came back"
    );
    assert!(consumer.stats().connects >= 2);
    let mut saw_disconnect = false;
    while let Ok(e) = events.try_recv() {
        saw_disconnect |= matches!(e, ConsumerEvent::Disconnected { .. });
    }
    assert!(saw_disconnect);
}

#[tokio::test]
async fn reconnect_keeps_trying_until_nsqd_is_back() {
    // Reserve a port, then free it: connects fail until a broker listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut consumer = Consumer::new(config(&[addr])).unwrap();
    let mut events = consumer.events();
    let mut scheduled = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while scheduled < 3 {
        assert!(
            Instant::now() < deadline,
            "reconnects scheduled: {scheduled}"
        );
        if let Ok(Ok(ConsumerEvent::ReconnectScheduled { attempt, delay, .. })) =
            tokio::time::timeout(Duration::from_secs(2), events.recv()).await
        {
            assert!(delay <= Duration::from_millis(400), "{delay:?}");
            scheduled = attempt;
        }
    }
    assert_eq!(consumer.stats().connects, 0);
    assert_quiet(&mut consumer, Duration::from_millis(50)).await;
    // nsqd comes back on the same port: the consumer joins it and consumes.
    let broker = Broker::start_at(addr, broker_config()).await;
    broker.publish(TOPIC, "back");
    next(&mut consumer, Duration::from_secs(5))
        .await
        .finish()
        .unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    assert_eq!(consumer.stats().connects, 1);
}

#[tokio::test]
async fn shutdown_drains_then_requeues_what_is_left() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 10;
    c.msg_timeout = Some(Duration::from_secs(10));
    let mut consumer = Consumer::new(c).unwrap();
    for i in 0..10 {
        broker.publish(TOPIC, body(i));
    }
    wait_until("10 buffered", Duration::from_secs(5), || {
        consumer.stats().messages_received == 10
    })
    .await;
    let mut held = Vec::new();
    for i in 0..6 {
        let m = next(&mut consumer, Duration::from_secs(1)).await;
        if i < 3 {
            // Finished during the grace period.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                m.finish().unwrap();
            });
        } else {
            held.push(m);
        }
    }
    let started = Instant::now();
    let report = consumer.shutdown(Duration::from_millis(800)).await;
    let took = started.elapsed();
    assert_eq!(report.requeued_unseen, 4, "{report:?}");
    assert_eq!(report.requeued_at_deadline, 3, "{report:?}");
    assert!(report.clean);
    assert!(
        took >= Duration::from_millis(750) && took < Duration::from_secs(3),
        "{took:?}"
    );
    for m in held {
        assert!(m.finish().is_err(), "already requeued by shutdown");
    }
    // The broker reads the last REQs after our sockets closed; give it a moment.
    wait_until("7 REQs at the broker", Duration::from_secs(2), || {
        broker.stats().req_ok >= 7
    })
    .await;
    let s = broker.stats();
    assert_eq!(
        (s.cls, s.fin_ok, s.req_ok, s.fin_failed, s.req_failed),
        (1, 3, 7, 0, 0)
    );
    assert_eq!(
        broker.depth(TOPIC, CHANNEL),
        (7, 0, 0),
        "7 back in the queue, none in flight"
    );
    wait_until("client closed", Duration::from_secs(2), || {
        broker.clients().is_empty()
    })
    .await;
}

#[tokio::test]
async fn shutdown_with_everything_answered_is_quick() {
    let broker = Broker::start(broker_config()).await;
    let mut consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    broker.publish(TOPIC, "one");
    next(&mut consumer, Duration::from_secs(5))
        .await
        .finish()
        .unwrap();
    let started = Instant::now();
    let report = consumer.shutdown(Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (
            report.requeued_unseen,
            report.requeued_at_deadline,
            report.clean
        ),
        (0, 0, true)
    );
    assert_eq!(broker.stats().cls, 1);
    assert_all_finished_once(&broker, 1);
}

#[tokio::test]
async fn handler_failures_back_off_then_recover() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 5;
    c.backoff_multiplier = Duration::from_millis(300);
    let mut consumer = Consumer::new(c).unwrap();
    let mut events = consumer.events();
    wait_until("RDY 5", Duration::from_secs(5), || {
        broker.clients().first().is_some_and(|c| c.rdy == 5)
    })
    .await;
    broker.publish(TOPIC, "fails once");
    let m = next(&mut consumer, Duration::from_secs(5)).await;
    m.requeue(Some(Duration::ZERO)).unwrap();
    wait_until("RDY 0 during backoff", Duration::from_secs(2), || {
        broker.clients()[0].rdy == 0
    })
    .await;
    let paused_at = Instant::now();
    let m = next(&mut consumer, Duration::from_secs(3)).await;
    assert!(
        paused_at.elapsed() >= Duration::from_millis(200),
        "{:?}",
        paused_at.elapsed()
    );
    assert_eq!(broker.clients()[0].rdy, 1, "testing with RDY 1");
    m.finish().unwrap();
    wait_until("RDY restored", Duration::from_secs(2), || {
        broker.clients()[0].rdy == 5
    })
    .await;
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert!(
        seen.iter()
            .any(|e| matches!(e, ConsumerEvent::BackoffStarted { level: 1, .. })),
        "{seen:?}"
    );
    assert!(seen.contains(&ConsumerEvent::BackoffEnded), "{seen:?}");
    assert_all_finished_once(&broker, 1);
}

/// A handler that fails for long deepens backoff only until its pause reaches `max_backoff`
/// (as go-nsq does), so that once it succeeds again the consumer eases back in as many
/// successes as it took failures to reach that pause, not one per failure of the outage; and
/// a success eases the backoff, it never starts it.
#[tokio::test]
async fn backoff_deepens_no_further_than_max_backoff_and_successes_ease_it() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 5;
    // Pauses of 20, 40 and 80 ms: the third failure in a row reaches `max_backoff`.
    c.backoff_multiplier = Duration::from_millis(20);
    c.max_backoff = Duration::from_millis(80);
    c.max_attempts = 0;
    let mut consumer = Consumer::new(c).unwrap();
    let mut events = consumer.events();
    const FAILURES: usize = 10;
    broker.publish(TOPIC, "fails ten times");
    for _ in 0..FAILURES {
        let m = next(&mut consumer, Duration::from_secs(5)).await;
        m.requeue(Some(Duration::ZERO)).unwrap();
    }
    // Each failure deepens backoff or keeps it at its deepest.
    let mut seen = Vec::new();
    let started = |seen: &[ConsumerEvent]| {
        seen.iter()
            .filter(|e| matches!(e, ConsumerEvent::BackoffStarted { .. }))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while started(&seen) < FAILURES {
        assert!(Instant::now() < deadline, "{seen:?}");
        if let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(100), events.recv()).await {
            seen.push(e);
        }
    }
    let deepest = seen
        .iter()
        .filter_map(|e| match e {
            ConsumerEvent::BackoffStarted { level, .. } => Some(*level),
            _ => None,
        })
        .max();
    assert_eq!(deepest, Some(3), "{seen:?}");
    // The handler works again: successes ease the backoff, one level each.
    for i in 0..10 {
        broker.publish(TOPIC, body(i));
    }
    let mut successes = 0;
    seen.clear();
    while !seen.contains(&ConsumerEvent::BackoffEnded) {
        assert!(
            successes < 11,
            "backoff still on after {successes} successes: {seen:?}"
        );
        // A message sent before the pause began counts for nothing, as in go-nsq.
        next(&mut consumer, Duration::from_secs(5))
            .await
            .finish()
            .unwrap();
        successes += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Ok(e) = events.try_recv() {
            seen.push(e);
        }
    }
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, ConsumerEvent::BackoffStarted { .. })),
        "a success started backoff: {seen:?}"
    );
    let eased: Vec<u32> = seen
        .iter()
        .filter_map(|e| match e {
            ConsumerEvent::BackoffEased { level, .. } => Some(*level),
            _ => None,
        })
        .collect();
    assert_eq!(eased, [2, 1], "a level a success: {seen:?}");
    consume_finishing(
        &mut consumer,
        11 - successes,
        Duration::ZERO,
        Duration::from_secs(5),
    )
    .await;
    wait_until("every FIN", Duration::from_secs(5), || {
        broker.stats().fin_ok == 11
    })
    .await;
    assert_all_finished_once(&broker, 11);
}

/// In backoff's test phase one connection gets RDY 1; if that nsqd has nothing queued, the test
/// RDY must move on to another nsqd (as go-nsq's redistribution does) instead of waiting there
/// for good.
#[tokio::test]
async fn backoff_test_rdy_moves_off_an_idle_nsqd() {
    let idle = Broker::start(broker_config()).await;
    let busy = Broker::start(broker_config()).await;
    let mut c = config(&[idle.tcp_addr(), busy.tcp_addr()]);
    c.max_in_flight = 2;
    c.backoff_multiplier = Duration::from_millis(50);
    c.max_backoff = Duration::from_millis(200);
    c.rdy_redistribute_interval = Duration::from_millis(300);
    let mut consumer = Consumer::new(c).unwrap();
    for i in 0..10 {
        busy.publish(TOPIC, body(i));
    }
    // Two failures: the test phase after them visits both connections in turn, so without the
    // rotation one of them leaves the test RDY on the idle nsqd.
    let mut failures = 0;
    let mut finished = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while finished < 10 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "only {finished} of 10 finished: the consumer stalled"
        );
        let m = next(&mut consumer, left).await;
        if failures < 2 {
            failures += 1;
            m.requeue(Some(Duration::ZERO)).unwrap();
        } else {
            m.finish().unwrap();
            finished += 1;
        }
    }
    wait_until("10 FINs", Duration::from_secs(5), || {
        busy.stats().fin_ok == 10
    })
    .await;
    assert_all_finished_once(&busy, 10);
    assert_eq!(idle.stats().fin_ok, 0);
}

#[tokio::test]
async fn heartbeats_are_answered() {
    let broker = Broker::start(broker_config()).await;
    let consumer = Consumer::new(config(&[broker.tcp_addr()])).unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let s = broker.stats();
    assert!(s.heartbeats_sent >= 3, "{s:?}");
    assert_eq!(s.nops, s.heartbeats_sent, "{s:?}");
    assert_eq!(s.heartbeat_timeouts, 0);
    assert_eq!(s.connections, 1);
    assert_eq!(consumer.stats().heartbeats, s.heartbeats_sent);
}

#[tokio::test]
async fn malformed_frames_cause_a_reconnect_not_a_panic() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_frame_size = 4096;
    let mut consumer = Consumer::new(c).unwrap();
    wait_until("connected", Duration::from_secs(5), || {
        consumer.stats().connections == 1
    })
    .await;
    let mut short_message = vec![0, 0, 0, 14, 0, 0, 0, 2];
    short_message.extend_from_slice(&[7u8; 10]);
    let faults: Vec<Vec<u8>> = vec![
        vec![0x40, 0, 0, 0, 0, 0, 0, 2], // 1 GiB frame: above max_frame_size
        short_message,                   // message shorter than its 26-byte header
        vec![0, 0, 0, 6, 0, 0, 0, 9, 1, 2], // unknown frame type 9
        vec![0, 0, 0, 2, 0, 0],          // size below the 4-byte type
    ];
    for (k, raw) in faults.into_iter().enumerate() {
        assert_eq!(broker.inject(Fault::Raw(Bytes::from(raw))), 1);
        wait_until("reconnect", Duration::from_secs(5), || {
            let s = consumer.stats();
            s.disconnects == k as u64 + 1 && s.connections == 1
        })
        .await;
    }
    broker.publish(TOPIC, "still works");
    next(&mut consumer, Duration::from_secs(5))
        .await
        .finish()
        .unwrap();
    wait_until("FIN", Duration::from_secs(5), || broker.stats().fin_ok == 1).await;
    assert_eq!(consumer.stats().connects, 5);
}

#[tokio::test]
async fn producer_publishes_and_reports_errors() {
    let broker = Broker::start(broker_config()).await;
    let producer = Producer::new(ProducerConfig::new(vec![broker.tcp_addr().to_string()])).unwrap();
    producer.publish("out", "a").await.unwrap();
    producer
        .multi_publish("out", vec![Bytes::from("b"), Bytes::from("c")])
        .await
        .unwrap();
    producer
        .deferred_publish("out", Duration::from_millis(100), "d")
        .await
        .unwrap();
    // Concurrent publishes are answered in order on one connection.
    let futs: Vec<_> = (0..20)
        .map(|i| producer.publish("out", format!("p{i:02}")))
        .collect();
    for r in futures::future::join_all(futs).await {
        r.unwrap();
    }
    let on = broker.messages_on("out");
    assert_eq!(on.len(), 24);
    assert_eq!(
        &on[..4],
        &[
            Bytes::from("a"),
            Bytes::from("b"),
            Bytes::from("c"),
            Bytes::from("d")
        ]
    );
    assert_eq!(broker.stats().connections, 1);

    broker.fail_publishes(1);
    match producer.publish("out", "x").await {
        Err(Error::Broker {
            code, fatal: false, ..
        }) => assert_eq!(code, "E_PUB_FAILED"),
        other => panic!("{other:?}"),
    }
    producer.publish("out", "y").await.unwrap();
    assert_eq!(
        broker.stats().connections,
        1,
        "non-fatal error kept the connection"
    );

    match producer.publish("out", Bytes::new()).await {
        Err(Error::Broker {
            code, fatal: true, ..
        }) => assert_eq!(code, "E_BAD_MESSAGE"),
        other => panic!("{other:?}"),
    }
    producer.publish("out", "z").await.unwrap();
    assert_eq!(
        broker.stats().connections,
        2,
        "reconnected after the fatal error"
    );
    // Names are checked before anything is written: a space or newline would forge commands.
    match producer.publish("bad topic\nCLS", "q").await {
        Err(Error::Config { field: "topic", .. }) => {}
        other => panic!("{other:?}"),
    }
    let on = broker.messages_on("out");
    assert_eq!(on.len(), 26);
    assert_eq!(&on[24..], &[Bytes::from("y"), Bytes::from("z")]);
}

/// The shape the de-duplicating sidecar will have: consume, do async work (publish the body
/// onward), then finish; every input ends up on the output topic exactly once.
#[tokio::test]
async fn consume_publish_finish_pipeline() {
    let broker = Broker::start(broker_config()).await;
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 16;
    let mut consumer = Consumer::new(c).unwrap();
    let producer = std::sync::Arc::new(
        Producer::new(ProducerConfig::new(vec![broker.tcp_addr().to_string()])).unwrap(),
    );
    broker.publish_many(TOPIC, (0..200).map(body));
    let deadline = Instant::now() + Duration::from_secs(10);
    while broker.stats().fin_ok < 200 {
        assert!(
            Instant::now() < deadline,
            "finished {} of 200",
            broker.stats().fin_ok
        );
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(100), consumer.next()).await
        else {
            continue;
        };
        let producer = producer.clone();
        tokio::spawn(async move {
            match producer.publish("output", m.body().clone()).await {
                Ok(()) => m.finish().unwrap(),
                Err(_) => m.requeue(None).unwrap(),
            }
        });
    }
    let mut out = broker.messages_on("output");
    out.sort();
    assert_eq!(out, (0..200).map(body).collect::<Vec<_>>());
    assert_all_finished_once(&broker, 200);
    let report = consumer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(
        (report.requeued_unseen, report.requeued_at_deadline),
        (0, 0)
    );
}

#[tokio::test]
async fn producer_fails_over_and_reports_unreachable_nsqd() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let broker = Broker::start(broker_config()).await;
    let producer = Producer::new(ProducerConfig::new(vec![
        dead.to_string(),
        broker.tcp_addr().to_string(),
    ]))
    .unwrap();
    for i in 0..4 {
        producer.publish("out", format!("m{i}")).await.unwrap();
    }
    assert_eq!(broker.messages_on("out").len(), 4);

    let alone = Producer::new(ProducerConfig::new(vec![dead.to_string()])).unwrap();
    match alone.publish("out", "m").await {
        Err(Error::NoProducer { tried: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// Speaks raw protocol to the broker, to check it behaves like nsqd where the client relies on it.
#[tokio::test]
async fn broker_enforces_nsqd_rules() {
    async fn raw(broker: &Broker, identify: &str) -> tokio::net::TcpStream {
        let mut s = tokio::net::TcpStream::connect(broker.tcp_addr())
            .await
            .unwrap();
        let mut out = b"  V2IDENTIFY\n".to_vec();
        out.extend_from_slice(&(identify.len() as u32).to_be_bytes());
        out.extend_from_slice(identify.as_bytes());
        s.write_all(&out).await.unwrap();
        s
    }
    async fn read_frame(s: &mut tokio::net::TcpStream) -> Option<(u32, Vec<u8>)> {
        let mut head = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head))
            .await
            .unwrap()
            .ok()?;
        let size = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
        let mut data = vec![0; size - 4];
        s.read_exact(&mut data).await.ok()?;
        Some((u32::from_be_bytes(head[4..].try_into().unwrap()), data))
    }
    let broker = Broker::start(broker_config()).await;

    // SUB with heartbeats disabled is refused, fatally.
    let mut s = raw(&broker, r#"{"heartbeat_interval":-1}"#).await;
    assert_eq!(read_frame(&mut s).await.unwrap(), (0, b"OK".to_vec()));
    s.write_all(b"SUB t c\n").await.unwrap();
    assert_eq!(
        read_frame(&mut s).await.unwrap(),
        (1, b"E_INVALID cannot SUB with heartbeats disabled".to_vec())
    );
    assert!(read_frame(&mut s).await.is_none(), "closed");

    // RDY above max_rdy_count is fatal; a client that misses heartbeats is closed.
    let mut s = raw(
        &broker,
        r#"{"heartbeat_interval":1000,"feature_negotiation":true}"#,
    )
    .await;
    let (t, json) = read_frame(&mut s).await.unwrap();
    assert_eq!(t, 0);
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["max_rdy_count"], 2500);
    s.write_all(b"SUB t c\nRDY 2501\n").await.unwrap();
    assert_eq!(read_frame(&mut s).await.unwrap(), (0, b"OK".to_vec()));
    assert_eq!(
        read_frame(&mut s).await.unwrap(),
        (1, b"E_INVALID RDY count 2501 out of range 0-2500".to_vec())
    );
    assert!(read_frame(&mut s).await.is_none(), "closed");

    let mut s = raw(&broker, r#"{"heartbeat_interval":1000}"#).await;
    s.write_all(b"SUB t c\nFIN 0123456789abcdef\n")
        .await
        .unwrap();
    assert_eq!(read_frame(&mut s).await.unwrap(), (0, b"OK".to_vec()));
    assert_eq!(read_frame(&mut s).await.unwrap(), (0, b"OK".to_vec()));
    assert_eq!(
        read_frame(&mut s).await.unwrap(),
        (
            1,
            b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight".to_vec()
        )
    );
    let started = Instant::now();
    let mut heartbeats = 0;
    while let Some((t, data)) = read_frame(&mut s).await {
        assert_eq!((t, &data[..]), (0, &b"_heartbeat_"[..]));
        heartbeats += 1;
    }
    let silent = started.elapsed();
    assert!(heartbeats >= 1);
    assert!(
        silent >= Duration::from_millis(1500) && silent < Duration::from_secs(4),
        "{silent:?}"
    );
    assert_eq!(broker.stats().heartbeat_timeouts, 1);
}

/// End-to-end throughput: consume and FIN from the test broker over loopback, 100-byte bodies,
/// max_in_flight 2500, finishing each message inline as it arrives.
///
/// `cargo test --release --test integration nsq::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    run_throughput(false).await;
}

/// The same, but each message is finished from its own spawned task, as the sidecar will do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput_task_per_message() {
    run_throughput(true).await;
}

async fn run_throughput(task_per_message: bool) {
    const N: usize = 500_000;
    // Per-ID records cost the broker an allocation per message; counts and depth still prove
    // that every message was finished.
    let broker = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let template = [b'x'; 100];
    let mut all = bytes::BytesMut::with_capacity(N * 100);
    for i in 0..N {
        let mut b = template;
        let tag = format!("{i:08}");
        b[..8].copy_from_slice(tag.as_bytes());
        all.extend_from_slice(&b);
    }
    let all = all.freeze();
    broker.publish_many(TOPIC, (0..N).map(|i| all.slice(i * 100..(i + 1) * 100)));
    let mut c = config(&[broker.tcp_addr()]);
    c.max_in_flight = 2500;
    c.msg_timeout = Some(Duration::from_secs(60));
    c.heartbeat_interval = Duration::from_secs(30);
    let mut consumer = Consumer::new(c).unwrap();
    let first = next(&mut consumer, Duration::from_secs(10)).await;
    let started = Instant::now();
    first.finish().unwrap();
    for _ in 1..N {
        let m = next(&mut consumer, Duration::from_secs(10)).await;
        if task_per_message {
            tokio::spawn(async move { m.finish().unwrap() });
        } else {
            m.finish().unwrap();
        }
    }
    let consumed = started.elapsed();
    wait_until("all FINs at the broker", Duration::from_secs(30), || {
        broker.stats().fin_ok == N as u64
    })
    .await;
    let acked = started.elapsed();
    println!(
        "nsq throughput ({}): {N} messages of 100 bytes, max_in_flight 2500: received in {consumed:?}, all FINs at broker in {acked:?}: {:.0} msgs/s",
        if task_per_message { "task per message" } else { "inline FIN" },
        N as f64 / acked.as_secs_f64()
    );
    assert_eq!(broker.depth(TOPIC, CHANNEL), (0, 0, 0));
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), N);
    let s = broker.stats();
    assert_eq!(
        (s.deliveries, s.fin_ok, s.fin_failed, s.timeouts),
        (N as u64, N as u64, 0, 0)
    );
}
