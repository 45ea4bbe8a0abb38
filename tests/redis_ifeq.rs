//! The Redis store on a server with `SET … IFEQ` (Valkey 8.1, `src/dedup/redis/ifeq.rs`):
//! found when the store connects, never configured; a burst's claims and commits as plain
//! pipelined commands with no script run; a write whose set changed since it was read is
//! refused by the server and decided again, so that a race between two round trips never
//! gives a digest to two owners nor forgets another's entry; and the sets it writes are the
//! bytes the set script writes, so that clients of both share one table.

use std::time::Duration;

use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, RedisStore, Store};

use crate::redis::{command_calls, connect_sets};
use crate::store_contract::{digest, unique_namespace};
use crate::store_refusals::{start, stop};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::hold::Hold;
use crate::support::redis::{Flavor, RedisServer};
use crate::util::{claimed, wait_until_or};

/// The settings of a store of `namespace` on the server at `url`, 2 s an operation.
pub(crate) fn config(url: &str, namespace: &str) -> RedisConfig {
    RedisConfig {
        urls: vec![url.to_owned()],
        namespace: namespace.to_owned(),
        timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

fn valkey() -> RedisServer {
    RedisServer::of(Flavor::Valkey, &[])
}

/// `count` digests whose sets differ, for `store`.
fn distinct_sets(store: &RedisStore, count: usize) -> Vec<Digest> {
    let mut keys = std::collections::HashSet::new();
    (0..)
        .map(digest)
        .filter(|d| keys.insert(store.set_key(*d)))
        .take(count)
        .collect()
}

/// Valkey 8.1 is found to have `IFEQ`, Redis 7.0 not, by the store itself: when it connects,
/// or before the first operation of a store opened without its server. Asking costs no error
/// reply, which an operator watching `errorstat_*` would see.
#[tokio::test]
async fn a_store_finds_ifeq_on_valkey_8_1_and_not_on_redis_7_0() {
    let geometry = Geometry::new(64, 8).unwrap();
    for (flavor, found) in [(Flavor::Redis, false), (Flavor::Valkey, true)] {
        let server = RedisServer::of(flavor, &[]);
        let settings = config(&server.url(), &unique_namespace("probe"));
        let store = RedisStore::connect(settings.clone(), geometry)
            .await
            .unwrap();
        assert_eq!(store.uses_ifeq(), found, "{flavor:?}");
        let lazy = RedisStore::new_lazy(settings, geometry).unwrap();
        assert!(!lazy.uses_ifeq(), "{flavor:?}: not known before it asks");
        assert_eq!(lazy.claim(digest(1)).await, Ok(Claim::New), "{flavor:?}");
        assert_eq!(
            lazy.uses_ifeq(),
            found,
            "{flavor:?}: learnt at the first claim"
        );
        let errors = server.cli(&["info", "errorstats"]);
        assert!(!errors.contains("errorstat_"), "{flavor:?}: {errors}");
    }
}

/// A burst of claims of sets that hold nothing, then their commits: per set one `SET … NX
/// GET` that creates it, and one `SET … IFEQ` of the commit on the value the claim wrote (no
/// read); digests of a set already in the burst are decided on its value and written once.
/// Claimed again, each is a duplicate at the cost of a read of its set. No script runs, no
/// error. Another owner then finds each digest a duplicate too.
#[tokio::test]
async fn on_valkey_a_burst_is_plain_commands_and_no_script_run() {
    let server = valkey();
    let namespace = unique_namespace("plain");
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let store = connect_sets(config(&server.url(), &namespace), geometry)
        .await
        .unwrap();
    let mut burst = distinct_sets(&store, 100);
    // Four digests more in the first set: its claims are decided on the set the first made.
    let first = store.set_key(burst[0]);
    burst.extend(
        (1_000..)
            .map(digest)
            .filter(|d| store.set_key(*d) == first)
            .take(4),
    );
    server.cli(&["config", "resetstat"]);
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::New; burst.len()]
    );
    let calls = command_calls(&server);
    // 100 sets created, and one write of the first set's other four.
    assert_eq!(calls.get("set"), Some(&101), "{calls:?}");
    assert_eq!(calls.get("get"), None, "{calls:?}");
    server.cli(&["config", "resetstat"]);
    let committed: Vec<_> = store.commit_many(&burst).await;
    assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
    let calls = command_calls(&server);
    assert_eq!(calls.get("set"), Some(&100), "one write a set: {calls:?}");
    assert_eq!(calls.get("get"), None, "no read: {calls:?}");
    assert!(!calls.contains_key("evalsha"), "{calls:?}");
    // Claimed again: a read of each set. First as `SET … NX GET`, which writes nothing where
    // the set exists (the store learns that the table no longer fills), then as `GET`.
    for read in ["set", "get"] {
        server.cli(&["config", "resetstat"]);
        assert_eq!(
            claimed(store.claim_many(&burst).await).unwrap(),
            vec![Claim::Duplicate; burst.len()]
        );
        let calls = command_calls(&server);
        assert_eq!(calls.get(read), Some(&100), "one read a set: {calls:?}");
        assert_eq!(calls.len(), 2, "nothing else: {calls:?}");
    }
    let other = connect_sets(config(&server.url(), &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        vec![Claim::Duplicate; burst.len()]
    );
    let errors = server.cli(&["info", "errorstats"]);
    assert!(!errors.contains("errorstat_"), "{errors}");
    let stats = server.cli(&["info", "commandstats"]);
    assert!(!stats.contains("cmdstat_evalsha"), "no script run: {stats}");
}

/// Two owners claim one digest: the first read the set and decided new, and its write is
/// held back while the second claims it. The held write, compared with a set that changed,
/// writes nothing; the first reads the set again and finds the digest in flight. A plain
/// read and write would have given it to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_set_changed_after_its_read_is_decided_again() {
    let (_server, hold, a, b, _) = held_and_direct("ifeq-race").await;
    let (x, d) = (digest(1), digest(2));
    // The set exists (a claim of an empty set is written with NX, not IFEQ).
    assert_eq!(b.claim(x).await, Ok(Claim::New));
    let held = hold.arm();
    let claim = tokio::spawn(async move { (a.claim(d).await, a) });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the claim's write reached the proxy")
        .unwrap();
    assert_eq!(b.claim(d).await, Ok(Claim::New));
    hold.release.notify_one();
    let (answer, a) = claim.await.unwrap();
    assert_eq!(answer, Ok(Claim::InFlight), "the digest is b's");
    assert_eq!(a.ifeq_conflicts(), 1);
    assert!(
        !a.commit(d).await.unwrap(),
        "b's claim is not a's to commit"
    );
    assert!(b.commit(d).await.unwrap());
}

/// A commit decided on the value its claim wrote (no read) is held back while another owner
/// claims a digest of the same set. The commit's compare fails, and it is decided again on a
/// fresh read: the other digest keeps its entry, and both are committed. (The set script's
/// path without a compare, `commit.rs`, overwrites that entry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_set_changed_since_its_claim_keeps_the_other_entry() {
    // One set of one way would push the entry out; two ways keep both.
    let (server, hold, a, b, namespace) = held_and_direct("ifeq-commit").await;
    let (d, e) = (digest(1), digest(2));
    assert_eq!(a.claim(d).await, Ok(Claim::New));
    let held = hold.arm();
    let commit = tokio::spawn(async move { (a.commit(d).await, a) });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the commit's write reached the proxy")
        .unwrap();
    assert_eq!(b.claim(e).await, Ok(Claim::New));
    hold.release.notify_one();
    let (committed, a) = commit.await.unwrap();
    assert_eq!(committed, Ok(true));
    assert_eq!(a.ifeq_conflicts(), 1);
    assert_eq!(b.commit(e).await, Ok(true), "e kept its entry");
    let c = connect_sets(
        config(&server.url(), &namespace),
        Geometry::new(2, 2).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        claimed(c.claim_many(&[d, e]).await).unwrap(),
        [Claim::Duplicate, Claim::Duplicate]
    );
}

/// The same operations on two tables, one through `SET … IFEQ` and one through the set
/// script (as a client before it): the sets hold the same bytes but for the owners and the
/// times, so either client reads what the other wrote. Two ways fill, wrap and take an
/// erased slot.
#[tokio::test]
async fn sets_written_with_ifeq_are_the_bytes_the_script_writes() {
    let server = valkey();
    let geometry = Geometry::new(4, 2).unwrap();
    let stores = [
        unique_namespace("bytes-ifeq"),
        unique_namespace("bytes-script"),
    ];
    let mut values = Vec::new();
    for (i, namespace) in stores.iter().enumerate() {
        let store = connect_sets(
            RedisConfig {
                max_age: Some(Duration::from_secs(3_600)),
                ..config(&server.url(), namespace)
            },
            geometry,
        )
        .await
        .unwrap();
        if i == 1 {
            store.force_script();
        }
        let digests: Vec<Digest> = (0..12).map(digest).collect();
        claimed(store.claim_many(&digests[..6]).await).unwrap();
        store.commit_many(&digests[..4]).await;
        store.erase_many(&digests[4..5]).await;
        claimed(store.claim_done_many(&digests[6..10]).await).unwrap();
        claimed(store.claim_many(&digests[10..]).await).unwrap();
        store.renew(digests[11]).await.unwrap();
        let mut sets = Vec::new();
        for set in 0..geometry.sets() {
            let key = format!("{}:{set}", store.namespace());
            sets.push(masked(raw_get(&server.url(), &key).await));
        }
        values.push(sets);
    }
    assert_eq!(values[0], values[1]);
    assert!(
        values[0].iter().all(|set| set.len() == 3 + 2 * 34),
        "both sets full: {:?}",
        values[0]
    );
}

/// An expiry an operator gave the store's keys outlives the store's writes on both paths: a
/// commit decided on the value its claim wrote and a claim of a set that exists (each a `SET
/// … IFEQ`), and the script's commit and its claim that appends an entry to a set (Valkey
/// with the script forced, and Redis 7.0).
#[tokio::test]
async fn writes_keep_an_expiry_the_keys_were_given() {
    let geometry = Geometry::new(64, 2).unwrap();
    for (flavor, script) in [
        (Flavor::Valkey, false),
        (Flavor::Valkey, true),
        (Flavor::Redis, true),
    ] {
        let server = RedisServer::of(flavor, &[]);
        let store = connect_sets(
            config(&server.url(), &unique_namespace("keepttl")),
            geometry,
        )
        .await
        .unwrap();
        if script {
            store.force_script();
        }
        let burst = distinct_sets(&store, 8);
        claimed(store.claim_many(&burst).await).unwrap();
        let keys: Vec<String> = burst.iter().map(|d| store.set_key(*d)).collect();
        for key in &keys {
            assert_eq!(server.cli(&["expire", key, "3600"]).trim(), "1", "{key}");
        }
        store.commit_many(&burst).await;
        let others: Vec<Digest> = (1_000..)
            .map(digest)
            .filter(|d| keys.contains(&store.set_key(*d)))
            .take(8)
            .collect();
        claimed(store.claim_many(&others).await).unwrap();
        for key in &keys {
            let ttl: i64 = server.cli(&["ttl", key]).trim().parse().unwrap();
            assert!(
                (3_000..=3_600).contains(&ttl),
                "{flavor:?}, script {script}: {key} has TTL {ttl}"
            );
        }
    }
}

/// The raw value of `key`, read with a client of its own (empty when there is none).
async fn raw_get(url: &str, key: &str) -> Vec<u8> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    value.unwrap_or_default()
}

/// A set's bytes with its entries' times and owners (the last 16 bytes of each 34-byte
/// entry) zeroed: what differs between two owners that do the same.
fn masked(mut value: Vec<u8>) -> Vec<u8> {
    for entry in value[3..].chunks_mut(34) {
        entry[18..].fill(0);
    }
    value
}

/// A Valkey, a proxy before it that holds back the first `IFEQ` write once armed, and two
/// stores of one table (2 sets of 2 ways) in a fresh namespace: `a` through the proxy, `b`
/// direct; and the namespace.
async fn held_and_direct(name: &str) -> (RedisServer, Hold, RedisStore, RedisStore, String) {
    let server = valkey();
    let hold = Hold::start(server.addr().parse().unwrap(), b"IFEQ").await;
    let namespace = unique_namespace(name);
    let geometry = Geometry::new(2, 2).unwrap();
    let a = connect_sets(
        config(&format!("redis://{}", hold.addr), &namespace),
        geometry,
    )
    .await
    .unwrap();
    let b = connect_sets(config(&server.url(), &namespace), geometry)
        .await
        .unwrap();
    (server, hold, a, b, namespace)
}

/// The log says once how the store writes, as soon as it knows: with `SET … IFEQ` on Valkey
/// 8.1, through its script on Redis 7.0, so that an operator sees which way the servers allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_says_once_how_the_store_writes() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let nsqd = broker.tcp_addr().to_string();
    let ifeq = "The Redis store writes each set with SET … IFEQ: its servers have it.";
    let script = "The Redis store writes through its script: a server has no SET … IFEQ \
                  (Valkey 8.1 and later have it).";
    for (flavor, said, not_said) in [
        (Flavor::Valkey, ifeq, script),
        (Flavor::Redis, script, ifeq),
    ] {
        let server = RedisServer::of(flavor, &[]);
        let url = server.url();
        let running = start(&[
            "--topic",
            "events",
            "--nsqd-tcp-address",
            &nsqd,
            "--metrics-address",
            "off",
            "--store",
            "redis",
            "--redis-url",
            &url,
        ]);
        wait_until_or(
            "the line that says how the store writes",
            Duration::from_secs(20),
            || running.stderr().contains(said),
            || running.stderr(),
        )
        .await;
        broker.publish_many(
            "events",
            (0..20).map(|i| bytes::Bytes::from(format!("{i}"))),
        );
        wait_until_or(
            "20 delivered",
            Duration::from_secs(20),
            || running.stdout().lines().count() == 20,
            || running.stderr(),
        )
        .await;
        let stopped = stop(running).await;
        assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
        assert_eq!(stopped.stdout.lines().count(), 20, "{flavor:?}");
        assert_eq!(
            stopped.stderr.matches(said).count(),
            1,
            "{}",
            stopped.stderr
        );
        assert!(!stopped.stderr.contains(not_said), "{}", stopped.stderr);
    }
}
