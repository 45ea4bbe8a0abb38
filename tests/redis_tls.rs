//! The Redis store over TLS (`rediss://`) against a real `redis-server` that serves only TLS,
//! with a certificate signed by a CA made for the test: trusted through `tls_root_ca_file`,
//! refused without it, and a sidecar sharing the table through it.

use std::time::Duration;

use nsq_dedupe::config::StoreKind;
use nsq_dedupe::metrics::get;
use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, RedisStore, Store};

use crate::sidecar::{payload, raw_config, wait_all_delivered, Recorder, Running, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::redis::RedisServer;
use crate::support::wire::Pki;

/// A server listening for TLS only on its port, with `pki`'s server certificate.
fn tls_server(pki: &Pki) -> RedisServer {
    let (cert, key) = pki.server_files();
    RedisServer::start_with_args(&[
        "--port",
        "0",
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-auth-clients",
        "no",
    ])
}

fn digest(n: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
}

#[tokio::test]
async fn a_tls_redis_is_trusted_through_the_root_ca_file_and_refused_without_it() {
    let pki = Pki::new();
    let server = tls_server(&pki);
    let url = format!("rediss://{}", server.addr());
    let config = |ca: Option<std::path::PathBuf>| RedisConfig {
        urls: vec![url.clone()],
        namespace: format!("tls-{}", std::process::id()),
        timeout: Duration::from_secs(2),
        tls_root_ca_file: ca,
        ..RedisConfig::default()
    };
    let geometry = Geometry::new(64, 4).unwrap();

    let store = RedisStore::connect(config(Some(pki.ca_file())), geometry)
        .await
        .unwrap();
    assert_eq!(store.claim(digest(1)).await.unwrap(), Claim::New);
    assert!(store.commit(digest(1)).await.unwrap());
    assert_eq!(store.claim(digest(1)).await.unwrap(), Claim::Duplicate);
    assert_eq!(store.claim(digest(2)).await.unwrap(), Claim::New);

    // A certificate signed by a CA the client does not trust is refused at connect, with the
    // server named and the reason kept.
    for ca in [Some(pki.other_ca_file()), None] {
        let refused = RedisStore::connect(config(ca.clone()), geometry)
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains(&server.addr()), "{ca:?}: {refused}");
        assert!(
            refused.to_lowercase().contains("certificate"),
            "{ca:?}: {refused}"
        );
    }
    // A plain connection to the TLS port fails within the store's time limit, not later.
    let started = std::time::Instant::now();
    let plain = RedisConfig {
        urls: vec![format!("redis://{}", server.addr())],
        ..config(None)
    };
    assert!(RedisStore::connect(plain, geometry).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_shares_its_table_through_a_tls_redis() {
    let pki = Pki::new();
    let server = tls_server(&pki);
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 500;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.store.kind = Some(StoreKind::Redis);
    raw.store.redis_urls = Some(vec![format!("rediss://{}", server.addr())]);
    raw.store.redis_tls_root_ca_file = Some(pki.ca_file());
    raw.store.namespace = Some(format!("tls-sidecar-{}", std::process::id()));
    raw.store.buckets = Some(1 << 14);
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    wait_all_delivered(&recorder, &[&a, &b], N, "").await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert_eq!(delivered.get(&payload(i)), Some(&1), "payload {i}");
    }
    assert_eq!(get(&metrics.unique), N as u64, "in: 2N messages, out: N");
    assert_eq!(get(&metrics.duplicates), N as u64);
    assert_eq!(get(&metrics.store_errors), 0);
}
