//! The Memcached-backed table against a real memcached that each test starts itself: the store
//! contract (`contract`, see `store_contract`), and what only Memcached does: its item format,
//! compare-and-swap, several servers and ejection, outages and timeouts.
//!
//! Time limits here are generous (2 s per network step) because tests run as debug builds on
//! shared machines; the outage and timeout tests set short limits and check them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_memcached::{AsciiProtocol, Client, MetaProtocol};
use nsq_dedupe::error::StoreError;
use nsq_dedupe::{Claim, Digest, Geometry, MemcachedConfig, MemcachedStore, Store};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::store_contract::{
    claimed_before_the_outage, contention_scenario, digest, fails_fast_while_its_server_is_down,
    recovers_once_an_empty_server_is_back, unique_namespace, Harness, SharedHarness, Spec,
};
use crate::support::memcached::MemcachedServer;
use crate::util::{claim_until_answered, claimed};

/// Memcached as a store of the contract: a server of its own, or the servers another process
/// named.
pub struct Memcached {
    servers: Vec<String>,
    _server: Option<MemcachedServer>,
}

impl Memcached {
    /// A harness with a memcached of its own.
    pub fn start() -> Memcached {
        let server = MemcachedServer::start();
        Memcached {
            servers: vec![server.addr()],
            _server: Some(server),
        }
    }
}

impl Harness for Memcached {
    type Store = MemcachedStore;
    const OWNERS: bool = true;
    fn committed_is_final(&self) -> bool {
        true
    }

    async fn connect(&self, spec: &Spec) -> MemcachedStore {
        let defaults = MemcachedConfig::default();
        let settings = MemcachedConfig {
            coalesce: !spec.single_path,
            lease: spec.lease.unwrap_or(defaults.lease),
            max_age: spec.max_age,
            fleet_interval: spec.fleet_interval.unwrap_or(defaults.fleet_interval),
            ..config(&self.servers, &spec.namespace)
        };
        MemcachedStore::connect(settings, spec.geometry)
            .await
            .expect("connect to memcached")
    }

    fn unreadable_values(store: &MemcachedStore) -> u64 {
        store.unreadable_values()
    }
}

impl SharedHarness for Memcached {
    const KIND: &'static str = "memcached";

    fn address(&self) -> String {
        self.servers.join(",")
    }

    fn reach(address: &str) -> Memcached {
        Memcached {
            servers: address.split(',').map(str::to_owned).collect(),
            _server: None,
        }
    }

    fn cas_conflicts(store: &MemcachedStore) -> Option<u64> {
        Some(store.cas_conflicts())
    }
}

/// The rules every shared store keeps.
mod contract {
    crate::store_contract::store_contract_tests!(shared: super::Memcached::start());
}

fn config(servers: &[String], namespace: &str) -> MemcachedConfig {
    MemcachedConfig {
        servers: servers.to_vec(),
        namespace: namespace.to_owned(),
        timeout: Duration::from_secs(2),
        pool_size: 4,
        max_cas_retries: 500,
        ..MemcachedConfig::default()
    }
}

/// A plain async-memcached client (it needs a `tcp://` URL for an IP address).
async fn raw_client(addr: &str) -> Client {
    Client::new(format!("tcp://{addr}"))
        .await
        .expect("connect to memcached")
}

// ---------------------------------------------------------------------------------------------
// What the compare-and-swap prevents.

/// What older implementations did: read the set, and if the digest is absent, write the set
/// back with it. Returns whether the digest was new.
async fn naive_claim(client: &mut Client, key: &str, d: Digest) -> bool {
    let current = client.get(key).await.expect("get");
    let mut bytes = current.and_then(|v| v.data).unwrap_or_default();
    if bytes.chunks(16).any(|chunk| chunk == d.to_bytes()) {
        return false;
    }
    bytes.extend_from_slice(&d.to_bytes());
    client
        .set(key, bytes.as_slice(), None, None)
        .await
        .expect("set");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_then_set_loses_updates_in_the_same_scenario() {
    let server = MemcachedServer::start();
    let (geometry, digests) = contention_scenario();
    // Same scenario as above (eight claimers, every digest, no set overflows), but with
    // get-then-set; tried up to three times so that a lucky schedule does not hide the loss.
    let mut extra_news = 0;
    for attempt in 0..3 {
        let namespace = unique_namespace("naive");
        let keys = MemcachedStore::new_lazy(config(&[server.addr()], &namespace), geometry)
            .expect("store for key names");
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let mut client = raw_client(&server.addr()).await;
            let keys = keys.clone();
            let mut order = digests.clone();
            order.shuffle(&mut StdRng::seed_from_u64(attempt * 100 + t));
            tasks.push(tokio::spawn(async move {
                let mut news = Vec::new();
                for d in order {
                    if naive_claim(&mut client, &keys.item_key(d), d).await {
                        news.push(d);
                    }
                }
                news
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("naive task").len();
        }
        extra_news = total - digests.len();
        if extra_news > 0 {
            break;
        }
    }
    eprintln!("get-then-set let {extra_news} duplicate claims through");
    assert!(
        extra_news > 0,
        "get-then-set never lost an update in three tries"
    );
}

#[tokio::test]
async fn unreadable_value_is_counted_and_replaced() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("garbage");
    let geometry = Geometry::new(1024, 4).unwrap();
    let store = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    // Digests of four items: each garbage replaces one item only.
    let mut items = std::collections::HashSet::new();
    let apart: Vec<Digest> = (20..)
        .map(digest)
        .filter(|x| items.insert(store.item_key(*x)))
        .take(4)
        .collect();
    let [d, e, f, g] = apart[..] else {
        unreachable!()
    };
    let mut raw = raw_client(&server.addr()).await;
    raw.set(store.item_key(d), "not a set".as_bytes(), None, None)
        .await
        .unwrap();
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert_eq!(store.unreadable_values(), 1);
    assert_eq!(
        store.claim(d).await.unwrap(),
        Claim::InFlight,
        "the write replaced the garbage"
    );
    raw.set(store.item_key(e), "\u{2}\u{0}".as_bytes(), None, None)
        .await
        .unwrap();
    assert_eq!(claimed(store.claim_many(&[e]).await).unwrap(), [Claim::New]);
    assert_eq!(
        store.unreadable_values(),
        2,
        "a foreign format version is unreadable too"
    );
    // A value far larger than any item is skipped, not loaded, and replaced as well.
    let huge = vec![b'x'; 200_000];
    raw.set(store.item_key(f), huge.as_slice(), None, None)
        .await
        .unwrap();
    assert_eq!(
        claimed(store.claim_many(&[f, e]).await).unwrap(),
        [Claim::New, Claim::InFlight]
    );
    assert_eq!(store.unreadable_values(), 3);
    // The single-operation path (coalescing off) counts and replaces too.
    let single = MemcachedStore::connect(
        MemcachedConfig {
            coalesce: false,
            ..config(&[server.addr()], &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    raw.set(
        single.item_key(g),
        "\u{3}\u{9}\u{4}\u{0}".as_bytes(),
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!(single.claim(g).await.unwrap(), Claim::New);
    assert_eq!(single.claim(g).await.unwrap(), Claim::InFlight);
    assert_eq!(
        single.unreadable_values(),
        1,
        "an item of 9 sets is not one of this table's (16 sets of 4 ways)"
    );
}

// ---------------------------------------------------------------------------------------------
// Failures.

#[tokio::test]
async fn killed_memcached_fails_fast_then_recovers() {
    outage(true).await;
}

#[tokio::test]
async fn killed_memcached_fails_fast_then_recovers_without_coalescing() {
    outage(false).await;
}

async fn outage(coalesce: bool) {
    let mut server = MemcachedServer::start();
    let namespace = unique_namespace("outage");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = MemcachedStore::connect(
        MemcachedConfig {
            timeout: Duration::from_millis(300),
            coalesce,
            ..config(&[server.addr()], &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    let digests = claimed_before_the_outage(&store).await;
    let old_pid = server.pid();
    server.stop();
    fails_fast_while_its_server_is_down(&store, digests).await;
    server.restart();
    assert_ne!(server.pid(), old_pid);
    // A restarted memcached is empty, so the digests are new again once we reconnect.
    let attempts = recovers_once_an_empty_server_is_back(&store, digests).await;
    assert!(attempts <= 2, "recovery took {attempts} attempts");
}

#[tokio::test]
async fn silent_server_times_out() {
    // A listener that accepts and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let config = MemcachedConfig {
        timeout: Duration::from_millis(200),
        ..config(&[addr], &unique_namespace("silent"))
    };
    let geometry = Geometry::new(64, 4).unwrap();
    let began = Instant::now();
    assert_eq!(
        MemcachedStore::connect(config.clone(), geometry)
            .await
            .unwrap_err(),
        StoreError::Timeout(Duration::from_millis(200))
    );
    for coalesce in [true, false] {
        let config = MemcachedConfig {
            coalesce,
            ..config.clone()
        };
        let store = MemcachedStore::new_lazy(config, geometry).unwrap();
        assert_eq!(
            store.claim(digest(40)).await,
            Err(StoreError::Timeout(Duration::from_millis(200)))
        );
        assert_eq!(
            store.commit(digest(40)).await,
            Err(StoreError::Timeout(Duration::from_millis(200)))
        );
        assert_eq!(
            store.claim_many(&[digest(41)]).await,
            [Err(StoreError::Timeout(Duration::from_millis(200)))]
        );
    }
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "took {:?}",
        began.elapsed()
    );
    hold.abort();

    // Nobody listening at all: refused at once.
    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let err = MemcachedStore::connect(config_for_closed(&closed), geometry)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable { ref addr, .. } if *addr == closed),
        "{err:?}"
    );
}

fn config_for_closed(addr: &str) -> MemcachedConfig {
    config(&[addr.to_owned()], &unique_namespace("closed"))
}

// ---------------------------------------------------------------------------------------------
// Several servers.

#[tokio::test]
async fn two_servers_share_the_keys_and_routing_is_stable() {
    let one = MemcachedServer::start();
    let two = MemcachedServer::start_with_args(&["-m", "16"]);
    assert_ne!(one.port(), two.port());
    let servers = vec![one.addr(), two.addr()];
    let namespace = unique_namespace("two");
    // Enough items (1,024 of 64 slots) that the 200 digests fall in about 180 of them: the
    // spread check below then fails by chance less than once in 10^9 runs, where 16 items failed
    // it once in 13.
    let geometry = Geometry::new(16_384 * 4, 4).unwrap();
    let store = MemcachedStore::connect(config(&servers, &namespace), geometry)
        .await
        .unwrap();
    let digests: Vec<Digest> = (100..300).map(digest).collect();
    for d in &digests[..100] {
        assert_eq!(store.claim(*d).await.unwrap(), Claim::New);
    }
    assert!(claimed(store.claim_many(&digests[100..]).await)
        .unwrap()
        .iter()
        .all(|c| *c == Claim::New));

    // Each item is on the server that routing names, and only there.
    let mut clients = [raw_client(&one.addr()).await, raw_client(&two.addr()).await];
    let mut per_server = [0; 2];
    let mut keys: Vec<String> = digests.iter().map(|d| store.item_key(*d)).collect();
    keys.sort();
    keys.dedup();
    for key in &keys {
        let home = store.server_of(key);
        per_server[home] += 1;
        for (index, client) in clients.iter_mut().enumerate() {
            let found = client
                .meta_get(key, false, None, Some(&["v"]))
                .await
                .unwrap()
                .is_some();
            assert_eq!(found, index == home, "{key} on server {index}");
        }
    }
    assert!(
        per_server.iter().all(|&n| n > keys.len() / 4),
        "uneven spread {per_server:?}"
    );

    // Another store (another run) routes the same way, even with the list in another order.
    let reversed: Vec<String> = servers.iter().rev().cloned().collect();
    let again = MemcachedStore::connect(config(&reversed, &namespace), geometry)
        .await
        .unwrap();
    for key in &keys {
        assert_eq!(
            reversed[again.server_of(key)],
            servers[store.server_of(key)]
        );
    }
    assert!(claimed(again.claim_many(&digests).await)
        .unwrap()
        .iter()
        .all(|c| *c == Claim::InFlight));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_ejected_after_the_bound_and_taken_back_when_it_answers() {
    let one = MemcachedServer::start();
    let mut two = MemcachedServer::start();
    let servers = vec![one.addr(), two.addr()];
    let mut settings = config(&servers, &unique_namespace("eject"));
    settings.timeout = Duration::from_millis(300);
    settings.eject_after = Some(Duration::from_secs(1));
    let geometry = Geometry::new(16_384 * 4, 4).unwrap();
    let store = MemcachedStore::connect(settings, geometry).await.unwrap();
    let home = |d: &Digest| store.server_of(&store.item_key(*d));
    let on_two: Vec<Digest> = (0..5000).map(digest).filter(|d| home(d) == 1).collect();
    let mut items = std::collections::HashSet::new();
    let on_two: Vec<Digest> = on_two
        .into_iter()
        .filter(|d| items.insert(store.item_key(*d)))
        .take(40)
        .collect();
    assert_eq!(on_two.len(), 40);
    two.stop();

    // Claims of server two's sets fail until it has failed for a second; then they go on.
    let started = Instant::now();
    let mut failures = 0;
    loop {
        match store.claim(on_two[0]).await {
            Err(_) => failures += 1,
            Ok(claim) => {
                assert_eq!(claim, Claim::New);
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not ejected after {failures} failures"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failures > 0 && started.elapsed() >= Duration::from_secs(1));
    assert_eq!((store.ejections(), store.ejected()), (1, vec![two.addr()]));
    // The next server in their order is server one: the sets start empty there.
    for d in &on_two[1..20] {
        assert_eq!(store.claim(*d).await.unwrap(), Claim::New);
    }
    let mut client = raw_client(&one.addr()).await;
    for d in &on_two[..20] {
        let key = store.item_key(*d);
        assert!(
            client
                .meta_get(&key, false, None, Some(&["v"]))
                .await
                .unwrap()
                .is_some(),
            "{key} moved to server one"
        );
    }

    // Back (restarted, empty): probed, taken back, and its sets return to it.
    two.restart();
    let back = Instant::now();
    while store.returns() == 0 {
        assert!(back.elapsed() < Duration::from_secs(20), "not taken back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.ejected().is_empty());
    let mut client_two = raw_client(&two.addr()).await;
    for d in &on_two[20..] {
        assert_eq!(store.claim(*d).await.unwrap(), Claim::New);
        let key = store.item_key(*d);
        let on = |found: Option<_>| found.is_some();
        assert!(
            on(client_two
                .meta_get(&key, false, None, Some(&["v"]))
                .await
                .unwrap()),
            "{key} back on server two"
        );
        assert!(
            !on(client
                .meta_get(&key, false, None, Some(&["v"]))
                .await
                .unwrap()),
            "{key} not on server one"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_under_load_every_call_answers_and_none_is_a_false_duplicate() {
    let mut server = MemcachedServer::start();
    let namespace = unique_namespace("load-outage");
    let geometry = Geometry::new(1024, 8).unwrap();
    let store = MemcachedStore::connect(
        MemcachedConfig {
            timeout: Duration::from_millis(300),
            ..config(&[server.addr()], &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    let began = Instant::now();
    // The load runs until a claim has been answered after the restart (or 20 s have passed),
    // so that a slow restart under load shortens nothing the test asserts.
    let stop = Arc::new(AtomicBool::new(false));
    let restarted = Arc::new(AtomicBool::new(false));
    let answered_after_restart = Arc::new(AtomicUsize::new(0));
    // Eight tasks claim fresh digests without pause, recording when each call started and
    // ended and what it returned.
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let store = store.clone();
        let (stop, restarted) = (stop.clone(), restarted.clone());
        let answered_after_restart = answered_after_restart.clone();
        tasks.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && calls.len() < 200_000 {
                n += 1;
                let after_restart = restarted.load(Ordering::Relaxed);
                let start = began.elapsed();
                let result = store.claim(digest(1_000_000 * (t + 1) + n)).await;
                let failed = result.is_err();
                if after_restart && !failed {
                    answered_after_restart.fetch_add(1, Ordering::Relaxed);
                }
                calls.push((start, began.elapsed(), result));
                if failed {
                    // Back off a little, as a consumer would.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            calls
        }));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let killed_at = began.elapsed();
    server.stop();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let restarted_at = began.elapsed();
    restarted.store(true, Ordering::Relaxed);
    server.restart();
    let waiting = Instant::now();
    while answered_after_restart.load(Ordering::Relaxed) == 0
        && waiting.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);

    let (mut errors, mut after_restart_ok) = (0, 0);
    for task in tasks {
        for (start, end, result) in task.await.expect("load task") {
            assert!(
                end - start < Duration::from_secs(2),
                "a call took {:?}",
                end - start
            );
            match result {
                // Every digest is fresh: any answer but New would be a false duplicate.
                Ok(claim) => {
                    assert_eq!(claim, Claim::New);
                    assert!(
                        !(start > killed_at + Duration::from_millis(50) && end < restarted_at),
                        "a call during the outage succeeded"
                    );
                    if start > restarted_at {
                        after_restart_ok += 1;
                    }
                }
                Err(err) => {
                    assert!(
                        matches!(err, StoreError::Unavailable { .. } | StoreError::Timeout(_)),
                        "{err:?}"
                    );
                    errors += 1;
                }
            }
        }
    }
    assert!(errors > 0, "the outage produced no errors");
    assert!(after_restart_ok > 0, "no claim succeeded after the restart");
}

/// A burst whose sets live on two servers, one of them dead: the digests of the live server
/// are claimed as usual, only those of the dead one fail, and once it is back they are
/// claimed too.
#[tokio::test]
async fn a_burst_fails_only_the_digests_of_a_dead_server() {
    let one = MemcachedServer::start();
    let mut two = MemcachedServer::start();
    let mut settings = config(&[one.addr(), two.addr()], &unique_namespace("burst-dead"));
    settings.timeout = Duration::from_millis(300);
    let store = MemcachedStore::connect(settings, Geometry::new(1 << 14, 8).unwrap())
        .await
        .unwrap();
    let burst: Vec<Digest> = (0..200).map(digest).collect();
    let home = |d: &Digest| store.server_of(&store.item_key(*d));
    two.stop();

    let answers = store.claim_many(&burst).await;
    for (d, answer) in burst.iter().zip(&answers) {
        match home(d) {
            0 => assert_eq!(answer, &Ok(Claim::New), "server one's digests are decided"),
            _ => assert!(answer.is_err(), "server two is dead: {answer:?}"),
        }
    }
    let dead = burst.iter().filter(|d| home(d) == 1).count();
    assert!(
        dead > 0 && dead < burst.len(),
        "{dead} of the burst on server two"
    );

    two.restart();
    let failed: Vec<Digest> = burst.iter().copied().filter(|d| home(d) == 1).collect();
    assert_eq!(
        claim_until_answered(&store, &failed, Duration::from_secs(10)).await,
        vec![Claim::New; failed.len()],
        "the failed claims wrote nothing"
    );
}

/// How many reads (`get`, `mg`, ...) `memcached` at `addr` has answered so far.
fn reads_served(addr: &str) -> u64 {
    stat(addr, "cmd_get")
}

/// `size`'s estimate of a table's memory in Memcached (`sizing::memcached_bytes_estimate`)
/// is within a tenth of what memcached counts for it (`stats` `bytes`) once the table is full
/// (four times its slots of digests: every set at its ways, as a table sized for its window
/// is), written as a sidecar writes it: claims then commits. A table still filling takes less:
/// its items are written short.
#[tokio::test]
async fn the_memory_estimate_is_within_a_tenth_of_what_memcached_counts() {
    let server = MemcachedServer::start();
    let geometry = Geometry::new(4_096 * 8, 8).unwrap();
    let store = store_at(&server.addr(), &unique_namespace("memory"), geometry).await;
    let before = stat(&server.addr(), "bytes");
    let digests: Vec<Digest> = (0..4 * geometry.slots()).map(digest).collect();
    for burst in digests.chunks(256) {
        assert_eq!(
            claimed(store.claim_many(burst).await).unwrap(),
            vec![Claim::New; burst.len()]
        );
        assert_eq!(store.commit_many(burst).await, vec![Ok(true); burst.len()]);
    }
    let measured = stat(&server.addr(), "bytes") - before;
    let estimate = nsq_dedupe::sizing::memcached_bytes_estimate(geometry);
    assert!(
        estimate.abs_diff(measured) * 10 <= measured,
        "estimated {estimate} bytes, memcached counts {measured}"
    );
}

/// The counter `name` of memcached's `stats` at `addr`.
pub(crate) fn stat(addr: &str, name: &str) -> u64 {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to memcached");
    conn.write_all(b"stats\r\n").expect("ask for stats");
    let mut reader = BufReader::new(conn);
    let prefix = format!("STAT {name} ");
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("read stats");
        if let Some(count) = line.strip_prefix(&prefix) {
            return count.trim().parse().expect("a count");
        }
        assert!(!line.is_empty() && line != "END\r\n", "no {name} in stats");
    }
}

/// Commits `digests` in one `commit_many`; whether each was still held.
async fn commit_all(store: &MemcachedStore, digests: &[Digest]) -> Vec<bool> {
    store
        .commit_many(digests)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("commits answered")
}

#[tokio::test]
async fn a_commit_after_the_stores_own_claim_sends_no_read() {
    let server = MemcachedServer::start();
    let geometry = Geometry::new(1 << 16, 8).unwrap();
    let store = MemcachedStore::connect(
        config(&[server.addr()], &unique_namespace("known")),
        geometry,
    )
    .await
    .unwrap();
    let burst: Vec<Digest> = (0..50).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        [Claim::New; 50]
    );
    let before = reads_served(&server.addr());
    assert_eq!(commit_all(&store, &burst).await, [true; 50]);
    assert_eq!(
        reads_served(&server.addr()) - before,
        0,
        "each set is as this store's claim wrote it: the commit's compare-and-swap needs no read"
    );
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        [Claim::Duplicate; 50]
    );
}

#[tokio::test]
async fn a_set_another_store_changed_is_read_again_before_answering() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("stale");
    // One set of one way: every claim pushes out the entry before it.
    let geometry = Geometry::new(1, 1).unwrap();
    let a = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let b = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let (d, e) = (digest(1), digest(2));
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert_eq!(
        b.claim(e).await.unwrap(),
        Claim::New,
        "pushes out a's claim of d"
    );
    // What a wrote last still holds d in flight; the set does not.
    assert_eq!(
        a.claim(d).await.unwrap(),
        Claim::New,
        "d is no longer in the set: a must not answer from what it wrote before"
    );
    assert!(
        !b.commit(e).await.unwrap(),
        "a's claim of d pushed out b's e"
    );
    assert!(a.commit(d).await.unwrap());
    assert_eq!(b.claim(d).await.unwrap(), Claim::Duplicate);
}

#[tokio::test]
async fn a_filling_table_takes_new_sets_without_reading_them() {
    let server = MemcachedServer::start();
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let namespace = unique_namespace("absent");
    let store = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let first: Vec<Digest> = (0..50).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&first).await).unwrap(),
        [Claim::New; 50]
    );
    // Every set read so far was absent: the next fresh sets are written as new at once.
    let before = reads_served(&server.addr());
    let next: Vec<Digest> = (50..100).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&next).await).unwrap(),
        [Claim::New; 50]
    );
    assert_eq!(reads_served(&server.addr()) - before, 0);
    // A set that exists after all is read and decided as usual.
    let other = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(other.claim(digest(7)).await.unwrap(), Claim::InFlight);
    assert!(store.commit(digest(7)).await.unwrap());
    assert_eq!(other.claim(digest(7)).await.unwrap(), Claim::Duplicate);
}

#[tokio::test]
async fn a_restarted_server_is_not_written_with_a_token_from_before() {
    let mut server = MemcachedServer::start();
    let namespace = unique_namespace("restart-cas");
    let geometry = Geometry::new(2, 2).unwrap();
    let a = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let (d, e) = (digest(1), digest(2));
    let e = (2..)
        .map(digest)
        .find(|x| geometry.set_of(*x) == geometry.set_of(d))
        .unwrap_or(e);
    // Writes before a's claim, so that its token is not the first a restarted server gives.
    let mut raw = raw_client(&server.addr()).await;
    for i in 0..20 {
        raw.set(format!("filler-{i}"), "x".as_bytes(), None, None)
            .await
            .unwrap();
    }
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    server.restart();
    // After the restart, as many writes as before, then b's claim of e in d's set: that item
    // now carries the token a's claim was answered.
    let mut raw = raw_client(&server.addr()).await;
    for i in 0..20 {
        raw.set(format!("filler-{i}"), "x".as_bytes(), None, None)
            .await
            .unwrap();
    }
    let b = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(b.claim(e).await.unwrap(), Claim::New);
    // a's pooled connections died with the server: its first operation may fail.
    let mut committed = a.commit(d).await;
    if committed.is_err() {
        committed = a.commit(d).await;
    }
    assert_eq!(committed, Ok(false), "d was forgotten with the restart");
    assert_eq!(
        b.claim(e).await.unwrap(),
        Claim::InFlight,
        "b's claim of e stands: a did not write its set from before the restart over it"
    );
}

/// A store of the tests' settings on memcached at `addr`.
async fn store_at(addr: &str, namespace: &str, geometry: Geometry) -> MemcachedStore {
    MemcachedStore::connect(config(&[addr.to_owned()], namespace), geometry)
        .await
        .expect("connect to memcached")
}

/// Bytes memcached at `addr` sent its clients while `step` ran, without the answers to our own
/// `stats` questions (each counted in the next one's figure, and as long as one another).
async fn bytes_answered_during<T>(
    addr: &str,
    step: impl std::future::Future<Output = T>,
) -> (u64, T) {
    let first = stat(addr, "bytes_written");
    let second = stat(addr, "bytes_written");
    let out = step.await;
    let third = stat(addr, "bytes_written");
    let stats_answer = second - first;
    ((third - second).saturating_sub(stats_answer), out)
}

/// A store on a table that is still filling, its guess that unknown sets are absent made by
/// claiming 64 fresh digests (numbers 1,000,000 to 1,000,063).
async fn filling_store(addr: &str, namespace: &str) -> MemcachedStore {
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let store = store_at(addr, namespace, geometry).await;
    let warm: Vec<Digest> = (1_000_000..1_000_064).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&warm).await).unwrap(),
        [Claim::New; 64]
    );
    store
}

#[tokio::test]
async fn commits_on_a_filling_table_are_answered_only_when_they_fail() {
    let server = MemcachedServer::start();
    let store = filling_store(&server.addr(), &unique_namespace("quiet")).await;
    let burst: Vec<Digest> = (0..64).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        [Claim::New; 64]
    );
    let (bytes, commits) = bytes_answered_during(&server.addr(), store.commit_many(&burst)).await;
    let commits: Vec<bool> = commits.into_iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(commits, [true; 64]);
    // Each answered write costs the server at least `HD\r\n`; quiet ones only the
    // pipeline's closing `MN\r\n`.
    assert!(
        bytes < 64,
        "the server answered {bytes} bytes to 64 commits that all succeeded"
    );
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        [Claim::Duplicate; 64],
        "the quiet commits were written"
    );
}

#[tokio::test]
async fn a_quiet_commit_that_loses_a_race_is_decided_again() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("quiet-race");
    let a = filling_store(&server.addr(), &namespace).await;
    let b = store_at(
        &server.addr(),
        &namespace,
        Geometry::new(1 << 20, 8).unwrap(),
    )
    .await;
    let burst: Vec<Digest> = (0..64).map(digest).collect();
    assert_eq!(
        claimed(a.claim_many(&burst).await).unwrap(),
        [Claim::New; 64]
    );
    // Between a's claim and its commit, b writes a digest of its own into the set of the
    // burst's tenth digest.
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let rival = (64..)
        .map(digest)
        .find(|x| geometry.set_of(*x) == geometry.set_of(burst[10]))
        .unwrap();
    assert_eq!(b.claim(rival).await.unwrap(), Claim::New);
    assert_eq!(
        b.claim(burst[10]).await.unwrap(),
        Claim::InFlight,
        "b read a's claim"
    );
    let conflicts = a.cas_conflicts();
    assert_eq!(
        commit_all(&a, &burst).await,
        [true; 64],
        "every claim of a is still held"
    );
    assert_eq!(
        a.cas_conflicts() - conflicts,
        1,
        "the commit written on the set as a's claim left it failed and was written again"
    );
    assert_eq!(b.claim(burst[10]).await.unwrap(), Claim::Duplicate);
    assert_eq!(
        a.claim(rival).await.unwrap(),
        Claim::InFlight,
        "a's commit kept b's entry"
    );
    assert!(b.commit(rival).await.unwrap());
}

#[tokio::test]
async fn a_quiet_claim_done_on_a_set_that_exists_is_read_and_decided() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("quiet-done");
    let a = filling_store(&server.addr(), &namespace).await;
    let b = store_at(
        &server.addr(),
        &namespace,
        Geometry::new(1 << 20, 8).unwrap(),
    )
    .await;
    // b holds two digests in flight; a, guessing their sets absent, writes them as new.
    let held = [digest(1), digest(2)];
    assert_eq!(claimed(b.claim_many(&held).await).unwrap(), [Claim::New; 2]);
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let neighbour = (3..)
        .map(digest)
        .find(|x| geometry.set_of(*x) == geometry.set_of(held[0]))
        .unwrap();
    let fresh: Vec<Digest> = (5_000..5_060).map(digest).collect();
    let burst: Vec<Digest> = [&held[..], &[neighbour], &fresh].concat();
    let (bytes, claims) = bytes_answered_during(&server.addr(), a.claim_done_many(&burst)).await;
    let mut expected = vec![Claim::InFlight, Claim::InFlight];
    expected.extend([Claim::New; 61]);
    assert_eq!(claimed(claims).unwrap(), expected);
    // The two items that exist are read (a full item's value and its lines); the writes of
    // the others are not answered.
    let reads = 2 * (a.full_item_value_bytes() + 2 * 17 + 40);
    assert!(
        bytes < 300 + reads,
        "the 61 new sets' writes were quiet ({bytes} bytes answered)"
    );
    assert!(b.commit(held[0]).await.unwrap(), "a kept b's entry");
    assert_eq!(b.claim(neighbour).await.unwrap(), Claim::Duplicate);
    assert_eq!(
        claimed(b.claim_many(&fresh).await).unwrap(),
        [Claim::Duplicate; 60]
    );
}

#[tokio::test]
async fn commits_on_a_full_table_keep_their_token_for_the_next_claim() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("full-known");
    // 16 sets of 8 ways, filled many times over: every set exists.
    let geometry = Geometry::new(128, 8).unwrap();
    let store = store_at(&server.addr(), &namespace, geometry).await;
    // Bursts of 32: no set gets more digests of one burst than it has ways.
    for round in 0..16u64 {
        let burst: Vec<Digest> = (round * 32..round * 32 + 32).map(digest).collect();
        assert_eq!(
            claimed(store.claim_many(&burst).await).unwrap(),
            [Claim::New; 32]
        );
        assert_eq!(commit_all(&store, &burst).await, [true; 32]);
    }
    let before = reads_served(&server.addr());
    let next: Vec<Digest> = (1_000..1_016).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&next).await).unwrap(),
        [Claim::New; 16]
    );
    assert_eq!(
        reads_served(&server.addr()) - before,
        0,
        "each set is as this store's last commit wrote it: the claim needs no read"
    );
}

/// Claims then commits bursts of fresh digests (numbers from `first` on), `tasks` bursts at a
/// time for `rounds` rounds, the stores of `stores` taking the bursts in turn. A round's
/// bursts go concurrently, each claimed then committed; the next round starts when all are
/// done, so that no claim of a later round comes between a claim and its commit. Returns the
/// claims not answered new and the commits not answered true.
async fn claim_and_commit_in_rounds(
    stores: &[MemcachedStore],
    geometry: Geometry,
    (tasks, rounds, burst): (u64, u64, u64),
    first: u64,
) -> (u64, u64) {
    let numbers = move |round: u64, task: u64| {
        let start = first + (round * tasks + task) * burst;
        start..start + burst
    };
    // Within a round, fewer claims of any set than its ways: none can push out another.
    for round in 0..rounds {
        let mut per_set = std::collections::HashMap::new();
        for n in (0..tasks).flat_map(|task| numbers(round, task)) {
            *per_set.entry(geometry.set_of(digest(n))).or_insert(0u64) += 1;
        }
        assert!(per_set
            .values()
            .all(|&count| count < u64::from(geometry.ways())));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks as usize));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (stores, barrier) = (stores.to_vec(), barrier.clone());
            tokio::spawn(async move {
                let (mut not_new, mut lost) = (0, 0);
                for round in 0..rounds {
                    let store = &stores[((round * tasks + task) % stores.len() as u64) as usize];
                    let digests: Vec<Digest> = numbers(round, task).map(digest).collect();
                    let claims = claimed(store.claim_many(&digests).await).unwrap();
                    not_new += claims.iter().filter(|&&c| c != Claim::New).count() as u64;
                    for commit in store.commit_many(&digests).await {
                        lost += u64::from(!commit.expect("a commit answered"));
                    }
                    barrier.wait().await;
                }
                (not_new, lost)
            })
        })
        .collect();
    let (mut not_new, mut lost) = (0, 0);
    for handle in handles {
        let (n, l) = handle.await.expect("a task of bursts");
        (not_new, lost) = (not_new + n, lost + l);
    }
    (not_new, lost)
}

/// Four bursts at once of one store's claims and commits, and of two stores' (two owners),
/// on a table filled first: every fresh digest is claimed new and its commit holds. Bursts
/// go in rounds with fewer claims of any set than its ways, so that the table's eviction
/// cannot push out an entry between its claim and its commit however the bursts are timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_bursts_on_a_full_table_commit_every_claim() {
    let server = MemcachedServer::start();
    // 8,192 sets of 8 ways, 1,024 items.
    let geometry = Geometry::new(65_536, 8).unwrap();
    for consumers in [1, 2] {
        let namespace = unique_namespace("full-concurrent");
        let mut stores = Vec::new();
        for _ in 0..consumers {
            stores.push(store_at(&server.addr(), &namespace, geometry).await);
        }
        let first = consumers * 10_000_000;
        // Twice the slots: 16 claims a set on average, so that nearly every set is full.
        let fill = claim_and_commit_in_rounds(&stores, geometry, (4, 256, 128), first).await;
        let fresh =
            claim_and_commit_in_rounds(&stores, geometry, (4, 50, 128), first + 5_000_000).await;
        assert_eq!(
            (fill, fresh),
            ((0, 0), (0, 0)),
            "{consumers} store(s): (claims not new, commits not held) while filling, then full"
        );
    }
}
