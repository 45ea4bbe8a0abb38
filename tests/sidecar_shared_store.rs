//! The sidecar with a shared store: a Memcached outage and a server dead for good lose
//! nothing, the `process` policy delivers through store errors, a crash of the binary and its
//! restart lose nothing, and sidecars sharing a table each report the fleet's distinct rate.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nsq_dedupe::config::{Dur, RawConfig, StoreKind};
use nsq_dedupe::metrics::get;

use crate::sidecar::{
    drained, metric, payload, raw_config, scrape, spawn_sidecar, wait_all_delivered, ChildGuard,
    Recorder, Running, CHANNEL, TOPIC,
};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;
use crate::util::wait_until_or;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_outage_with_requeue_loses_nothing() {
    let mut memcached = MemcachedServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 3_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.source.max_in_flight = Some(20);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![memcached.addr()]);
    raw.store.buckets = Some(1 << 16);
    raw.store.timeout = Some(Dur(Duration::from_millis(200)));
    raw.source.max_attempts = Some(1000);
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(
        settings,
        recorder.delivering_after(Duration::from_millis(2)),
    )
    .await;
    wait_until_or(
        "300 deliveries before the outage",
        Duration::from_secs(30),
        || recorder.distinct_delivered() >= 300,
        String::new,
    )
    .await;
    memcached.stop();
    let at_stop = recorder.distinct_delivered();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let during = recorder.distinct_delivered();
    memcached.restart();
    wait_all_delivered(&recorder, &[&a, &b], N, " after memcached came back").await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(delivered.contains_key(&payload(i)), "payload {i} lost");
    }
    let extra: u32 = delivered.values().sum::<u32>() - N as u32;
    println!(
        "memcached outage: {at_stop} delivered at stop, {during} after 1.5 s down, {} store errors, {} requeued for store errors, {extra} extra deliveries (the restart emptied the table)",
        get(&metrics.store_errors),
        get(&metrics.store_error_requeues)
    );
    assert!(get(&metrics.store_errors) > 0, "the outage was not noticed");
    assert!(get(&metrics.store_error_requeues) > 0);
    assert!(
        during - at_stop < 100,
        "with policy requeue, little is delivered while the store is down ({at_stop} -> {during})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memcached_server_dead_for_good_is_ejected_and_stalls_nothing() {
    let one = MemcachedServer::start();
    let mut two = MemcachedServer::start();
    let broker = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.source.max_in_flight = Some(20);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![one.addr(), two.addr()]);
    raw.store.buckets = Some(1 << 16);
    raw.store.timeout = Some(Dur(Duration::from_millis(200)));
    raw.store.eject_after = Some("1s".into());
    raw.source.max_attempts = Some(1000);
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let running = Running::start(
        settings,
        recorder.delivering_after(Duration::from_millis(2)),
    )
    .await;
    wait_until_or(
        "300 deliveries before the outage",
        Duration::from_secs(30),
        || recorder.distinct_delivered() >= 300,
        String::new,
    )
    .await;
    two.stop();
    // Without ejection, half of the rest would be requeued for as long as server two is down
    // (for ever here). With it, everything is delivered a few requeue delays after `1s`.
    wait_until_or(
        "every payload delivered with server two dead",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&broker),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
    let page = scrape(running.metrics_addr.expect("metrics are served"));
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(delivered.contains_key(&payload(i)), "payload {i} lost");
    }
    assert_eq!(
        metric(&page, "nsq_dedupe_store_ejections_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(metric(&page, "nsq_dedupe_store_returns_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_error_policy_process_delivers_without_de_duplication() {
    // Nothing listens on this port: every claim fails fast with a store error.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2), payload(1)]);
    let mut raw = raw_config(&[a.tcp_addr()]);
    raw.store.kind = Some(StoreKind::Memcached);
    raw.store.memcached_addresses = Some(vec![dead.to_string()]);
    raw.store.timeout = Some(Dur(Duration::from_millis(100)));
    raw.dedupe.on_store_error = Some(nsq_dedupe::pipeline::StoreErrorPolicy::Process);
    raw.dedupe.store_error_requeue_delay = None;
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    wait_until_or(
        "3 messages finished",
        Duration::from_secs(20),
        || a.stats().fin_ok == 3,
        || format!("{:?}", a.stats()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    // Duplicates possible, nothing lost: the copy of payload 1 is delivered too.
    assert_eq!(recorder.delivered().get(&payload(1)), Some(&2));
    assert_eq!(recorder.delivered().get(&payload(2)), Some(&1));
    assert_eq!(get(&metrics.store_error_processed), 3);
    assert!(get(&metrics.store_errors) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_sharing_memcached_each_report_the_fleets_distinct_rate() {
    let memcached = MemcachedServer::start();
    sidecars_sharing_a_store_report_the_fleets_distinct_rate(|raw| {
        raw.store.kind = Some(StoreKind::Memcached);
        raw.store.memcached_addresses = Some(vec![memcached.addr()]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_sharing_redis_each_report_the_fleets_distinct_rate() {
    let redis = RedisServer::start();
    sidecars_sharing_a_store_report_the_fleets_distinct_rate(|raw| {
        raw.store.kind = Some(StoreKind::Redis);
        raw.store.redis_urls = Some(vec![redis.url()]);
    })
    .await;
}

/// Two sidecars share one table (the store `shared` configures), each reading its own nsqd:
/// 600 and 300 distinct messages a second. Each reports the fleet's 900 as `distinct_rate`,
/// within 10% (810 to 990); a sidecar that reported its own share (600 or 300) would be
/// outside.
async fn sidecars_sharing_a_store_report_the_fleets_distinct_rate(shared: impl Fn(&mut RawConfig)) {
    const INTERVAL: Duration = Duration::from_millis(500);
    const TICK: Duration = Duration::from_millis(10);
    // Per tick of 10 ms: 600/s to the first nsqd, 300/s to the second.
    const PER_TICK: [usize; 2] = [6, 3];
    const FLEET: f64 = 900.0;
    let brokers = [
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    ];
    let recorder = Recorder::default();
    let mut sidecars = Vec::new();
    for broker in &brokers {
        let mut raw = raw_config(&[broker.tcp_addr()]);
        shared(&mut raw);
        raw.store.namespace = Some("fleet-rate".into());
        raw.store.buckets = Some(1 << 16);
        raw.store.fleet_interval = Some(Dur(INTERVAL));
        let settings = raw.validate().unwrap();
        sidecars.push(Running::start(settings, recorder.clone()).await);
    }
    wait_until_or(
        "both sidecars subscribed",
        Duration::from_secs(10),
        || brokers.iter().all(|b| !b.clients().is_empty()),
        String::new,
    )
    .await;

    // The rate a sidecar reports covers six whole intervals ending up to two intervals before,
    // and is reported after seven shares: read it at each interval from the 10th of a steady
    // stream of 16. A loaded machine can delay a share into the next interval, which moves the
    // rate of the intervals read by a sixth until it leaves them; so each sidecar is asked to
    // report the fleet's rate in one of the six reads, never its own.
    let intervals = INTERVAL.as_millis() / TICK.as_millis();
    let ticks = 16 * intervals;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    let mut scrapes = Vec::new();
    for t in 0..ticks {
        tick.tick().await;
        for (broker, n) in brokers.iter().zip(PER_TICK) {
            broker.publish_many(TOPIC, (sent..sent + n).map(payload));
            sent += n;
        }
        if t >= 10 * intervals && t % intervals == 0 {
            for (i, sidecar) in sidecars.iter().enumerate() {
                let addr = sidecar.metrics_addr.expect("metrics are served");
                scrapes.push((i, tokio::task::spawn_blocking(move || scrape(addr))));
            }
        }
    }
    wait_until_or(
        "every payload delivered",
        Duration::from_secs(30),
        || recorder.distinct_delivered() == sent,
        || format!("{} of {sent} delivered", recorder.distinct_delivered()),
    )
    .await;
    for sidecar in sidecars {
        sidecar.stop().await;
    }
    let mut rates = vec![Vec::new(); brokers.len()];
    for (i, scrape) in scrapes {
        let page = scrape.await.unwrap();
        rates[i].push(metric(&page, "nsq_dedupe_distinct_rate").expect("distinct_rate is exposed"));
    }
    assert!(
        rates
            .iter()
            .all(|reads| reads.iter().any(|rate| (rate - FLEET).abs() <= FLEET * 0.1)),
        "each sidecar reports the fleet's rate, {FLEET} distinct messages a second, within 10%, \
         in one of its reads: {rates:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_restart_with_memcached_loses_nothing() {
    let memcached = MemcachedServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    const N: usize = 4_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crash.toml");
    let log = dir.path().join("sidecar.log");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
nsqd_tcp_addresses = ["{addr}"]
topic = "{TOPIC}"
channel = "{CHANNEL}"
max_in_flight = 5
msg_timeout = "1s"
heartbeat_interval = "1s"
backoff = "10ms"
max_backoff = "200ms"

[dedupe]
in_flight_requeue_delay = "200ms"

[store]
kind = "memcached"
memcached_addresses = ["{mc}"]
namespace = "crash-test"
buckets = 65536
lease = "1500ms"

[sink]
kind = "nsq"
destination_nsqd_tcp_addresses = ["{addr}"]
destination_topic = "events.unique"

[metrics]
address = "off"

[shutdown]
grace = "2s"
"#,
            addr = a.tcp_addr(),
            mc = memcached.addr()
        ),
    )
    .unwrap();
    let out_count = || a.messages_on("events.unique").len();
    let mut child = ChildGuard(Some(spawn_sidecar(&config, &log)));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "the first 400 republished",
        Duration::from_secs(30),
        || out_count() >= 400,
        log_text,
    )
    .await;
    // SIGKILL: no chance to answer anything; in-flight messages and claims are left behind.
    let mut first = child.0.take().unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = out_count();
    assert!(
        at_kill < N,
        "the whole stream was done before the kill; nothing was tested"
    );
    let mut second = ChildGuard(Some(spawn_sidecar(&config, &log)));
    wait_until_or(
        "every payload republished after the restart",
        Duration::from_secs(60),
        || {
            let out: HashSet<Bytes> = a.messages_on("events.unique").into_iter().collect();
            out.len() == N && drained(&a)
        },
        || {
            format!(
                "{} republished, depth {:?}\n{}",
                out_count(),
                a.depth(TOPIC, CHANNEL),
                log_text()
            )
        },
    )
    .await;
    // A graceful stop: SIGTERM, exit status 0.
    let mut child = second.0.take().unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 15 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "exit status {status:?} after SIGTERM\n{}",
        log_text()
    );
    let out = a.messages_on("events.unique");
    let distinct: HashSet<&Bytes> = out.iter().collect();
    for i in 0..N {
        assert!(distinct.contains(&payload(i)), "payload {i} lost");
    }
    println!(
        "crash: killed after {at_kill} of {N} republished; {} republished in all, {} extra",
        out.len(),
        out.len() - N
    );
    let log = log_text();
    let last_stop = log
        .lines()
        .rfind(|l| l.contains("Sidecar stopped."))
        .unwrap_or_default()
        .to_owned();
    println!("crash: second run's final status: {last_stop}");
    assert!(log.contains("Sidecar stopped."));
}

/// Two channels of one topic, each consumed by its own sidecar, with one Redis server and no
/// namespace given: each channel gets every message. Their tables are their streams' own
/// (`nsq-dedupe.<topic>.<channel>`), so one channel's messages are not taken for copies of
/// the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_channels_sharing_a_store_each_get_every_message() {
    const OTHER: &str = "archive";
    const N: usize = 500;
    let redis = RedisServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let sidecar = |channel: &str| {
        let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
        raw.source.channel = Some(channel.to_owned());
        raw.store.kind = Some(StoreKind::Redis);
        raw.store.redis_urls = Some(vec![redis.url()]);
        raw.store.buckets = Some(1 << 16);
        raw.validate().unwrap()
    };
    let (first, second) = (Recorder::default(), Recorder::default());
    let one = Running::start(sidecar(CHANNEL), first.clone()).await;
    let two = Running::start(sidecar(OTHER), second.clone()).await;
    // Both channels exist before anything is published, on both brokers.
    wait_until_or(
        "both channels subscribed on both brokers",
        Duration::from_secs(10),
        || {
            [&a, &b].iter().all(|broker| {
                let subscribed: HashSet<String> = broker
                    .clients()
                    .into_iter()
                    .filter_map(|client| client.subscription.map(|(_, channel)| channel))
                    .collect();
                subscribed.contains(CHANNEL) && subscribed.contains(OTHER)
            })
        },
        String::new,
    )
    .await;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    wait_until_or(
        "every message delivered on both channels",
        Duration::from_secs(30),
        || first.distinct_delivered() == N && second.distinct_delivered() == N,
        || {
            format!(
                "{} distinct on {CHANNEL}, {} on {OTHER}",
                first.distinct_delivered(),
                second.distinct_delivered()
            )
        },
    )
    .await;
    one.stop().await;
    two.stop().await;
}
