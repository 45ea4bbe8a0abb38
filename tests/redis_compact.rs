//! The Redis store's compact layout (key format 3, `src/dedup/redis/layout.rs`, `items.rs`):
//! 64 slots a key, 8-byte entries, decided in the client and written back whole by a
//! compare-and-set, `SET … IFEQ` on Valkey 8.1 and the compare-and-set script on Redis 7.0.
//! The rules of the store contract are checked on it in `redis` (`contract`, `valkey_contract`
//! and the cluster tests, on both layouts); here, what a burst costs each server in commands,
//! the bytes of a key, the memory `size` counts, a server that lost its script, and a burst in
//! a cluster sent to the master of each key.

use std::time::Duration;

use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, RedisStore, Store};

use crate::redis::{command_calls, COMPACT};
use crate::redis_ifeq::config;
use crate::store_contract::{digest, unique_namespace};
use crate::support::redis::{Flavor, RedisCluster, RedisServer};
use crate::util::claimed;

/// `count` digests whose keys differ, for `store`, then `more` more of the first one's key.
fn distinct_keys(store: &RedisStore, count: usize, more: usize) -> Vec<Digest> {
    let mut keys = std::collections::HashSet::new();
    let mut burst: Vec<Digest> = (0..)
        .map(digest)
        .filter(|d| keys.insert(store.set_key(*d)))
        .take(count)
        .collect();
    let first = store.set_key(burst[0]);
    burst.extend(
        (1_000_000..)
            .map(digest)
            .filter(|d| store.set_key(*d) == first)
            .take(more),
    );
    burst
}

/// A burst costs each key one command while the table fills (`SET … NX GET`, which creates
/// it), and one conditional write (`SET … IFEQ` on Valkey 8.1, an `EVALSHA` of the
/// compare-and-set script on Redis 7.0) for the key whose other digests were decided on the
/// value it created; their commits are one conditional write a key and no read (the store
/// keeps the values it wrote). A key holds 8 sets of 8 ways, in its short form while it fills:
/// a key of one committed entry is 28 bytes.
#[tokio::test]
async fn a_compact_burst_is_one_command_a_key_and_its_keys_hold_64_slots() {
    for flavor in [Flavor::Redis, Flavor::Valkey] {
        let server = RedisServer::of(flavor, &[]);
        let namespace = unique_namespace("compact");
        let geometry = Geometry::new(1 << 20, 8).unwrap();
        let store = RedisStore::connect_in(config(&server.url(), &namespace), geometry, COMPACT)
            .await
            .unwrap();
        assert_eq!(store.key_format(), COMPACT);
        let burst = distinct_keys(&store, 50, 3);
        let key = store.set_key(burst[1]);
        let prefix = format!("{namespace}:v3:131072x8g8:");
        assert!(key.starts_with(&prefix), "{key}");
        // Counted with the commands a script runs: the compare-and-set script's own `GET`
        // and `SET` on Redis 7.0.
        let expected = |plain_sets: u64, scripts: u64| {
            let mut calls = std::collections::BTreeMap::new();
            if flavor == Flavor::Valkey {
                calls.insert("set".to_owned(), plain_sets + scripts);
            } else {
                calls.insert("set".to_owned(), plain_sets + scripts);
                calls.insert("get".to_owned(), scripts);
                calls.insert("evalsha".to_owned(), scripts);
            }
            calls.retain(|_, &mut n| n > 0);
            calls
        };
        server.cli(&["config", "resetstat"]);
        assert_eq!(
            claimed(store.claim_many(&burst).await).unwrap(),
            vec![Claim::New; burst.len()],
            "{flavor:?}"
        );
        assert_eq!(calls(&server), expected(50, 1), "{flavor:?}");
        server.cli(&["config", "resetstat"]);
        let committed = store.commit_many(&burst).await;
        assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
        assert_eq!(calls(&server), expected(0, 50), "{flavor:?}: no read");
        let value = raw(&server, &key);
        // Short form, untimed (5); 8 sets of 8 ways; nothing in flight; 8 cursors, 8 lengths,
        // one fingerprint.
        assert_eq!(value[..4], [5, 8, 8, 0], "{flavor:?}: {value:?}");
        assert_eq!(value.len(), 4 + 8 + 8 + 8, "{flavor:?}: {value:?}");
        assert_eq!(
            claimed(store.claim_many(&burst).await).unwrap(),
            vec![Claim::Duplicate; burst.len()],
            "{flavor:?}"
        );
        let errors = server.cli(&["info", "errorstats"]);
        assert!(!errors.contains("errorstat_"), "{flavor:?}: {errors}");
    }
}

/// In a cluster, a burst's keys go to their masters grouped by the slot of each key (an item
/// of 8 sets), not of its sets' own numbers: no command meets `MOVED`, which would send its
/// key on alone, one command and a reading of the slot map each, and slow every burst down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_burst_in_a_cluster_meets_no_redirect() {
    for flavor in [Flavor::Redis, Flavor::Valkey] {
        let cluster = RedisCluster::of(flavor, Duration::from_secs(1));
        let settings = RedisConfig {
            urls: cluster.urls(),
            cluster: true,
            ..config("", &unique_namespace("compact-cluster"))
        };
        let store = RedisStore::connect_in(settings, Geometry::new(1 << 20, 8).unwrap(), COMPACT)
            .await
            .unwrap();
        let burst: Vec<Digest> = (0..300).map(digest).collect();
        claims_and_commits(&store, &burst, flavor).await;
        assert_eq!(store.redirects(), 0, "{flavor:?}: MOVED or ASK followed");
        for m in cluster.masters(0) {
            let errors = cluster.nodes[m].cli(&["info", "errorstats"]);
            assert!(
                !errors.contains("errorstat_"),
                "{flavor:?}: master {m}: {errors}"
            );
        }
    }
}

/// A Redis 7.0 that lost its scripts (restarted, or `SCRIPT FLUSH`) answers the pipelined
/// compare-and-set `NOSCRIPT`: the keys are read and written again one by one through the
/// script, loaded again, and every commit holds.
#[tokio::test]
async fn a_server_that_lost_the_compare_and_set_script_gets_every_write() {
    let server = RedisServer::of(Flavor::Redis, &[]);
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let store = RedisStore::connect_in(
        config(&server.url(), &unique_namespace("noscript")),
        geometry,
        COMPACT,
    )
    .await
    .unwrap();
    let burst = distinct_keys(&store, 20, 0);
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::New; burst.len()]
    );
    server.cli(&["script", "flush"]);
    let committed = store.commit_many(&burst).await;
    assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
    let errors = server.cli(&["info", "errorstats"]);
    assert!(errors.contains("errorstat_NOSCRIPT"), "{errors}");
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::Duplicate; burst.len()]
    );
}

/// A compact store of a user with a password, on database 3, claims and commits through
/// connections that all log in as that user and use that database: the store's own
/// connections of the hot path too (more than the one connection a node of the `redis`
/// crate's), which would otherwise fail (`NOAUTH`) and leave every key to the script.
#[tokio::test]
async fn a_compact_store_logs_in_and_selects_its_database_on_every_connection() {
    for flavor in [Flavor::Redis, Flavor::Valkey] {
        let server = RedisServer::of(flavor, &["--requirepass", "admin-pw"]);
        let admin = |args: &[&str]| {
            let mut all = vec!["--no-auth-warning", "-a", "admin-pw"];
            all.extend_from_slice(args);
            server.cli(&all)
        };
        admin(&[
            "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all",
        ]);
        let url = format!("redis://app:app-pw@{}/3", server.addr());
        let namespace = unique_namespace("login");
        let geometry = Geometry::new(1 << 20, 8).unwrap();
        let store = RedisStore::connect_in(config(&url, &namespace), geometry, COMPACT)
            .await
            .unwrap();
        let burst = distinct_keys(&store, 30, 2);
        claims_and_commits(&store, &burst, flavor).await;
        assert_eq!(
            claimed(store.claim_many(&burst).await).unwrap(),
            vec![Claim::Duplicate; burst.len()],
            "{flavor:?}"
        );
        assert_eq!(admin(&["-n", "0", "DBSIZE"]).trim(), "0", "{flavor:?}");
        assert_ne!(admin(&["-n", "3", "DBSIZE"]).trim(), "0", "{flavor:?}");
        let clients = admin(&["CLIENT", "LIST"]);
        let app: Vec<&str> = clients
            .lines()
            .filter(|client| client.contains(" user=app "))
            .collect();
        assert!(app.len() >= 2, "{flavor:?}: {clients}");
        assert!(
            app.iter().all(|client| client.contains(" db=3 ")),
            "{flavor:?}: {clients}"
        );
    }
}

/// A full key of the compact layout takes what `size` counts for it (`MEMORY USAGE`, Redis
/// 7.0), untimed and timed (`max_age`), in a production-sized table's namespace.
#[tokio::test]
async fn a_full_key_takes_what_size_counts_for_it() {
    let server = RedisServer::of(Flavor::Redis, &[]);
    for max_age in [None, Some(Duration::from_secs(3600))] {
        let geometry = Geometry::new(1 << 23, 8).unwrap();
        let settings = RedisConfig {
            max_age,
            ..config(&server.url(), "nsq-dedupe")
        };
        let store = RedisStore::connect(settings, geometry).await.unwrap();
        let key = store.set_key(digest(0));
        // Eight digests of each of the key's eight sets.
        let mut per_set = std::collections::HashMap::new();
        let full: Vec<Digest> = (0..)
            .map(digest)
            .filter(|d| {
                let held = per_set.entry(geometry.set_of(*d)).or_insert(0);
                store.set_key(*d) == key && *held < 8 && {
                    *held += 1;
                    true
                }
            })
            .take(64)
            .collect();
        assert_eq!(
            claimed(store.claim_many(&full).await).unwrap(),
            vec![Claim::New; 64]
        );
        assert!(store
            .commit_many(&full)
            .await
            .iter()
            .all(|c| c == &Ok(true)));
        let measured: u64 = server
            .cli(&["memory", "usage", &key, "samples", "0"])
            .trim()
            .parse()
            .unwrap();
        let reported = nsq_dedupe::sizing::redis_key_bytes(8, 8, max_age.is_some());
        assert!(
            measured.abs_diff(reported) <= 16,
            "max_age {max_age:?}: MEMORY USAGE says {measured}, size counts {reported}"
        );
        server.cli(&["flushall"]);
    }
}

/// `size`'s estimate of a table's memory in Redis (`sizing::redis_bytes_estimate`) is within
/// a tenth of what Redis counts for it (`used_memory`) once the table is full (twice its slots
/// of digests: nearly every set at its ways), written as a sidecar writes it: claims then
/// commits.
#[tokio::test]
async fn the_memory_estimate_is_within_a_tenth_of_what_redis_counts() {
    let (estimate, measured) = estimate_and_used_memory(Flavor::Redis).await;
    assert!(
        estimate.abs_diff(measured) * 10 <= measured,
        "estimated {estimate} bytes, Redis counts {measured}"
    );
}

/// Valkey 8.1 embeds a key's name in its object (and this build allocates with the C
/// library's `malloc`, not jemalloc): it spends less than Redis, so the estimate, Redis's,
/// is never below what Valkey counts, and at most 15% above it.
#[tokio::test]
async fn the_memory_estimate_is_at_most_a_little_above_what_valkey_counts() {
    let (estimate, measured) = estimate_and_used_memory(Flavor::Valkey).await;
    assert!(
        estimate >= measured && (estimate - measured) * 100 <= 15 * measured,
        "estimated {estimate} bytes, Valkey counts {measured}"
    );
}

/// `size`'s estimate of a full table, and what a server of `flavor` counts for it.
async fn estimate_and_used_memory(flavor: Flavor) -> (u64, u64) {
    let server = RedisServer::of(flavor, &[]);
    let geometry = Geometry::new(16_384 * 8, 8).unwrap();
    // A generous time limit: a debug build on a loaded machine.
    let settings = RedisConfig {
        timeout: Duration::from_secs(10),
        ..config(&server.url(), &unique_namespace("memory"))
    };
    let store = RedisStore::connect(settings, geometry).await.unwrap();
    let before = used_memory(&server);
    let digests: Vec<Digest> = (0..2 * geometry.slots()).map(digest).collect();
    for burst in digests.chunks(128) {
        claimed(store.claim_many(burst).await).unwrap();
        assert!(store.commit_many(burst).await.iter().all(Result::is_ok));
    }
    let measured = used_memory(&server) - before;
    (nsq_dedupe::sizing::redis_bytes_estimate(geometry), measured)
}

/// Redis's `used_memory`.
fn used_memory(server: &RedisServer) -> u64 {
    let info = server.cli(&["info", "memory"]);
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// The commands the server ran since `CONFIG RESETSTAT`, but that one.
fn calls(server: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    let mut calls = command_calls(server);
    calls.retain(|command, _| !command.starts_with("config"));
    calls
}

/// Claims `burst` on `store`, each new, and commits it, each held.
async fn claims_and_commits(store: &RedisStore, burst: &[Digest], flavor: Flavor) {
    assert_eq!(
        claimed(store.claim_many(burst).await).unwrap(),
        vec![Claim::New; burst.len()],
        "{flavor:?}"
    );
    let committed = store.commit_many(burst).await;
    assert!(committed.iter().all(|c| c == &Ok(true)), "{committed:?}");
}

/// The raw value of `key`.
fn raw(server: &RedisServer, key: &str) -> Vec<u8> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    redis::cmd("GET").arg(key).query(&mut conn).unwrap()
}
