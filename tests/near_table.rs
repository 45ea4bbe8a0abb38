//! The near-table in front of Memcached (`store.near_table`): copies this process committed
//! are answered without a round trip (counted by Memcached's own `stats`), still caught while
//! Memcached is down, and two consumers sharing Memcached still get one `New` per digest.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use nsq_dedupe::config::StoreSettings;
use nsq_dedupe::dedup::backend::Backend;
use nsq_dedupe::sidecar::build_store;
use nsq_dedupe::{Claim, Digest, Geometry, MemcachedConfig, Store};

use crate::support::memcached::MemcachedServer;
use crate::util::claimed;

fn digest(n: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
}

fn settings(server: &MemcachedServer, namespace: &str) -> StoreSettings {
    StoreSettings::Memcached(
        MemcachedConfig {
            servers: vec![server.addr()],
            namespace: namespace.to_owned(),
            timeout: Duration::from_millis(500),
            ..MemcachedConfig::default()
        },
        Geometry::new(1 << 14, 8).unwrap(),
    )
}

/// Memcached's count of get and set commands (meta commands included).
fn round_trips(server: &MemcachedServer) -> u64 {
    let mut stream = std::net::TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"stats\r\nquit\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    ["cmd_get", "cmd_set"]
        .iter()
        .map(|name| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in stats: {text}"))
        })
        .sum()
}

async fn claim_all(store: &Backend, range: std::ops::Range<u64>) -> Vec<Claim> {
    let mut claims = Vec::new();
    for n in range {
        claims.push(store.claim(digest(n)).await.unwrap());
    }
    claims
}

#[tokio::test]
async fn own_copies_skip_memcached_and_survive_its_outage() {
    let mut server = MemcachedServer::start();
    let near = Some(Geometry::new(1 << 12, 8).unwrap());
    let store = build_store(&settings(&server, "near-own"), near, None)
        .await
        .unwrap();
    let plain = build_store(&settings(&server, "near-own"), None, None)
        .await
        .unwrap();
    assert!(claim_all(&store, 0..100)
        .await
        .iter()
        .all(|c| *c == Claim::New));
    for n in 0..100 {
        assert!(store.commit(digest(n)).await.unwrap());
    }
    // The copies: from the near-table, with no command reaching Memcached.
    let before = round_trips(&server);
    assert!(claim_all(&store, 0..100)
        .await
        .iter()
        .all(|c| *c == Claim::Duplicate));
    assert_eq!(round_trips(&server), before, "no round trip for own copies");
    // The same claims without a near-table do reach Memcached (the count is not blind).
    assert!(claim_all(&plain, 0..100)
        .await
        .iter()
        .all(|c| *c == Claim::Duplicate));
    assert!(round_trips(&server) >= before + 100);
    // A batch mixing own copies and new digests asks Memcached for the new ones only.
    let batch: Vec<Digest> = (90..110).map(digest).collect();
    let claims = claimed(store.claim_many(&batch).await).unwrap();
    assert_eq!(&claims[..10], &[Claim::Duplicate; 10]);
    assert_eq!(&claims[10..], &[Claim::New; 10]);

    server.stop();
    assert!(claim_all(&store, 0..100)
        .await
        .iter()
        .all(|c| *c == Claim::Duplicate));
    assert!(
        store.claim(digest(1000)).await.is_err(),
        "others need Memcached"
    );
    let stats = store.near_stats().unwrap();
    assert_eq!((stats.hits, stats.misses), (210, 100 + 10 + 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_with_near_tables_get_one_new_per_digest() {
    let server = MemcachedServer::start();
    let near = Some(Geometry::new(1 << 12, 8).unwrap());
    let a = Arc::new(
        build_store(&settings(&server, "near-two"), near, None)
            .await
            .unwrap(),
    );
    let b = Arc::new(
        build_store(&settings(&server, "near-two"), near, None)
            .await
            .unwrap(),
    );
    let consume = |store: Arc<Backend>| {
        tokio::spawn(async move {
            let mut new = 0;
            // Each digest twice, as a replicated stream delivers it.
            for _copy in 0..2 {
                for n in 0..500u64 {
                    let d = digest(n);
                    if store.claim(d).await.unwrap() == Claim::New {
                        new += 1;
                        assert!(store.commit(d).await.unwrap());
                    }
                }
            }
            new
        })
    };
    let (x, y) = (consume(a.clone()), consume(b.clone()));
    let total = x.await.unwrap() + y.await.unwrap();
    assert_eq!(total, 500, "one New per digest over both consumers");
    let hits = a.near_stats().unwrap().hits + b.near_stats().unwrap().hits;
    assert!(
        hits > 0,
        "each consumer caught some of its own copies locally"
    );
}

/// Memcached round trips per message and claims per second, with and without a near-table, on
/// a stream where every body arrives twice (50% copies), the copy after its original was
/// committed; 16 tasks claim and commit concurrently, as a sidecar's handlers do. Store level:
/// no broker, no sink.
///
/// `cargo test --release --test integration near_table::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: u64 = 100_000;
    const TASKS: u64 = 16;
    let server = MemcachedServer::start();
    for round in 0..2 {
        for near in [None, Some(Geometry::with_memory(16 << 20, 8).unwrap())] {
            let namespace = format!("near-bench-{round}-{}", near.is_some());
            let store = Arc::new(
                build_store(&settings(&server, &namespace), near, None)
                    .await
                    .unwrap(),
            );
            let before = round_trips(&server);
            let started = std::time::Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        // Each task's bodies: original, then its copy once committed.
                        for n in (t..N).step_by(TASKS as usize) {
                            let d = digest(n + round * N);
                            assert_eq!(store.claim(d).await.unwrap(), Claim::New);
                            store.commit(d).await.unwrap();
                            assert_eq!(store.claim(d).await.unwrap(), Claim::Duplicate);
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let took = started.elapsed();
            let trips = round_trips(&server) - before;
            println!(
                "near-table {:>5}: {:.2} Memcached commands per message, {:.0} messages/s",
                if near.is_some() { "16MiB" } else { "off" },
                trips as f64 / (2 * N) as f64,
                (2 * N) as f64 / took.as_secs_f64()
            );
        }
    }
}
