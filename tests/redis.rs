//! The Redis-backed table against real `redis-server` processes that each test starts itself:
//! standalone, and a cluster of three masters with a replica each (resharded and failed over
//! while claims run).
//!
//! Time limits are generous (2 s per operation) because tests run as debug builds on shared
//! machines; the outage tests set short limits and check them. Every wait is bounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::net::SocketAddr;

use nsq_dedupe::config::{Dur, StoreKind};
use nsq_dedupe::error::StoreError;
use nsq_dedupe::metrics::get;
use nsq_dedupe::pipeline::StoreErrorPolicy;
use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, RedisStore, Store};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::sidecar::{drained, payload, raw_config, Recorder, Running, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::{RedisCluster, RedisServer};
use crate::util::{claim_until_answered, claimed, wait_until_or};

/// A namespace no other test uses.
fn unique_namespace(tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn config(urls: &[String], cluster: bool, namespace: &str) -> RedisConfig {
    RedisConfig {
        urls: urls.to_vec(),
        cluster,
        namespace: namespace.to_owned(),
        timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

fn digest(n: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Two digests of one set of `geometry`.
fn same_set_pair(geometry: Geometry) -> (Digest, Digest) {
    let first = digest(1_000);
    let set = geometry.set_of(first);
    let second = (1_001..)
        .map(digest)
        .find(|d| geometry.set_of(*d) == set)
        .expect("another digest of the set");
    (first, second)
}

async fn two_stores(config: RedisConfig, geometry: Geometry) -> (RedisStore, RedisStore) {
    let a = RedisStore::connect(config.clone(), geometry).await.unwrap();
    let b = RedisStore::connect(config, geometry).await.unwrap();
    (a, b)
}

/// The raw value of `key`, read with a client of its own.
async fn raw_get(url: &str, key: &str) -> Option<Vec<u8>> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The operations' rules on one server.

#[tokio::test]
async fn commit_and_erase_touch_only_the_callers_own_entry() {
    let server = RedisServer::start();
    let namespace = unique_namespace("owner");
    let geometry = Geometry::new(64, 4).unwrap();
    let (a, b) = two_stores(config(&[server.url()], false, &namespace), geometry).await;
    let (d, e) = same_set_pair(geometry);
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert_eq!(b.claim(e).await.unwrap(), Claim::New);
    assert_eq!(b.claim(d).await.unwrap(), Claim::InFlight);
    assert!(!b.commit(d).await.unwrap(), "b does not own d");
    assert!(!b.erase(d).await.unwrap());
    assert!(!b.renew(d).await.unwrap());
    assert!(a.commit(d).await.unwrap());
    assert_eq!(b.claim(d).await.unwrap(), Claim::Duplicate);
    assert_eq!(
        a.claim(e).await.unwrap(),
        Claim::InFlight,
        "a's commit left b's entry in the same set as it was"
    );
    assert!(!a.erase(e).await.unwrap());
    assert!(b.erase(e).await.unwrap());
    assert_eq!(
        b.claim(d).await.unwrap(),
        Claim::Duplicate,
        "b's erase left a's entry"
    );
    assert_eq!(
        a.claim(e).await.unwrap(),
        Claim::New,
        "erased: claimable again"
    );
    assert!(
        b.commit(d).await.unwrap(),
        "committing a done entry is a harmless no-op"
    );
    // One key per set (key format 2): version, cursor, ways, then 34 bytes per slot at its
    // fixed offset, as many slots as have been filled.
    let value = raw_get(&server.url(), &a.set_key(d))
        .await
        .expect("the set's key");
    assert_eq!(a.set_key(d), b.set_key(e));
    assert_eq!(&value[..3], &[1, 0, 4]);
    assert_eq!(value.len(), 3 + 2 * 34);
    assert!(a.set_key(d).starts_with(&format!("{namespace}:v2:16x4:")));
    assert_eq!(a.unreadable_values(), 0);
}

#[tokio::test]
async fn replacement_follows_the_in_process_table() {
    let server = RedisServer::start();
    let namespace = unique_namespace("fifo");
    let geometry = Geometry::new(2, 2).unwrap();
    let store = RedisStore::connect(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let digests: Vec<Digest> = (0..3).map(digest).collect();
    let claims = claimed(store.claim_many(&digests).await).unwrap();
    assert_eq!(claims, [Claim::New; 3]);
    // Two ways: the third digest pushed out the first (FIFO); the second is still held.
    assert_eq!(store.claim(digests[1]).await.unwrap(), Claim::InFlight);
    assert_eq!(store.claim(digests[0]).await.unwrap(), Claim::New);
    // The first took the second's slot (the cursor's); the second comes back in the third's.
    assert_eq!(
        claimed(store.claim_many(&[digests[1], digests[1]]).await).unwrap(),
        [Claim::New, Claim::InFlight],
        "pushed out by the first; a batch's repeat is in flight"
    );
    assert_eq!(store.claim(digests[2]).await.unwrap(), Claim::New);
}

#[tokio::test]
async fn a_dead_consumers_claim_expires_and_the_redelivery_passes() {
    let server = RedisServer::start();
    let namespace = unique_namespace("lease");
    let geometry = Geometry::new(64, 4).unwrap();
    let short = RedisConfig {
        lease: Duration::from_millis(800),
        ..config(&[server.url()], false, &namespace)
    };
    let (dead, b) = two_stores(short, geometry).await;
    let d = digest(1);
    assert_eq!(dead.claim(d).await.unwrap(), Claim::New);
    assert_eq!(b.claim(d).await.unwrap(), Claim::InFlight, "lease is live");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(b.claim(d).await.unwrap(), Claim::New, "taken over");
    assert!(!dead.commit(d).await.unwrap(), "the old owner lost it");
    assert!(b.renew(d).await.unwrap());
    assert!(b.commit(d).await.unwrap());
    assert_eq!(dead.claim(d).await.unwrap(), Claim::Duplicate);
}

#[tokio::test]
async fn max_age_lets_a_committed_digest_pass_once_older() {
    let server = RedisServer::start();
    let namespace = unique_namespace("max-age");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = RedisStore::connect(
        RedisConfig {
            max_age: Some(Duration::from_millis(600)),
            ..config(&[server.url()], false, &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    let d = digest(9);
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert!(store.commit(d).await.unwrap());
    assert_eq!(store.claim(d).await.unwrap(), Claim::Duplicate);
    let value = raw_get(&server.url(), &store.set_key(d)).await.unwrap();
    assert_eq!(value[0], 2, "timed format with max_age");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        store.claim(d).await.unwrap(),
        Claim::New,
        "older than max_age"
    );
    assert_eq!(store.claim(d).await.unwrap(), Claim::InFlight);
}

#[tokio::test]
async fn unreadable_value_is_counted_and_replaced() {
    let server = RedisServer::start();
    let namespace = unique_namespace("garbage");
    let geometry = Geometry::new(8, 2).unwrap();
    let store = RedisStore::connect(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let d = digest(5);
    server.cli(&["set", &store.set_key(d), "hello world"]);
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert_eq!(store.unreadable_values(), 1);
    assert_eq!(store.claim(d).await.unwrap(), Claim::InFlight);
    assert_eq!(store.unreadable_values(), 1, "replaced by a readable set");
}

#[tokio::test]
async fn a_burst_whose_script_fails_writes_nothing_and_the_retry_passes() {
    let server = RedisServer::start();
    let namespace = unique_namespace("failed-burst");
    // 512 sets of 8 ways: no digest of the burst pushes out another.
    let geometry = Geometry::new(4096, 8).unwrap();
    let store = RedisStore::connect(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let burst: Vec<Digest> = (0..40).map(digest).collect();
    // One set's key holds a list: the script cannot read it, so the burst's run fails.
    let broken = store.set_key(burst[17]);
    server.cli(&["rpush", &broken, "not a set"]);
    let failed = store.claim_many(&burst).await;
    assert!(
        failed.iter().all(|answer| answer
            .as_ref()
            .is_err_and(|error| error.to_string().contains("WRONGTYPE"))),
        "each digest of the failed run is an error: {failed:?}"
    );
    server.cli(&["del", &broken]);
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::New; burst.len()],
        "the failed run claimed nothing: no digest waits out a lease"
    );

    // A commit run that fails commits nothing, and the next one commits every digest.
    server.cli(&["rename", &broken, "aside"]);
    server.cli(&["rpush", &broken, "not a set"]);
    let failed = store.commit_many(&burst).await;
    assert!(
        failed.iter().all(|answer| answer.is_err()),
        "each digest of the failed run is an error: {failed:?}"
    );
    server.cli(&["del", &broken]);
    server.cli(&["rename", "aside", &broken]);
    let other = RedisStore::connect(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        vec![Claim::InFlight; burst.len()],
        "still in flight: the failed commit run wrote nothing"
    );
    let committed: Vec<bool> = store
        .commit_many(&burst)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(committed, vec![true; burst.len()]);
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        vec![Claim::Duplicate; burst.len()]
    );
}

/// Two owners, four tasks each, claim every digest of the contention scenario in bursts of
/// 48 in their own orders, all at once: each digest is `New` for exactly one task. Then each
/// owner commits its own in bursts, and erasing the other owner's does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_bursts_of_two_owners_get_one_new_per_digest() {
    let server = RedisServer::start();
    let namespace = unique_namespace("racing-bursts");
    let (geometry, digests) = contention_scenario();
    let (a, b) = two_stores(config(&[server.url()], false, &namespace), geometry).await;
    let tasks: Vec<_> = (0..8u64)
        .map(|seed| {
            let store = if seed % 2 == 0 { a.clone() } else { b.clone() };
            let mut order = digests.clone();
            order.shuffle(&mut StdRng::seed_from_u64(seed));
            tokio::spawn(async move {
                let mut news = Vec::new();
                for burst in order.chunks(48) {
                    let claims = claimed(store.claim_many(burst).await).expect("burst claimed");
                    news.extend(
                        burst
                            .iter()
                            .zip(claims)
                            .filter(|(_, c)| *c == Claim::New)
                            .map(|(d, _)| *d),
                    );
                }
                (seed % 2, news)
            })
        })
        .collect();
    let mut owner_of: HashMap<Digest, u64> = HashMap::new();
    for task in tasks {
        let (owner, news) = task.await.unwrap();
        for d in news {
            assert!(owner_of.insert(d, owner).is_none(), "{d:?} new twice");
        }
    }
    assert_eq!(owner_of.len(), digests.len(), "every digest new once");
    for (mine, theirs, owner) in [(&a, &b, 0), (&b, &a, 1)] {
        let own: Vec<Digest> = digests
            .iter()
            .copied()
            .filter(|d| owner_of[d] == owner)
            .collect();
        assert!(!own.is_empty(), "owner {owner} won some digests");
        let erased = theirs.erase_many(&own).await;
        assert!(erased.iter().all(|e| e == &Ok(false)), "{erased:?}");
        let committed = mine.commit_many(&own).await;
        assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
    }
    // 768 digests: more than one script run takes, so several runs answer in order.
    assert_eq!(
        claimed(a.claim_many(&digests).await).unwrap(),
        vec![Claim::Duplicate; digests.len()]
    );
}

#[tokio::test]
async fn a_password_from_the_config_opens_a_protected_server() {
    let server = RedisServer::start_with_args(&["--requirepass", "s3cret-pw"]);
    let namespace = unique_namespace("auth");
    let geometry = Geometry::new(8, 2).unwrap();
    let wrong = RedisStore::connect(
        RedisConfig {
            password: Some(nsq_dedupe::RedisPassword::new("wrong-pw")),
            ..config(&[server.url()], false, &namespace)
        },
        geometry,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(!wrong.contains("wrong-pw"), "{wrong}");
    let in_url = format!("redis://:s3cret-pw@{}", server.addr());
    let store = RedisStore::connect(config(&[in_url], false, &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(store.config().urls, [server.url()]);
    assert!(!format!("{store:?} {:?}", store.config()).contains("s3cret"));
    assert_eq!(store.claim(digest(1)).await.unwrap(), Claim::New);
}

#[tokio::test]
async fn killed_redis_fails_fast_then_recovers_and_reloads_the_script() {
    let mut server = RedisServer::start();
    let namespace = unique_namespace("outage");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = RedisStore::connect(
        RedisConfig {
            timeout: Duration::from_millis(300),
            ..config(&[server.url()], false, &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    let (d, e) = (digest(30), digest(31));
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert_eq!(claimed(store.claim_many(&[e]).await).unwrap(), [Claim::New]);

    server.stop();
    let began = Instant::now();
    let claim = store.claim(d).await;
    assert!(
        matches!(
            claim,
            Err(StoreError::Unavailable { .. } | StoreError::Timeout(_))
        ),
        "{claim:?}"
    );
    assert!(store
        .claim_many(&[d, e])
        .await
        .iter()
        .all(|answer| answer.is_err()));
    assert!(store.commit(d).await.is_err());
    assert!(store.renew(d).await.is_err());
    assert!(store.erase(d).await.is_err());
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "failing took {:?}",
        began.elapsed()
    );

    // The new process is empty and has no script loaded: NOSCRIPT, load, run.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let recovered = loop {
        match store.claim(d).await {
            Ok(claim) => break claim,
            Err(err) if Instant::now() < deadline => {
                eprintln!("not yet recovered: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no recovery within 10 s: {err}"),
        }
    };
    assert_eq!(recovered, Claim::New);
    assert_eq!(
        claimed(store.claim_many(&[d, e]).await).unwrap(),
        [Claim::InFlight, Claim::New]
    );
}

// ---------------------------------------------------------------------------------------------
// Two processes claiming the same digests at once.

/// 6 digests in each of 128 sets of 8 ways: no set overflows.
fn contention_scenario() -> (Geometry, Vec<Digest>) {
    let geometry = Geometry::new(128 * 8, 8).expect("valid geometry");
    let sets = u128::from(geometry.sets());
    let mut digests = Vec::new();
    for set in 0..geometry.sets() {
        let first_hi = (u128::from(set) << 64).div_ceil(sets);
        for j in 0..6u64 {
            let hi = first_hi as u64 + j;
            let d =
                Digest::from_u128((u128::from(hi) << 64) | u128::from(digest(set * 100 + j).lo()));
            assert_eq!(geometry.set_of(d), set);
            digests.push(d);
        }
    }
    (geometry, digests)
}

/// Claims every digest in a seeded random order, in concurrent single claims (the
/// multiplexed connection pipelines them) and batches of 16. Returns the digests answered
/// `New`, and when the claimer started and ended (ms since the epoch).
async fn claim_all(store: &RedisStore, digests: &[Digest], seed: u64) -> (Vec<Digest>, u64, u64) {
    let mut order = digests.to_vec();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let start = now_ms();
    let mut news = Vec::new();
    for chunk in order.chunks(16) {
        let claims = if seed.is_multiple_of(2) {
            claimed(store.claim_many(chunk).await)
        } else {
            futures::future::try_join_all(chunk.iter().map(|&d| store.claim(d))).await
        }
        .unwrap_or_else(|e| panic!("claims failed: {e}"));
        news.extend(
            chunk
                .iter()
                .zip(claims)
                .filter(|(_, c)| *c == Claim::New)
                .map(|(d, _)| *d),
        );
    }
    (news, start, now_ms())
}

async fn wait_until_ms(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

const WORKER_ENV: &str = "NSQ_DEDUPE_TEST_REDIS_CLAIM_WORKER";

/// Not a test: the body of the second OS process of the two-process tests, which run this
/// binary again with this filter and
/// `NSQ_DEDUPE_TEST_REDIS_CLAIM_WORKER=<urls,comma separated> <cluster> <namespace> <start ms> <seed> <out>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the second process of the two-process claim tests"]
async fn claim_worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let fields: Vec<&str> = spec.split(' ').collect();
    let [urls, cluster, namespace, start, seed, out] = fields[..] else {
        panic!("bad {WORKER_ENV}: {spec}");
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let (geometry, digests) = contention_scenario();
    let store = RedisStore::connect(config(&urls, cluster == "1", namespace), geometry)
        .await
        .expect("worker connects");
    wait_until_ms(start.parse().unwrap()).await;
    let (news, begin, end) = claim_all(&store, &digests, seed.parse().unwrap()).await;
    let mut report = format!("T {begin} {end}\n");
    for d in news {
        report.push_str(&format!("N {}\n", d.as_u128()));
    }
    std::fs::write(out, report).expect("worker writes its report");
}

/// This process and one more claim every digest of the scenario at the same moment; each
/// digest must be `New` exactly once in all.
async fn two_processes_get_one_new_per_digest(urls: &[String], cluster: bool) {
    let namespace = unique_namespace("race");
    let (geometry, digests) = contention_scenario();
    let start = now_ms() + 1_500;
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("worker.txt");
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = std::process::Command::new(&exe)
        .args([
            "redis::claim_worker_process",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env(
            WORKER_ENV,
            format!(
                "{} {} {namespace} {start} 101 {}",
                urls.join(","),
                u8::from(cluster),
                out.display()
            ),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn worker process");
    let store = RedisStore::connect(config(urls, cluster, &namespace), geometry)
        .await
        .expect("connect");
    wait_until_ms(start).await;
    let (mine, begin, end) = claim_all(&store, &digests, 100).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("worker status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("worker process did not finish within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "worker process failed: {status}");
    let report = std::fs::read_to_string(&out).expect("worker report");
    let mut news: HashMap<Digest, u32> = HashMap::new();
    for d in &mine {
        *news.entry(*d).or_default() += 1;
    }
    let mut theirs = 0;
    let mut interval = None;
    for line in report.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[..] {
            ["T", b, e] => interval = Some((b.parse::<u64>().unwrap(), e.parse::<u64>().unwrap())),
            ["N", d] => {
                theirs += 1;
                *news
                    .entry(Digest::from_u128(d.parse().unwrap()))
                    .or_default() += 1;
            }
            _ => panic!("bad worker line {line:?}"),
        }
    }
    let (their_begin, their_end) = interval.expect("the worker's interval");
    assert!(
        begin.max(their_begin) < end.min(their_end),
        "the claimers did not overlap: {begin}-{end} and {their_begin}-{their_end}"
    );
    println!(
        "two processes, {} digests: {} New here, {theirs} New in the other process",
        digests.len(),
        mine.len()
    );
    assert!(
        !mine.is_empty() && theirs > 0,
        "one process claimed everything: the race did not happen"
    );
    let twice = news.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "{twice} digests were New in both processes");
    assert_eq!(news.len(), digests.len(), "every digest New exactly once");
    let check = RedisStore::connect(config(urls, cluster, &namespace), geometry)
        .await
        .unwrap();
    let claims = claimed(check.claim_many(&digests).await).unwrap();
    assert!(claims.iter().all(|c| *c == Claim::InFlight));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_get_one_new_per_digest_standalone() {
    let server = RedisServer::start();
    two_processes_get_one_new_per_digest(&[server.url()], false).await;
}

// ---------------------------------------------------------------------------------------------
/// Two consumers of one table add 300 and 100 distinct messages per 200 ms bucket: each
/// learns the fleet's 2,000 a second, and a consumer of another table only its own 250.
async fn consumers_of_one_table_each_learn_the_fleets_distinct_rate(
    urls: &[String],
    cluster: bool,
) {
    let geometry = Geometry::new(1024, 8).unwrap();
    let store = |namespace: &str| {
        RedisStore::connect(
            RedisConfig {
                fleet_interval: Duration::from_millis(200),
                ..config(urls, cluster, namespace)
            },
            geometry,
        )
    };
    let namespace = unique_namespace("fleet");
    let (a, b) = (
        store(&namespace).await.unwrap(),
        store(&namespace).await.unwrap(),
    );
    let other = store(&unique_namespace("fleet-other")).await.unwrap();
    crate::util::assert_each_learns_the_fleets_rate(&a, &b, &other).await;
}

#[tokio::test]
async fn consumers_of_one_table_each_learn_the_fleets_distinct_rate_standalone() {
    let server = RedisServer::start();
    consumers_of_one_table_each_learn_the_fleets_distinct_rate(&[server.url()], false).await;
}

// Redis Cluster: the cases share one cluster in one test, so that six servers start once.

/// The end-to-end work of one message: claim until `New` (retrying errors, and `InFlight`
/// left by an attempt whose answer was lost, until its lease ends), then commit (retrying
/// errors). Returns how many `New` answers it took and how many errors it met.
async fn process(store: &RedisStore, d: Digest, deadline: Instant) -> (u32, u32) {
    let mut errors = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "a message was not processed in time"
        );
        match store.claim(d).await {
            Ok(Claim::New) => break,
            Ok(Claim::InFlight) => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(Claim::Duplicate) => panic!("a digest nobody committed answered Duplicate"),
            Err(_) => {
                errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    loop {
        assert!(
            Instant::now() < deadline,
            "a commit did not go through in time"
        );
        match store.commit(d).await {
            Ok(_) => return (1, errors),
            Err(_) => {
                errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Processes `digests` with 16 concurrent workers; calls `during` once `at` of them are done.
/// Returns the errors met.
async fn process_all(
    store: &RedisStore,
    digests: &[Digest],
    at: usize,
    during: impl FnOnce() + Send + 'static,
) -> u32 {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, digests) = (store.clone(), digests.to_vec());
        let (done, errors, next) = (done.clone(), errors.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&d) = digests.get(i) else { return };
                let (_, e) = process(&store, d, deadline).await;
                errors.fetch_add(u64::from(e), Ordering::Relaxed);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let watcher = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            while (done.load(Ordering::Relaxed) as usize) < at {
                assert!(
                    Instant::now() < deadline,
                    "the first {at} were not processed in time"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            during();
        })
    };
    for task in tasks {
        task.await.expect("a worker panicked");
    }
    watcher.await.expect("the disruption ran");
    errors.load(Ordering::Relaxed) as u32
}

/// The claims of `digests`, 100 at a time.
async fn claim_in_chunks(store: &RedisStore, digests: &[Digest]) -> Vec<Claim> {
    let mut claims = Vec::with_capacity(digests.len());
    for chunk in digests.chunks(100) {
        claims.extend(claimed(store.claim_many(chunk).await).unwrap());
    }
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_shares_one_table_through_reshard_and_failover() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();

    // The fleet's counters live on one node of the cluster, whichever that is.
    consumers_of_one_table_each_learn_the_fleets_distinct_rate(&urls, true).await;

    // Two processes, exactly one New per digest, sets spread over the three masters.
    two_processes_get_one_new_per_digest(&urls, true).await;

    // Large enough that 6,000 digests never overflow a set: whatever is missing was lost.
    let geometry = Geometry::new(1 << 17, 8).unwrap();
    let lease = Duration::from_millis(1_000);
    let store = RedisStore::connect(
        RedisConfig {
            lease,
            ..config(&urls, true, &unique_namespace("cluster"))
        },
        geometry,
    )
    .await
    .unwrap();

    // Slots moved mid-test: 3,000 slots from the first master to the second, while 16
    // workers claim and commit.
    let digests: Vec<Digest> = (0..3_000).map(digest).collect();
    let (from, to) = (cluster.id_of(0), cluster.id_of(1));
    let seed_port = cluster.nodes[0].port();
    let resharded = Arc::new(std::sync::Mutex::new(String::new()));
    let log = resharded.clone();
    let errors = process_all(&store, &digests, 500, move || {
        let output = std::process::Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{seed_port}")])
            .args(["--cluster-from", &from, "--cluster-to", &to])
            .args(["--cluster-slots", "3000", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(output.status.success(), "reshard failed");
        *log.lock().unwrap() = String::from_utf8_lossy(&output.stdout).into_owned();
    })
    .await;
    assert!(
        resharded.lock().unwrap().contains("Moving slot"),
        "no slot moved"
    );
    cluster.wait_until_ok(&[]);
    let redirects = store.redirects();
    let claims = claim_in_chunks(&store, &digests).await;
    let forgotten = claims.iter().filter(|c| **c != Claim::Duplicate).count();
    println!(
        "reshard: 3000 messages, {redirects} MOVED/ASK followed, {errors} store errors retried, {forgotten} forgotten"
    );
    assert!(
        redirects > 0,
        "no operation met a moved slot: the reshard was not tested"
    );
    assert_eq!(forgotten, 0, "resharding moves keys, it forgets none");

    // A master killed with SIGKILL while 16 workers claim and commit; its replica takes over.
    let digests: Vec<Digest> = (10_000..13_000).map(digest).collect();
    let victim = cluster.master_of_slot(0, 1);
    let survivor = (0..6).find(|&i| i != victim).unwrap();
    let pid = cluster.nodes[victim].pid().expect("the victim runs");
    let began = Instant::now();
    let errors = process_all(&store, &digests, 500, move || {
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    })
    .await;
    let took = began.elapsed();
    cluster.wait_until_ok(&[victim]);
    let promoted = cluster.master_of_slot(0, survivor);
    assert_ne!(promoted, victim, "a replica took over slot 0");
    // Every message was processed (the workers retried until they had), and the table still
    // holds what the promoted replica received. Digests it lost would pass once more: count
    // them as the repeats a failover costs.
    let claims = claim_in_chunks(&store, &digests).await;
    let repeats = claims.iter().filter(|c| **c != Claim::Duplicate).count();
    println!(
        "failover: 3000 messages in {took:?}, {errors} store errors retried, {repeats} would be delivered again (writes the dead master acknowledged but had not replicated)"
    );
    assert!(
        errors > 0,
        "the failover was not noticed: nothing was tested"
    );
    drop(cluster);
}

// ---------------------------------------------------------------------------------------------
// The sidecar with Redis: two consumers sharing one table, and an outage under both policies.

/// Settings of a sidecar consuming `brokers` with the table in Redis at `url`.
fn sidecar_settings(brokers: &[SocketAddr], url: &str, namespace: &str) -> nsq_dedupe::Settings {
    let mut raw = raw_config(brokers);
    raw.store.kind = Some(StoreKind::Redis);
    raw.store.redis_urls = Some(vec![url.to_owned()]);
    raw.store.namespace = Some(namespace.to_owned());
    raw.store.buckets = Some(1 << 16);
    raw.validate().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_sharing_redis_deliver_each_payload_once() {
    let server = RedisServer::start();
    let namespace = unique_namespace("sidecars");
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 2_000;
    let mut order: Vec<usize> = (0..N).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, order.iter().map(|&i| payload(i)));
    let brokers = [a.tcp_addr(), b.tcp_addr()];
    let recorder = Recorder::default();
    let first = Running::start(
        sidecar_settings(&brokers, &server.url(), &namespace),
        recorder.clone(),
    )
    .await;
    let second = Running::start(
        sidecar_settings(&brokers, &server.url(), &namespace),
        recorder.clone(),
    )
    .await;
    wait_until_or(
        "every payload delivered and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&a) && drained(&b),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
    let (m1, m2) = (first.metrics.clone(), second.metrics.clone());
    first.stop().await;
    second.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert_eq!(delivered.get(&payload(i)), Some(&1), "payload {i}");
    }
    let unique = (get(&m1.unique), get(&m2.unique));
    let duplicates = get(&m1.duplicates) + get(&m2.duplicates);
    println!(
        "two sidecars sharing Redis: {N} payloads published to 2 nsqd, unique {unique:?}, {duplicates} duplicates, {} store errors",
        get(&m1.store_errors) + get(&m2.store_errors)
    );
    assert!(unique.0 > 0 && unique.1 > 0, "both sidecars took part");
    assert_eq!(unique.0 + unique.1, N as u64, "in: 2N messages, out: N");
    assert_eq!(duplicates, N as u64);
}

/// A sidecar on two nsqd with the same payloads; Redis is killed for 1.5 s mid-stream.
/// Returns (delivered at the kill, delivered 1.5 s later, deliveries in all) and checks that
/// every payload was delivered.
async fn redis_outage(policy: StoreErrorPolicy) -> (usize, usize, u32, u64) {
    let mut server = RedisServer::start();
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    const N: usize = 3_000;
    a.publish_many(TOPIC, (0..N).map(payload));
    b.publish_many(TOPIC, (0..N).map(payload));
    let mut raw = raw_config(&[a.tcp_addr(), b.tcp_addr()]);
    raw.source.max_in_flight = Some(20);
    raw.source.max_attempts = Some(1000);
    raw.store.kind = Some(StoreKind::Redis);
    raw.store.redis_urls = Some(vec![server.url()]);
    raw.store.buckets = Some(1 << 16);
    raw.store.timeout = Some(Dur(Duration::from_millis(200)));
    raw.dedupe.on_store_error = Some(policy);
    if policy == StoreErrorPolicy::Process {
        // Used only with requeue.
        raw.dedupe.store_error_requeue_delay = None;
    }
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
    server.stop();
    let at_stop = recorder.distinct_delivered();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let during = recorder.distinct_delivered();
    server.restart();
    wait_until_or(
        "every payload delivered after Redis came back",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == N && drained(&a) && drained(&b),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
    let metrics = running.metrics.clone();
    running.stop().await;
    let delivered = recorder.delivered();
    for i in 0..N {
        assert!(delivered.contains_key(&payload(i)), "payload {i} lost");
    }
    let total: u32 = delivered.values().sum();
    assert!(get(&metrics.store_errors) > 0, "the outage was not noticed");
    println!(
        "redis outage, on_store_error = {policy:?}: {at_stop} delivered at the kill, {during} 1.5 s later, {} store errors, {} extra deliveries",
        get(&metrics.store_errors),
        total as usize - N
    );
    (at_stop, during, total, get(&metrics.store_error_requeues))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_with_requeue_loses_nothing_and_waits() {
    let (at_stop, during, _, requeues) = redis_outage(StoreErrorPolicy::Requeue).await;
    assert!(requeues > 0);
    assert!(
        during - at_stop < 100,
        "with policy requeue, little is delivered while the store is down ({at_stop} -> {during})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_with_process_loses_nothing_and_keeps_delivering() {
    let (at_stop, during, _, requeues) = redis_outage(StoreErrorPolicy::Process).await;
    assert_eq!(requeues, 0);
    assert!(
        during - at_stop >= 100,
        "with policy process, delivery goes on while the store is down ({at_stop} -> {during})"
    );
}

#[tokio::test]
async fn a_full_set_takes_what_size_reports() {
    let server = RedisServer::start();
    for ways in [1, 2, 4, 8] {
        // The default namespace and a production-sized table, so the key is as long as in use.
        let geometry = Geometry::new(1 << 23, ways).unwrap();
        let store = RedisStore::connect(config(&[server.url()], false, "nsq-dedupe"), geometry)
            .await
            .unwrap();
        let set = geometry.set_of(digest(0));
        let full: Vec<Digest> = (0..)
            .map(digest)
            .filter(|d| geometry.set_of(*d) == set)
            .take(ways as usize)
            .collect();
        for &d in &full {
            assert_eq!(store.claim(d).await.unwrap(), Claim::New);
            assert!(store.commit(d).await.unwrap());
        }
        let key = store.set_key(full[0]);
        let measured: u64 = server
            .cli(&["memory", "usage", &key, "samples", "0"])
            .trim()
            .parse()
            .unwrap();
        let reported = nsq_dedupe::sizing::redis_set_bytes(ways);
        println!("{ways} ways: MEMORY USAGE {measured} bytes, size reports {reported}");
        assert!(
            measured.abs_diff(reported) <= 16,
            "{ways} ways: MEMORY USAGE says {measured}, size reports {reported}"
        );
    }
}

/// The CPU time (user and system) process `pid` has used so far, from `/proc/<pid>/stat`.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // Fields after the command name, which ends with the last ')': utime and stime are the
    // 12th and 13th of them, in clock ticks.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks_used: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    Duration::from_secs_f64(ticks_used / ticks)
}

/// Messages each timed pass sends before it starts timing.
const THROUGHPUT_WARM_UP: usize = 20_000;

/// The store of a timed pass.
#[derive(Clone, Copy)]
enum BenchStore<'a> {
    None,
    Redis(&'a RedisServer),
    Memcached(&'a MemcachedServer),
}

/// One timed pass of the sidecar from the test broker to the `null` sink: `n` distinct
/// 100-byte messages after a warm-up. Returns messages per second, and the CPU µs per message
/// of this process (sidecar and broker) and of the store's server.
async fn store_pass(store: BenchStore<'_>, n: usize, pass: usize) -> (f64, f64, f64) {
    const WARM_UP: usize = THROUGHPUT_WARM_UP;
    let broker = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let bodies = |prefix: &str, count: usize| -> Vec<bytes::Bytes> {
        (0..count)
            .map(|i| {
                let mut b = vec![b'x'; 100];
                b[..13].copy_from_slice(format!("{prefix}{pass:03}{i:09}").as_bytes());
                bytes::Bytes::from(b)
            })
            .collect()
    };
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(60)));
    raw.source.heartbeat_interval = Some(Dur(Duration::from_secs(30)));
    raw.sink.kind = Some(nsq_dedupe::config::SinkKind::Null);
    raw.metrics.address = Some("off".into());
    raw.metrics.status_interval = Some(Dur(Duration::from_secs(3600)));
    raw.store.namespace = Some(unique_namespace("throughput"));
    raw.store.buckets = Some(1 << 20);
    let server_pid = match store {
        BenchStore::Redis(server) => {
            raw.store.kind = Some(StoreKind::Redis);
            raw.store.redis_urls = Some(vec![server.url()]);
            server.pid()
        }
        BenchStore::Memcached(server) => {
            raw.store.kind = Some(StoreKind::Memcached);
            raw.store.memcached_addresses = Some(vec![server.addr()]);
            server.pid()
        }
        BenchStore::None => {
            raw.store.kind = Some(StoreKind::None);
            raw.store.buckets = None;
            raw.store.ways = None;
            raw.store.window = None;
            raw.store.namespace = None;
            None
        }
    };
    broker.publish_many(TOPIC, bodies("w", WARM_UP));
    let running = Running::start_configured(raw.validate().unwrap()).await;
    crate::sidecar::wait_for_fins(&broker, "the warm-up finished", WARM_UP as u64).await;
    let server_before = server_pid.map(cpu_of).unwrap_or_default();
    let (elapsed, cpu) =
        crate::sidecar::publish_timed(&broker, bodies("t", n), (WARM_UP + n) as u64).await;
    let server_cpu = server_pid.map(cpu_of).unwrap_or_default() - server_before;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(get(&metrics.unique), (WARM_UP + n) as u64);
    assert_eq!(get(&metrics.store_errors), 0);
    let per_message = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    (
        n as f64 / elapsed.as_secs_f64(),
        per_message(cpu),
        per_message(server_cpu),
    )
}

/// End-to-end throughput with the Redis store against no store, and the Memcached store in the
/// same run: test broker -> sidecar -> `null` sink, 100,000 distinct messages a pass, three
/// passes each in rotating order, best of each.
///
/// `cargo test --release --test integration redis::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 100_000;
    let redis = RedisServer::start();
    let memcached = MemcachedServer::start();
    let stores = [
        ("none", BenchStore::None),
        ("redis", BenchStore::Redis(&redis)),
        ("memcached", BenchStore::Memcached(&memcached)),
    ];
    let mut passes = vec![Vec::new(); stores.len()];
    for round in 0..3 {
        for k in 0..stores.len() {
            let which = (round + k) % stores.len();
            let tag = stores.len() * round + k;
            passes[which].push(store_pass(stores[which].1, N, tag).await);
        }
    }
    let best = |passes: &[(f64, f64, f64)]| {
        *passes
            .iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .expect("passes ran")
    };
    // Messages in all Redis passes (warm-ups included), against the script runs they took.
    let messages = 3 * (N + THROUGHPUT_WARM_UP);
    let stats = redis.cli(&["info", "commandstats"]);
    let runs: u64 = stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .expect("redis counted the script runs");
    let baseline = best(&passes[0]).0;
    println!(
        "sidecar throughput, {N} distinct 100-byte messages, test broker, null sink, best of 3:"
    );
    for ((name, _), passes) in stores.iter().zip(&passes) {
        let (rate, cpu, server) = best(passes);
        println!(
            "  store {name:<9} {rate:>9.0} msgs/s ({:.3} of none), CPU µs/msg: sidecar and broker {cpu:.2}, store server {server:.2}; passes {passes:.1?}",
            rate / baseline
        );
    }
    println!(
        "  redis: {runs} script runs for {messages} messages, a claim and a commit each: {:.1} digests a run",
        2.0 * messages as f64 / runs as f64
    );
}

/// The slot ranges that node `index` serves as a master, from `CLUSTER NODES`.
fn slots_served_by(cluster: &RedisCluster, index: usize, via: usize) -> Vec<(u16, u16)> {
    let id = cluster.id_of(index);
    let nodes = cluster.nodes[via].cli(&["cluster", "nodes"]);
    let line = nodes
        .lines()
        .find(|line| line.starts_with(&id))
        .unwrap_or_else(|| panic!("node {id} in {nodes}"));
    line.split_whitespace()
        .skip(8)
        .filter_map(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            Some((lo.parse().ok()?, hi.parse().ok()?))
        })
        .collect()
}

/// Bursts whose sets live on every master, as a sidecar claims them, while one master is
/// frozen (SIGSTOP) and then another killed (SIGKILL): the digests of the other masters are
/// decided at once, only those of the failed master fail, and as soon as its replica is
/// promoted every digest is decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_fails_only_the_digests_of_a_failed_master() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(
        RedisConfig {
            timeout: Duration::from_millis(300),
            ..config(&cluster.urls(), true, &unique_namespace("burst-failover"))
        },
        Geometry::new(1 << 16, 8).unwrap(),
    )
    .await
    .unwrap();
    let mut admin = redis::Client::open(cluster.nodes[5].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut next = 0;
    let mut burst = |n: u64| {
        next += n;
        (next - n..next).map(digest).collect::<Vec<_>>()
    };
    // Nodes frozen or killed so far, which no command may be sent to.
    let mut down = Vec::new();
    // Slot 0 and slot 16383 start on different masters: the second fault hits a live shard.
    for (signal, slot) in [("STOP", 0), ("KILL", 16_383)] {
        let warm = burst(300);
        assert_eq!(
            claimed(store.claim_many(&warm).await).unwrap(),
            vec![Claim::New; 300]
        );
        let via = (0..6).find(|i| !down.contains(i)).unwrap();
        let victim = cluster.master_of_slot(slot, via);
        let ranges = slots_served_by(&cluster, victim, via);
        let pid = cluster.nodes[victim].pid().expect("the victim runs");
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        down.push(victim);

        let digests = burst(300);
        let began = Instant::now();
        let answers = store.claim_many(&digests).await;
        let took = began.elapsed();
        let mut failed = Vec::new();
        for (&d, answer) in digests.iter().zip(&answers) {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(store.set_key(d))
                .query_async(&mut admin)
                .await
                .unwrap();
            let on_victim = ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot));
            match answer {
                Ok(claim) => {
                    assert!(
                        !on_victim,
                        "SIG{signal}: a claim on the failed master answered"
                    );
                    assert_eq!(*claim, Claim::New);
                }
                Err(error) => {
                    assert!(
                        on_victim,
                        "SIG{signal}: a live master's digest failed: {error}"
                    );
                    failed.push(d);
                }
            }
        }
        assert!(
            !failed.is_empty(),
            "SIG{signal}: no digest of the burst was on the victim"
        );
        println!(
            "SIG{signal}: {} of 300 claims failed with the victim, the burst answered in {took:?}",
            failed.len()
        );

        // Once the replica is promoted, the failed digests are claimed (nothing was written
        // for them) and a fresh burst over every master is answered in full.
        let failover = Instant::now();
        let retried = claim_until_answered(&store, &failed, Duration::from_secs(15)).await;
        assert_eq!(retried, vec![Claim::New; failed.len()]);
        let fresh = burst(300);
        let claims = claim_until_answered(&store, &fresh, Duration::from_secs(5)).await;
        assert_eq!(claims, vec![Claim::New; 300]);
        println!(
            "SIG{signal}: every digest answered {:?} after the fault",
            failover.elapsed()
        );
        let committed = store.commit_many(&fresh).await;
        assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
        cluster.wait_until_ok(&down);
    }
}
