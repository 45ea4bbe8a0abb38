//! The nsq sink through the sidecar, to a second test broker: each unique body published once,
//! in batches; a failed batch requeued whole; a dead destination failed over to the next.

use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::SinkKind;

use crate::sidecar::{drained, payload, raw_config, Running, CHANNEL, TOPIC, UNIQUE_TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::util::wait_until_or;

/// Runs the sidecar from `source` to the nsq sink on `destinations`, with each of 1,000 bodies
/// published twice to `source`; returns once every message is decided.
async fn republish_through_nsq_sink(source: &Broker, destinations: &[String]) {
    source.publish_many(TOPIC, (0..2000).map(|i| payload(i % 1000)));
    let mut raw = raw_config(&[source.tcp_addr()]);
    raw.source.max_in_flight = Some(1000);
    raw.sink.kind = Some(SinkKind::Nsq);
    raw.sink.destination_nsqd_tcp_addresses = Some(destinations.to_vec());
    raw.sink.destination_topic = Some(UNIQUE_TOPIC.into());
    let running = Running::start_configured(raw.validate().unwrap()).await;
    wait_until_or(
        "all 2,000 messages decided",
        Duration::from_secs(60),
        || source.stats().fin_ok == 2000 && drained(source),
        || format!("{:?} {:?}", source.stats(), source.depth(TOPIC, CHANNEL)),
    )
    .await;
    running.stop().await;
}

/// Each of the 1,000 distinct bodies exactly once on `destination`.
fn assert_each_once(destination: &Broker) {
    let mut published = destination.messages_on(UNIQUE_TOPIC);
    published.sort();
    let mut expected: Vec<Bytes> = (0..1000).map(payload).collect();
    expected.sort();
    assert_eq!(published.len(), 1000, "duplicates or losses downstream");
    assert_eq!(published, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsq_sink_publishes_each_unique_body_once_in_batches() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    republish_through_nsq_sink(&a, &[b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
    let stats = b.stats();
    assert!(stats.mpub_commands >= 1, "{stats:?}");
    assert!(
        stats.pub_commands + stats.mpub_commands < 500,
        "1,000 records took {} PUB and {} MPUB",
        stats.pub_commands,
        stats.mpub_commands
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_requeues_every_record_of_it_and_loses_none() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    // The first five publishes (whole batches) fail with E_MPUB_FAILED / E_PUB_FAILED.
    b.fail_publishes(5);
    republish_through_nsq_sink(&a, &[b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
    assert!(a.stats().req_ok >= 5, "{:?}", a.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_fail_over_to_the_next_destination() {
    let (a, b) = (
        Broker::start(BrokerConfig::default()).await,
        Broker::start(BrokerConfig::default()).await,
    );
    // Nothing listens on the first destination.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    republish_through_nsq_sink(&a, &[dead_addr, b.tcp_addr().to_string()]).await;
    assert_each_once(&b);
}
