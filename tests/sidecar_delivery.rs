//! What the sidecar's handler gets, end to end from test brokers: a replicated stream once per
//! body; every body at least once from a flaky, slow or panicking handler; keyless bodies as
//! unique; copies in flight finished by policy; a body sent again after `max_age`; nsqd found
//! through lookupd; `Retry-After` holding a requeue back; and a body failing past
//! `max_attempts` sent to the dead-letter topic.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::{Dur, OneOrMany, SinkKind, StoreKind};
use nsq_dedupe::metrics::get;
use nsq_dedupe::sink::HandlerError;
use rand::{Rng, SeedableRng};

use crate::sidecar::{
    drained, metric, payload, raw_config, scrape, Recorder, Running, CHANNEL, TOPIC,
};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::http::{Answer as HttpAnswer, HttpServer};
use crate::support::lookupd::Lookupd;
use crate::support::memcached::MemcachedServer;
use crate::util::wait_until_or;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_stream_reaches_the_sink_exactly_once() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut order_b: Vec<usize> = (0..10_000).collect();
    rand::seq::SliceRandom::shuffle(&mut order_b[..], &mut rng);
    a.publish_many(TOPIC, (0..10_000).map(payload));
    b.publish_many(TOPIC, order_b.iter().map(|&i| payload(i)));
    a.publish_many(TOPIC, (10_000..10_500).map(payload));

    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            r.deliver(body);
            Ok::<(), HandlerError>(())
        }
    })
    .await;
    wait_until_or(
        "10 500 distinct payloads and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == 10_500 && drained(&a) && drained(&b),
        || {
            format!(
                "{} distinct, depths {:?} {:?}",
                recorder.distinct_delivered(),
                a.depth(TOPIC, CHANNEL),
                b.depth(TOPIC, CHANNEL)
            )
        },
    )
    .await;
    let text = scrape(running.metrics_addr.unwrap());
    let metrics_addr = running.metrics_addr.unwrap();
    wait_until_or(
        "the connection gauge counts both nsqd",
        Duration::from_secs(5),
        || metric(&scrape(metrics_addr), "nsq_dedupe_nsqd_connections") == Some(2.0),
        || scrape(metrics_addr),
    )
    .await;
    let report = running.stop().await;

    let delivered = recorder.delivered();
    let twice: Vec<_> = delivered.iter().filter(|(_, &n)| n != 1).collect();
    assert!(
        twice.is_empty(),
        "{} payloads delivered more than once, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    for i in 0..10_500 {
        assert_eq!(delivered.get(&payload(i)), Some(&1), "payload {i}");
    }
    let m = &running_metrics(&text);
    assert_eq!(m("nsq_dedupe_unique_total"), 10_500.0);
    assert_eq!(m("nsq_dedupe_handler_successes_total"), 10_500.0);
    assert_eq!(
        m("nsq_dedupe_duplicates_total") + m("nsq_dedupe_unique_total"),
        20_500.0,
        "every message was either delivered or a duplicate"
    );
    // Received counts deliveries: copies requeued because they were in flight come back.
    let received = |addr: SocketAddr| m(&format!("nsq_dedupe_received_total{{source=\"{addr}\"}}"));
    assert!(received(a.tcp_addr()) >= 10_500.0 && received(b.tcp_addr()) >= 10_000.0);
    assert_eq!(
        received(a.tcp_addr()) + received(b.tcp_addr()),
        20_500.0 + m("nsq_dedupe_in_flight_requeues_total")
    );
    assert!(text.contains("nsq_dedupe_catch_probability "));
    assert!(report.shutdown.clean, "{report:?}");
}

fn running_metrics(text: &str) -> impl Fn(&str) -> f64 + '_ {
    move |name| metric(text, name).unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_sink_gets_every_payload_at_least_once() {
    flaky_sink(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_sink_with_memcached_gets_every_payload_at_least_once() {
    let memcached = MemcachedServer::start();
    flaky_sink(Some(&memcached)).await;
}

/// A sink failing 10% of calls at random, two replicated nsqd, the in-process table or
/// `memcached`.
async fn flaky_sink(memcached: Option<&MemcachedServer>) {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).rev().map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.source.max_attempts = Some(50);
    let store = match memcached {
        Some(server) => {
            raw.store.kind = Some(StoreKind::Memcached);
            raw.store.memcached_addresses = Some(vec![server.addr()]);
            raw.store.buckets = Some(1 << 16);
            "memcached"
        }
        None => "memory",
    };
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(10)));
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        let fail = rng.lock().unwrap().gen_bool(0.1);
        async move {
            r.call(&body);
            if fail {
                return Err(HandlerError::Retry("flaky sink: injected failure".into()));
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "every payload delivered and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&a) && drained(&b),
        || {
            format!(
                "{} distinct delivered, depths {:?} {:?}, clients {:?} {:?}, stats {:?} {:?}\n{}",
                recorder.distinct_delivered(),
                a.depth(TOPIC, CHANNEL),
                b.depth(TOPIC, CHANNEL),
                a.clients()
                    .iter()
                    .map(|c| (c.rdy, c.in_flight))
                    .collect::<Vec<_>>(),
                b.clients()
                    .iter()
                    .map(|c| (c.rdy, c.in_flight))
                    .collect::<Vec<_>>(),
                a.stats(),
                b.stats(),
                scrape(running.metrics_addr.unwrap())
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.contains("_bucket"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        },
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(
            delivered.get(&payload(i)).copied().unwrap_or(0) >= 1,
            "payload {i} never delivered"
        );
    }
    let total: u32 = delivered.values().sum();
    let failures: u32 = recorder.calls().values().sum::<u32>() - total;
    let extra = total as usize - N;
    println!(
        "flaky sink, {store} store: {N} distinct payloads (each published to 2 nsqd), {failures} injected failures, {total} deliveries, {extra} extra deliveries ({:.2}%)",
        100.0 * extra as f64 / N as f64
    );
    assert!(
        failures > 0,
        "the sink never failed, so the test proved nothing"
    );
    assert_eq!(get(&metrics.handler_failures), u64::from(failures));
    assert_eq!(get(&metrics.dead_lettered), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_is_touched_not_redelivered() {
    let a = Broker::start(BrokerConfig::default()).await;
    const N: usize = 20;
    a.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(1)));
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            // Two and a half message timeouts.
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "every slow payload delivered and the broker drained",
        Duration::from_secs(20),
        || recorder.distinct_delivered() == N && drained(&a),
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    for (body, n) in recorder.calls() {
        assert_eq!(n, 1, "{body:?} handled {n} times");
    }
    assert_eq!(recorder.calls().len(), N);
    let stats = a.stats();
    assert_eq!(
        stats.timeouts, 0,
        "nsqd timed a message out despite TOUCH: {stats:?}"
    );
    assert!(stats.touch_ok >= N as u64, "{stats:?}");
    assert_eq!(stats.fin_ok, N as u64);
    assert!(get(&metrics.touches) >= N as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_the_key_pass_as_unique_and_are_counted() {
    let a = Broker::start(BrokerConfig::default()).await;
    let keyless: Vec<Bytes> = vec![
        Bytes::from_static(b"not json at all"),
        Bytes::from_static(b"{\"other\":1}"),
        Bytes::from_static(b"{\"other\":1}"),
        Bytes::from_static(b"\xff\xfe binary"),
    ];
    a.publish_many(TOPIC, keyless.iter().cloned());
    a.publish_many(TOPIC, [payload(1), payload(1), payload(2)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.dedupe.key = Some("json:/id".into());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(settings, recorder.clone()).await;
    wait_until_or(
        "7 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 7,
        || format!("{:?}", a.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    // Keyless bodies are never de-duplicated: both `{"other":1}` arrive.
    assert_eq!(delivered.get(&keyless[1]), Some(&2));
    assert_eq!(delivered.get(&keyless[0]), Some(&1));
    assert_eq!(delivered.get(&keyless[3]), Some(&1));
    assert_eq!(delivered.get(&payload(1)), Some(&1));
    assert_eq!(delivered.get(&payload(2)), Some(&1));
    assert_eq!(get(&metrics.keyless), 4);
    assert_eq!(get(&metrics.duplicates), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_not_stuck() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2)]);
    let raw = raw_config(&[a.tcp_addr()]);
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(raw.validate().unwrap(), move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            if body == payload(1) && r.calls().get(&body) == Some(&1) {
                panic!("handler bug on the first try");
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "both delivered",
        Duration::from_secs(10),
        || recorder.distinct_delivered() == 2 && a.stats().fin_ok == 2,
        || format!("{:?}", recorder.calls()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(recorder.calls().get(&payload(1)), Some(&2));
    assert_eq!(get(&metrics.handler_failures), 1);
    assert_eq!(get(&metrics.erased), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_lets_a_body_sent_again_later_pass() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.dedupe.max_age = Some(nsq_dedupe::config::Dur(Duration::from_secs(1)));
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    let total = |n: u32| {
        let recorder = recorder.clone();
        move || recorder.delivered().values().sum::<u32>() == n
    };
    // The original and an immediate copy: one delivery.
    broker.publish_many(TOPIC, [payload(1), payload(1)]);
    crate::util::wait_until("the first delivery", Duration::from_secs(10), total(1)).await;
    crate::util::wait_until("both finished", Duration::from_secs(10), || {
        broker.finished(TOPIC, CHANNEL).len() == 2
    })
    .await;
    // The same body two seconds later, on purpose: it passes; its own copy does not.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    broker.publish_many(TOPIC, [payload(1), payload(1)]);
    crate::util::wait_until("every message finished", Duration::from_secs(10), || {
        broker.finished(TOPIC, CHANNEL).len() == 4
    })
    .await;
    running.stop().await;
    assert_eq!(recorder.delivered().get(&payload(1)), Some(&2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_in_flight_are_finished_with_policy_finish() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..20).map(payload));
    b.publish_many(TOPIC, (0..20).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.dedupe.on_in_flight = Some(nsq_dedupe::pipeline::InFlightPolicy::Finish);
    raw.dedupe.in_flight_requeue_delay = None;
    let recorder = Recorder::default();
    // Slow enough that the copy from the other nsqd arrives while this one runs.
    let handler = recorder.delivering_after(Duration::from_millis(300));
    let running = Running::start(raw.validate().unwrap(), handler).await;
    wait_until_or(
        "both drained",
        Duration::from_secs(20),
        || drained(&a) && drained(&b) && a.stats().fin_ok + b.stats().fin_ok == 40,
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(recorder.distinct_delivered(), 20);
    assert!(recorder.delivered().values().all(|&n| n == 1));
    assert!(
        get(&metrics.in_flight_finished) > 0,
        "no copy was found in flight"
    );
    assert_eq!(get(&metrics.in_flight_requeues), 0);
    let fins = a.stats().fin_ok + b.stats().fin_ok;
    assert_eq!((fins, a.stats().req_ok + b.stats().req_ok), (40, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsqd_found_through_lookupd() {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let lookupd = Lookupd::start().await;
    lookupd.set_producers(TOPIC, &[a.tcp_addr(), b.tcp_addr()]);
    a.publish_many(TOPIC, (0..100).map(payload));
    b.publish_many(TOPIC, (0..100).map(payload));
    let mut raw = raw_config(&[]);
    raw.source.nsqd_tcp_addresses = None;
    raw.source.lookupd_http_addresses = Some(vec![format!("http://{}", lookupd.http_addr())]);
    raw.source.lookupd_poll_interval = Some(Dur(Duration::from_millis(200)));
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    wait_until_or(
        "both nsqd drained",
        Duration::from_secs(20),
        || drained(&a) && drained(&b) && a.stats().fin_ok == 100 && b.stats().fin_ok == 100,
        || format!("{} delivered", recorder.distinct_delivered()),
    )
    .await;
    running.stop().await;
    assert!(recorder.delivered().values().all(|&n| n == 1));
    assert!(lookupd.lookups() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_the_requeue_back_that_long() {
    let server = HttpServer::start(HttpAnswer {
        first_statuses: vec![429],
        retry_after: Some("2"),
        ..HttpAnswer::default()
    })
    .await;
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.sink.kind = Some(SinkKind::Http);
    raw.sink.post = Some(OneOrMany::One(format!("http://{}/", server.addr)));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "the body POSTed twice and the broker drained",
        Duration::from_secs(20),
        || server.received().len() == 2 && drained(&a),
        || format!("{} POSTed", server.received().len()),
    )
    .await;
    running.stop().await;
    let records = a.records(TOPIC, CHANNEL);
    let requeues = &records
        .iter()
        .find(|r| r.body == payload(1))
        .unwrap()
        .requeued_at;
    assert_eq!(requeues.len(), 1);
    // The configured backoff is 10 ms; the server asked for 2 s.
    assert!(requeues[0].1 >= Duration::from_secs(2), "{requeues:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_past_max_attempts_goes_to_the_dead_letter_topic_then_fin() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.source.max_attempts = Some(3);
    raw.dead_letter = Some(toml::from_str("kind = \"nsq\"\ntopic = \"events.dead\"\n").unwrap());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let r = recorder.clone();
    let running = Running::start(settings, move |body: Bytes| {
        let r = r.clone();
        async move {
            r.call(&body);
            if body == payload(1) {
                return Err(HandlerError::Retry("always fails".into()));
            }
            r.deliver(body);
            Ok(())
        }
    })
    .await;
    wait_until_or(
        "payload 1 dead-lettered and the broker drained",
        Duration::from_secs(20),
        || a.messages_on("events.dead").len() == 1 && drained(&a),
        || format!("{:?} {:?}", a.depth(TOPIC, CHANNEL), recorder.calls()),
    )
    .await;
    running.stop().await;
    assert_eq!(a.messages_on("events.dead"), [payload(1)]);
    assert_eq!(
        recorder.calls().get(&payload(1)),
        Some(&3),
        "tried max_attempts times"
    );
    assert_eq!(recorder.delivered().get(&payload(2)), Some(&1));
    let records = a.records(TOPIC, CHANNEL);
    let failed = records.iter().find(|r| r.body == payload(1)).unwrap();
    assert_eq!((failed.req_ok, failed.fin_ok), (2, 1), "{failed:?}");
}
