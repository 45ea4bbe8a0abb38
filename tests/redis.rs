//! The Redis-backed table against real `redis-server` processes that each test starts itself,
//! standalone and as a cluster of three masters with a replica each: the store contract
//! (`contract`, and at the start of the cluster test; see `store_contract`), and what only
//! Redis does: its key format and script, passwords, a cluster resharded and failed over while
//! claims run, and the sidecar sharing one table through Redis.
//!
//! The contract, the cluster test, and the tests whose rules hold whatever path the store
//! takes (the key format, unreadable values, outages, failed masters, the sidecar) run on
//! Valkey 8.1 too (`valkey_contract`, [`BOTH`]), where the store writes with `SET … IFEQ`
//! instead of the script; what only that path does is in `redis_ifeq`.
//!
//! Time limits are generous (2 s per operation) because tests run as debug builds on shared
//! machines; the outage tests set short limits and check them. Every wait is bounded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use nsq_dedupe::config::{Dur, StoreKind};
use nsq_dedupe::metrics::get;
use nsq_dedupe::pipeline::StoreErrorPolicy;
use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, RedisStore, Store};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::sidecar::{drained, payload, raw_config, Recorder, Running, TOPIC};
use crate::store_contract::{
    claimed_before_the_outage, digest, fails_fast_while_its_server_is_down,
    recovers_once_an_empty_server_is_back, same_set_pair, unique_namespace, Harness, SharedHarness,
    Spec,
};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::{finish_while_printing, Flavor, RedisCluster, RedisServer};
use crate::util::{claim_until_answered, claimed, wait_until_or};

/// Redis as a store of the contract: a standalone server or a cluster of its own, of either
/// program, or the servers another process named. On Valkey 8.1 every store it connects
/// decides with `SET … IFEQ` but one of the other path (`Spec::single_path`), which the script
/// decides for, as a client of a version before it would: each rule holds for a fleet of both.
pub struct Redis {
    urls: Vec<String>,
    cluster: bool,
    flavor: Flavor,
    /// The key format of the tables it connects stores to: `None` for the store's own, else
    /// 2 (a key per set) or 3 (the compact layout).
    format: Option<u8>,
    _servers: Option<(Option<RedisServer>, Option<RedisCluster>)>,
}

impl Redis {
    /// A harness with a standalone `redis-server` of its own.
    pub fn start() -> Redis {
        Redis::standalone(Flavor::Redis)
    }

    /// A harness with a standalone server of `flavor` of its own.
    pub fn standalone(flavor: Flavor) -> Redis {
        let server = RedisServer::of(flavor, &[]);
        Redis {
            urls: vec![server.url()],
            cluster: false,
            flavor,
            format: None,
            _servers: Some((Some(server), None)),
        }
    }

    /// The key format of the tables a store connects to by default.
    fn format_of_store(&self) -> u8 {
        RedisStore::new_lazy(
            config(&self.urls, self.cluster, "format"),
            Geometry::new(64, 8).unwrap(),
        )
        .unwrap()
        .key_format()
    }

    /// The same harness, for tables of key format `format`.
    pub fn in_format(self, format: u8) -> Redis {
        Redis {
            format: Some(format),
            ..self
        }
    }

    /// The cluster of a harness from [`Redis::start_cluster`].
    fn cluster(&self) -> &RedisCluster {
        match &self._servers {
            Some((_, Some(cluster))) => cluster,
            _ => panic!("not a harness with a cluster of its own"),
        }
    }

    /// A harness with a cluster of `flavor` of its own, whose masters are failed over once
    /// silent for 5 s: a reshard keeps them busy, and on a loaded machine a node timeout of
    /// 1 s failed a master that was only slow (the reshard then met `CLUSTERDOWN`).
    pub fn start_cluster(flavor: Flavor) -> Redis {
        let cluster = RedisCluster::of(flavor, Duration::from_secs(5));
        Redis {
            urls: cluster.urls(),
            cluster: true,
            flavor,
            format: None,
            _servers: Some((None, Some(cluster))),
        }
    }
}

impl Harness for Redis {
    type Store = RedisStore;
    const OWNERS: bool = true;

    async fn connect(&self, spec: &Spec) -> RedisStore {
        let defaults = RedisConfig::default();
        let settings = RedisConfig {
            lease: spec.lease.unwrap_or(defaults.lease),
            max_age: spec.max_age,
            fleet_interval: spec.fleet_interval.unwrap_or(defaults.fleet_interval),
            ..config(&self.urls, self.cluster, &spec.namespace)
        };
        let store = match self.format {
            Some(format) => RedisStore::connect_in(settings, spec.geometry, format).await,
            None => RedisStore::connect(settings, spec.geometry).await,
        }
        .expect("connect to redis");
        assert_eq!(
            store.uses_ifeq(),
            self.flavor == Flavor::Valkey,
            "SET … IFEQ found on {:?}",
            self.flavor
        );
        if spec.single_path {
            store.force_script();
        }
        store
    }

    fn unreadable_values(store: &RedisStore) -> u64 {
        store.unreadable_values()
    }

    /// In the compact layout (key format 3), as in Memcached's.
    fn committed_is_final(&self) -> bool {
        self.format.unwrap_or_else(|| self.format_of_store()) == COMPACT
    }

    /// Fewer than Memcached's 64: each operation is a script run, and Memcached's cases check
    /// the same model.
    const MODEL_CASES: u32 = 16;
}

impl SharedHarness for Redis {
    const KIND: &'static str = "redis";

    /// The URLs, comma-separated, then `+cluster` for a cluster and `+valkey` for Valkey.
    fn address(&self) -> String {
        let mut address = self.urls.join(",");
        if self.cluster {
            address.push_str("+cluster");
        }
        if self.flavor == Flavor::Valkey {
            address.push_str("+valkey");
        }
        if let Some(format) = self.format {
            address.push_str(&format!("+v{format}"));
        }
        address
    }

    fn reach(address: &str) -> Redis {
        let (address, format) = match address.rsplit_once("+v") {
            Some((address, format)) if format.bytes().all(|b| b.is_ascii_digit()) => {
                (address, format.parse().ok())
            }
            _ => (address, None),
        };
        let (address, flavor) = match address.strip_suffix("+valkey") {
            Some(address) => (address, Flavor::Valkey),
            None => (address, Flavor::Redis),
        };
        let (urls, cluster) = match address.strip_suffix("+cluster") {
            Some(urls) => (urls, true),
            None => (address, false),
        };
        Redis {
            urls: urls.split(',').map(str::to_owned).collect(),
            cluster,
            flavor,
            format,
            _servers: None,
        }
    }

    /// The compare-and-set writes that found their key changed: `SET … IFEQ` (Valkey), and
    /// in the compact layout the compare-and-set script too; none where the set script
    /// decides (Redis 7.0 in a key per set), which cannot lose a race.
    fn cas_conflicts(store: &RedisStore) -> Option<u64> {
        (store.uses_ifeq() || store.key_format() == COMPACT).then(|| store.ifeq_conflicts())
    }
}

/// The rules every shared store keeps, against a standalone server, on a table of the layout
/// new tables have (the compact layout: decided in the client, written by the compare-and-set
/// script on Redis 7.0).
mod contract {
    crate::store_contract::store_contract_tests!(shared: super::Redis::start());
}

/// The same rules against a standalone Valkey 8.1, where the store writes with `SET … IFEQ`.
mod valkey_contract {
    use crate::support::redis::Flavor;

    crate::store_contract::store_contract_tests!(
        shared: super::Redis::standalone(Flavor::Valkey)
    );
}

/// The key format of the compact layout, new tables' (see `redis_compact`).
pub const COMPACT: u8 = 3;

/// The key format of a key per set, which a table moves from (the script's layout).
pub const SETS: u8 = 2;

/// A store of a table of a key per set (key format 2): for the tests of what only that layout
/// does (its script, its commits through a claim's slot, its bytes).
pub(crate) async fn connect_sets(
    config: RedisConfig,
    geometry: Geometry,
) -> Result<RedisStore, nsq_dedupe::error::StoreError> {
    RedisStore::connect_in(config, geometry, SETS).await
}

/// The rules on tables of a key per set (key format 2), which a fleet still reads and writes
/// while its table moves to the compact layout, on Redis 7.0: the set script.
mod sets_contract {
    crate::store_contract::store_contract_tests!(
        shared: super::Redis::start().in_format(super::SETS)
    );
}

/// The rules on tables of a key per set on Valkey 8.1, written with `SET … IFEQ` (and by one
/// store of each table through the set script).
mod valkey_sets_contract {
    use crate::support::redis::Flavor;

    crate::store_contract::store_contract_tests!(
        shared: super::Redis::standalone(Flavor::Valkey).in_format(super::SETS)
    );
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

/// Both programs the store runs on: Redis (the set script) and Valkey 8.1 (`SET … IFEQ`),
/// for the tests whose rules hold on both; each says which failed.
const BOTH: [Flavor; 2] = [Flavor::Redis, Flavor::Valkey];

/// The same bytes on both programs, so that clients of the script and of `SET … IFEQ` share
/// one table.
#[tokio::test]
async fn a_set_is_one_key_of_fixed_slots() {
    for flavor in BOTH {
        a_set_is_one_key_of_fixed_slots_on(flavor).await;
    }
}

async fn a_set_is_one_key_of_fixed_slots_on(flavor: Flavor) {
    let server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("owner");
    let geometry = Geometry::new(64, 4).unwrap();
    let settings = config(&[server.url()], false, &namespace);
    let a = connect_sets(settings.clone(), geometry).await.unwrap();
    let b = connect_sets(settings, geometry).await.unwrap();
    let (d, e) = same_set_pair(geometry);
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert_eq!(b.claim(e).await.unwrap(), Claim::New);
    // One key per set (key format 2): version, cursor, ways, then 34 bytes per slot at its
    // fixed offset, as many slots as have been filled.
    let value = raw_get(&server.url(), &a.set_key(d))
        .await
        .expect("the set's key");
    assert_eq!(a.set_key(d), b.set_key(e));
    assert_eq!(&value[..3], &[1, 0, 4], "{flavor:?}");
    assert_eq!(value.len(), 3 + 2 * 34, "{flavor:?}");
    assert!(a.set_key(d).starts_with(&format!("{namespace}:v2:16x4:")));
    assert_eq!(a.unreadable_values(), 0);
}

/// An erase marks its slot free (its slot byte, 16 bytes 0xFF, zeros): the next claim of
/// the set takes that slot, not the cursor's, and the mark is never read as a digest.
#[tokio::test]
async fn an_erased_slot_is_marked_and_taken_by_the_next_claim_of_its_set() {
    for flavor in BOTH {
        an_erased_slot_is_marked_and_taken_on(flavor).await;
    }
}

async fn an_erased_slot_is_marked_and_taken_on(flavor: Flavor) {
    // One set of two ways.
    let geometry = Geometry::new(2, 2).unwrap();
    let (server, settings, store) = server_and_store_on(flavor, "erased", geometry).await;
    let (a, b, c) = (digest(1), digest(2), digest(3));
    assert_eq!(
        claimed(store.claim_many(&[a, b]).await).unwrap(),
        vec![Claim::New; 2]
    );
    assert!(store.erase(b).await.unwrap());
    let key = store.set_key(a);
    let value = raw_get(&server.url(), &key).await.unwrap();
    assert_eq!(
        &value[..3],
        &[1, 0, 2],
        "{flavor:?}: full, cursor at slot 0"
    );
    assert_eq!(&value[37..], &[&[1u8][..], &[0xFF; 16], &[0; 17]].concat());
    assert_eq!(store.claim(c).await.unwrap(), Claim::New);
    let value = raw_get(&server.url(), &key).await.unwrap();
    assert_eq!(
        &value[..3],
        &[1, 0, 2],
        "{flavor:?}: the cursor did not move"
    );
    assert_eq!(
        &value[38..54],
        &c.to_bytes(),
        "{flavor:?}: c took the erased slot"
    );
    assert_eq!(&value[4..20], &a.to_bytes(), "{flavor:?}: a kept its slot");
    let other = connect_sets(settings, geometry).await.unwrap();
    assert_eq!(
        claimed(other.claim_many(&[a, b, c]).await).unwrap(),
        [Claim::InFlight, Claim::New, Claim::InFlight]
    );
}

#[tokio::test]
async fn max_age_keeps_sets_in_the_timed_format() {
    for flavor in BOTH {
        max_age_keeps_sets_in_the_timed_format_on(flavor).await;
    }
}

async fn max_age_keeps_sets_in_the_timed_format_on(flavor: Flavor) {
    let server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("max-age");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = connect_sets(
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
    let value = raw_get(&server.url(), &store.set_key(d)).await.unwrap();
    assert_eq!(value[0], 2, "{flavor:?}: timed format with max_age");
}

#[tokio::test]
async fn unreadable_value_is_counted_and_replaced() {
    for flavor in BOTH {
        unreadable_value_is_counted_and_replaced_on(flavor).await;
    }
}

async fn unreadable_value_is_counted_and_replaced_on(flavor: Flavor) {
    let server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("garbage");
    let geometry = Geometry::new(8, 2).unwrap();
    let store = connect_sets(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let d = digest(5);
    server.cli(&["set", &store.set_key(d), "hello world"]);
    assert_eq!(store.claim(d).await.unwrap(), Claim::New, "{flavor:?}");
    assert_eq!(store.unreadable_values(), 1, "{flavor:?}");
    assert_eq!(store.claim(d).await.unwrap(), Claim::InFlight, "{flavor:?}");
    assert_eq!(
        store.unreadable_values(),
        1,
        "{flavor:?}: replaced by a readable set"
    );
}

#[tokio::test]
async fn a_burst_with_a_set_that_cannot_be_read_fails_only_its_digests_and_the_retry_passes() {
    for flavor in BOTH {
        a_burst_with_a_set_that_cannot_be_read_on(flavor).await;
    }
}

async fn a_burst_with_a_set_that_cannot_be_read_on(flavor: Flavor) {
    let server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("failed-burst");
    // 512 sets of 8 ways: no digest of the burst pushes out another.
    let geometry = Geometry::new(4096, 8).unwrap();
    let store = connect_sets(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let burst: Vec<Digest> = (0..40).map(digest).collect();
    // One set's key holds a list: its digests' claims fail (the claims of sets that hold
    // nothing are written each on its own, see create.rs, or all with `SET … IFEQ`; the
    // script run of the set that cannot be read fails as a whole, writing nothing).
    let broken = store.set_key(burst[17]);
    server.cli(&["rpush", &broken, "not a set"]);
    let first = store.claim_many(&burst).await;
    assert!(
        first[17]
            .as_ref()
            .is_err_and(|error| error.to_string().contains("WRONGTYPE")),
        "{flavor:?}: {:?}",
        first[17]
    );
    server.cli(&["del", &broken]);
    let again = claimed(store.claim_many(&burst).await).unwrap();
    for ((d, first), again) in burst.iter().zip(&first).zip(again) {
        match first {
            // Nothing was written for a failed claim: no digest waits out a lease.
            Err(_) => assert_eq!(again, Claim::New, "{flavor:?}: {d:?} failed, then"),
            Ok(claim) => {
                assert_eq!(*claim, Claim::New, "{flavor:?}: {d:?}");
                assert_eq!(again, Claim::InFlight, "{flavor:?}: {d:?} claimed, then");
            }
        }
    }

    // Commits are written each on its own (see commit.rs, or with `SET … IFEQ`): the digests
    // of the set that cannot be read fail, the others are committed; the failed ones pass
    // once it is back.
    server.cli(&["rename", &broken, "aside"]);
    server.cli(&["rpush", &broken, "not a set"]);
    let of_broken: Vec<bool> = burst.iter().map(|&d| store.set_key(d) == broken).collect();
    let answers = store.commit_many(&burst).await;
    for ((answer, &broken), d) in answers.iter().zip(&of_broken).zip(&burst) {
        if broken {
            assert!(
                answer
                    .as_ref()
                    .is_err_and(|error| error.to_string().contains("WRONGTYPE")),
                "{flavor:?}: {d:?} of the list's set: {answer:?}"
            );
        } else {
            assert_eq!(answer, &Ok(true), "{flavor:?}: {d:?}");
        }
    }
    server.cli(&["del", &broken]);
    server.cli(&["rename", "aside", &broken]);
    let other = connect_sets(config(&[server.url()], false, &namespace), geometry)
        .await
        .unwrap();
    let expected: Vec<Claim> = of_broken
        .iter()
        .map(|&broken| {
            if broken {
                Claim::InFlight
            } else {
                Claim::Duplicate
            }
        })
        .collect();
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        expected,
        "{flavor:?}: the failed commits wrote nothing, the others everything"
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

/// `count` digests whose sets differ, each set a key of its own, for `store`.
fn digests_of_distinct_sets(store: &RedisStore, count: usize) -> Vec<Digest> {
    let mut keys = std::collections::HashSet::new();
    let digests: Vec<Digest> = (0..)
        .map(digest)
        .filter(|d| keys.insert(store.set_key(*d)))
        .take(count)
        .collect();
    digests
}

/// Claims `burst` on `store`, each claim new; the commands the server ran for it.
async fn commands_of_new_claims(
    server: &RedisServer,
    store: &RedisStore,
    burst: &[Digest],
) -> std::collections::BTreeMap<String, u64> {
    server.cli(&["config", "resetstat"]);
    assert_eq!(
        claimed(store.claim_many(burst).await).unwrap(),
        vec![Claim::New; burst.len()]
    );
    command_calls(server)
}

#[tokio::test]
async fn a_claim_on_a_set_that_holds_nothing_is_one_write_and_no_read() {
    let geometry = Geometry::new(1 << 20, 8).unwrap();
    let (server, settings, store) = server_and_store("absent", geometry).await;
    let burst = digests_of_distinct_sets(&store, 128);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    assert_eq!(
        calls.get("set"),
        Some(&128),
        "one write a digest: {calls:?}"
    );
    assert_eq!(calls.get("get"), None, "no set read first: {calls:?}");
    assert_eq!(calls.get("setrange"), None, "{calls:?}");
    assert_eq!(calls.get("evalsha"), None, "no script run: {calls:?}");
    // Each set holds its one entry, in flight, as a claim wrote it before.
    let value = raw_get(&server.url(), &store.set_key(burst[0]))
        .await
        .unwrap();
    assert_eq!(value.len(), 3 + 34);
    assert_eq!(&value[..4], &[1, 0, 8, 0]);
    assert_eq!(&value[4..20], &burst[0].to_bytes());
    assert_eq!(value[20], 1, "in flight");
    let other = connect_sets(settings, geometry).await.unwrap();
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        vec![Claim::InFlight; burst.len()]
    );
    assert_eq!(commit_all(&store, &burst).await, vec![true; burst.len()]);
    assert_eq!(
        claimed(other.claim_many(&burst).await).unwrap(),
        vec![Claim::Duplicate; burst.len()]
    );

    // Two digests of one absent set, and the first again, in one run: the set holds both.
    let (d, e) = same_set_pair(geometry);
    assert_eq!(
        claimed(store.claim_many(&[d, e, d]).await).unwrap(),
        [Claim::New, Claim::New, Claim::InFlight]
    );
    let value = raw_get(&server.url(), &store.set_key(d)).await.unwrap();
    assert_eq!(value.len(), 3 + 2 * 34);
    assert_eq!(commit_all(&store, &[e, d]).await, [true, true]);
    assert_eq!(
        claimed(other.claim_many(&[d, e]).await).unwrap(),
        vec![Claim::Duplicate; 2]
    );
}

#[tokio::test]
async fn claims_on_sets_that_hold_entries_read_them_after_three_found() {
    // 256 sets of 2 ways, each filled many times over.
    let geometry = Geometry::new(512, 2).unwrap();
    let (server, _, store) = server_and_store("present", geometry).await;
    let fill: Vec<Digest> = (10_000..14_096).map(digest).collect();
    for burst in fill.chunks(256) {
        claimed(store.claim_done_many(burst).await).unwrap();
    }
    let burst = digests_of_distinct_sets(&store, 64);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    // Each claim replaces an entry of its full set in place; only the first three sets are
    // asked for with a write that would create them.
    assert_eq!(calls.get("set"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("get"), Some(&61), "{calls:?}");
    assert_eq!(calls.get("setrange"), Some(&64), "{calls:?}");
}

/// Claims go as plain `SET … NX GET`s while most of the last ones created their set, through
/// the script alone once most found one (so that no write is sent for nothing), and back to
/// plain commands once the script finds the keys holding nothing again (a server emptied).
#[tokio::test]
async fn claims_go_without_the_script_while_the_table_fills_and_through_it_once_full() {
    // 512 sets of 2 ways.
    let geometry = Geometry::new(1024, 2).unwrap();
    let (server, _, store) = server_and_store("filling", geometry).await;
    // Digests of 64 distinct sets (or of 64 others), none sent before.
    let sets = digests_of_distinct_sets(&store, 128);
    let fresh = |n: u64, others: bool| -> Vec<Digest> {
        let sets = if others { &sets[64..] } else { &sets[..64] };
        sets.iter()
            .map(|d| {
                let mut bytes = d.to_bytes();
                bytes[8..16].copy_from_slice(&n.to_be_bytes());
                Digest::from_bytes(bytes)
            })
            .collect()
    };
    let burst = fresh(1, false);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    assert_eq!(calls.get("evalsha"), None, "an empty table: {calls:?}");
    assert_eq!(calls.get("set"), Some(&64), "{calls:?}");

    let fill: Vec<Digest> = (10_000..14_096).map(digest).collect();
    for burst in fill.chunks(256) {
        claimed(store.claim_done_many(burst).await).unwrap();
    }
    let burst = fresh(2, false);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    assert_eq!(calls.get("evalsha"), Some(&1), "a full table: {calls:?}");
    assert!(
        calls.get("set").copied().unwrap_or(0) <= 3,
        "no write sent for each claim: {calls:?}"
    );

    server.cli(&["flushall"]);
    let burst = fresh(3, false);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    assert_eq!(
        calls.get("evalsha"),
        Some(&1),
        "the script finds keys empty: {calls:?}"
    );
    let burst = fresh(4, true);
    let calls = commands_of_new_claims(&server, &store, &burst).await;
    assert_eq!(
        calls.get("evalsha"),
        None,
        "emptied, so filling again: {calls:?}"
    );
    assert_eq!(calls.get("set"), Some(&64), "{calls:?}");
}

/// The script run of a claim burst reads every set first, creating those that hold nothing
/// (`SET … NX GET`); when a later key cannot be read, the run deletes the sets it created and
/// fails, so that no digest of it is left claimed. Run as the store sends it (a claim, then a
/// claim written done), its first ten keys holding claims already, its last a list.
#[tokio::test]
async fn a_failed_claim_run_removes_the_sets_it_created_and_keeps_the_others() {
    let server = RedisServer::start();
    let namespace = unique_namespace("failed-create");
    let keys: Vec<String> = (0..40).map(|i| format!("{namespace}:{i}")).collect();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let answers: Vec<i64> = claim_script(SET_SCRIPT, &keys[..10])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answers, [&[0; 10][..], &[0, 10]].concat());
    let mut held = Vec::new();
    for key in &keys[..10] {
        held.push(raw_get(&server.url(), key).await.unwrap());
    }
    server.cli(&["rpush", &keys[39], "not a set"]);
    for op in ["c", "d"] {
        let failed = claim_script_op(SET_SCRIPT, op, &keys)
            .query_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("WRONGTYPE"), "{op}: {failed}");
        for key in &keys[10..39] {
            assert_eq!(
                raw_get(&server.url(), key).await,
                None,
                "a set the failed {op} run created is gone"
            );
        }
        for (key, value) in keys[..10].iter().zip(&held) {
            assert_eq!(
                raw_get(&server.url(), key).await.as_ref(),
                Some(value),
                "a set that held a claim before the failed {op} run holds it still"
            );
        }
    }
    assert_eq!(
        server.cli(&["lrange", &keys[39], "0", "-1"]).trim(),
        "not a set"
    );
    server.cli(&["del", &keys[39]]);
    let answers: Vec<i64> = claim_script(SET_SCRIPT, &keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut expected = vec![1; 10];
    expected.resize(40, 0);
    expected.extend([0, 30]);
    assert_eq!(
        answers, expected,
        "ten in flight, thirty new, thirty sets created"
    );
}

/// How many times the server ran each command (a script's own calls included) since the last
/// `CONFIG RESETSTAT`, from `INFO commandstats`.
pub(crate) fn command_calls(server: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    server
        .cli(&["info", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((command.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn connecting_and_claiming_leave_no_error_in_the_servers_error_stats() {
    let geometry = Geometry::new(4096, 8).unwrap();
    let (server, _, store) = server_and_store("no-errors", geometry).await;
    let burst: Vec<Digest> = (0..16).map(digest).collect();
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::New; burst.len()]
    );
    assert_eq!(commit_all(&store, &burst).await, vec![true; burst.len()]);
    // An operator watches `errorstat_*`: a handshake command the server does not know
    // (`CLIENT SETINFO` before Redis 7.2) would count as an error on every connect.
    let errors: Vec<String> = server
        .cli(&["info", "errorstats"])
        .lines()
        .filter(|line| line.starts_with("errorstat_"))
        .map(str::to_owned)
        .collect();
    assert!(errors.is_empty(), "errors the store caused: {errors:?}");
}

/// A server of its own and a store of `geometry` on it, in a namespace of its own (`tag`),
/// with the settings that connect more stores to the same table.
async fn server_and_store(tag: &str, geometry: Geometry) -> (RedisServer, RedisConfig, RedisStore) {
    server_and_store_on(Flavor::Redis, tag, geometry).await
}

/// As [`server_and_store`], with a server of `flavor`.
async fn server_and_store_on(
    flavor: Flavor,
    tag: &str,
    geometry: Geometry,
) -> (RedisServer, RedisConfig, RedisStore) {
    let server = RedisServer::of(flavor, &[]);
    let settings = config(&[server.url()], false, &unique_namespace(tag));
    let store = connect_sets(settings.clone(), geometry).await.unwrap();
    (server, settings, store)
}

/// Commits `digests` in one burst; each answer, which must not be an error.
async fn commit_all(store: &RedisStore, digests: &[Digest]) -> Vec<bool> {
    store
        .commit_many(digests)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn a_commit_erase_or_renew_after_its_claim_reads_only_its_entry() {
    let geometry = Geometry::new(64, 4).unwrap();
    let (server, settings, store) = server_and_store("hint", geometry).await;
    let (d, e) = same_set_pair(geometry);
    let (f, g) = (digest(7), digest(8));
    assert_eq!(
        claimed(store.claim_many(&[d, e, f, g]).await).unwrap(),
        vec![Claim::New; 4]
    );
    server.cli(&["config", "resetstat"]);
    assert_eq!(commit_all(&store, &[d, e]).await, [true, true]);
    assert!(store.erase(f).await.unwrap());
    assert!(store.renew(g).await.unwrap());
    assert!(store.commit(g).await.unwrap(), "a renew keeps the hint");
    let calls = command_calls(&server);
    // Two commits, an erase, a renew and a commit: each reads its 34-byte entry and writes it.
    assert_eq!(calls.get("getrange"), Some(&5), "{calls:?}");
    assert_eq!(calls.get("get"), None, "no set read whole: {calls:?}");
    assert_eq!(calls.get("setrange"), Some(&5), "{calls:?}");

    let other = connect_sets(settings, geometry).await.unwrap();
    assert_eq!(
        claimed(other.claim_many(&[d, e, f, g]).await).unwrap(),
        [
            Claim::Duplicate,
            Claim::Duplicate,
            Claim::New,
            Claim::Duplicate
        ]
    );
}

#[tokio::test]
async fn a_hint_to_an_entry_taken_over_after_its_lease_is_refused() {
    let geometry = Geometry::new(64, 4).unwrap();
    let (server, settings, next) = server_and_store("hint-lease", geometry).await;
    let lease = Duration::from_millis(300);
    let slow = connect_sets(
        RedisConfig {
            lease,
            ..settings.clone()
        },
        geometry,
    )
    .await
    .unwrap();
    let digests = [digest(1), digest(2), digest(3)];
    assert_eq!(
        claimed(slow.claim_many(&digests).await).unwrap(),
        vec![Claim::New; 3]
    );
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    // The lease lapsed: another owner takes each entry over, in its slot.
    assert_eq!(
        claimed(next.claim_many(&digests).await).unwrap(),
        vec![Claim::New; 3]
    );
    server.cli(&["config", "resetstat"]);
    assert!(!slow.commit(digests[0]).await.unwrap());
    assert!(!slow.erase(digests[1]).await.unwrap());
    assert!(!slow.renew(digests[2]).await.unwrap());
    let calls = command_calls(&server);
    assert_eq!(
        calls.get("getrange"),
        Some(&3),
        "through the hints: {calls:?}"
    );
    assert_eq!(calls.get("setrange"), None, "nothing written: {calls:?}");

    // The new owner's claims stand.
    let third = connect_sets(settings, geometry).await.unwrap();
    assert_eq!(
        claimed(third.claim_many(&digests).await).unwrap(),
        vec![Claim::InFlight; 3]
    );
    assert!(next.commit(digests[0]).await.unwrap());
    assert!(next.erase(digests[1]).await.unwrap());
    assert_eq!(
        claimed(third.claim_many(&digests[..2]).await).unwrap(),
        [Claim::Duplicate, Claim::New]
    );
}

#[tokio::test]
async fn a_hint_to_an_entry_pushed_out_or_moved_falls_back_to_the_set() {
    // One set of two ways.
    let geometry = Geometry::new(2, 2).unwrap();
    let (server, settings, store) = server_and_store("hint-moved", geometry).await;
    let (a, b, c) = (digest(1), digest(2), digest(3));
    // c pushes a out of slot 0.
    assert_eq!(
        claimed(store.claim_many(&[a, b, c]).await).unwrap(),
        vec![Claim::New; 3]
    );
    assert!(!store.commit(a).await.unwrap(), "a was pushed out");
    // Rewrite the set with its two entries swapped: c's hint now points at b's entry.
    let key = store.set_key(c);
    let value = raw_get(&server.url(), &key).await.unwrap();
    assert_eq!(value.len(), 3 + 2 * 34);
    let (mut first, mut second) = (value[3..37].to_vec(), value[37..].to_vec());
    std::mem::swap(&mut first[0], &mut second[0]);
    let swapped = [&value[..3], &second[..], &first[..]].concat();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(swapped)
        .query_async(&mut conn)
        .await
        .unwrap();
    server.cli(&["config", "resetstat"]);
    assert_eq!(
        commit_all(&store, &[c, b]).await,
        [true, true],
        "found in their new slots"
    );
    let calls = command_calls(&server);
    assert_eq!(calls.get("getrange"), Some(&2), "{calls:?}");
    assert!(calls.contains_key("get"), "the set read whole: {calls:?}");
    let other = connect_sets(settings, geometry).await.unwrap();
    assert_eq!(
        claimed(other.claim_many(&[c, b]).await).unwrap(),
        vec![Claim::Duplicate; 2]
    );
}

#[tokio::test]
async fn a_password_from_the_config_opens_a_protected_server() {
    let server = RedisServer::start_with_args(&["--requirepass", "s3cret-pw"]);
    let namespace = unique_namespace("auth");
    let geometry = Geometry::new(8, 2).unwrap();
    let wrong = connect_sets(
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
    let store = connect_sets(config(&[in_url], false, &namespace), geometry)
        .await
        .unwrap();
    assert_eq!(store.config().urls, [server.url()]);
    assert!(!format!("{store:?} {:?}", store.config()).contains("s3cret"));
    assert_eq!(store.claim(digest(1)).await.unwrap(), Claim::New);
}

#[tokio::test]
async fn killed_redis_fails_fast_then_recovers_and_reloads_the_script() {
    for flavor in BOTH {
        killed_server_fails_fast_then_recovers_on(flavor).await;
    }
}

async fn killed_server_fails_fast_then_recovers_on(flavor: Flavor) {
    let mut server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("outage");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = connect_sets(
        RedisConfig {
            timeout: Duration::from_millis(300),
            ..config(&[server.url()], false, &namespace)
        },
        geometry,
    )
    .await
    .unwrap();
    let digests = claimed_before_the_outage(&store).await;
    server.stop();
    fails_fast_while_its_server_is_down(&store, digests).await;
    // The new process is empty and has no script loaded: NOSCRIPT, load, run (on Redis;
    // Valkey's claims find their sets gone, and the sets this store kept are not there).
    server.restart();
    recovers_once_an_empty_server_is_back(&store, digests).await;
}

// Redis Cluster: resharded and failed over while claims run.

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
) -> Processed {
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
            done.load(Ordering::Relaxed) as usize
        })
    };
    for task in tasks {
        task.await.expect("a worker panicked");
    }
    let done_after = watcher.await.expect("the disruption ran");
    Processed {
        errors: errors.load(Ordering::Relaxed) as u32,
        left_after: digests.len().saturating_sub(done_after),
    }
}

/// What [`process_all`] saw.
struct Processed {
    /// Store errors the workers retried.
    errors: u32,
    /// Digests not yet processed when the disruption had been made: more than none, or it
    /// came too late to test anything.
    left_after: usize,
}

/// The claims of `digests`, 100 at a time.
async fn claim_in_chunks(store: &RedisStore, digests: &[Digest]) -> Vec<Claim> {
    let mut claims = Vec::with_capacity(digests.len());
    for chunk in digests.chunks(100) {
        claims.extend(claimed(store.claim_many(chunk).await).unwrap());
    }
    claims
}

/// The store contract against a cluster (its six servers start once), on tables of both
/// layouts, then the same cluster resharded and failed over while claims run.
#[test]
fn redis_cluster_shares_one_table_through_reshard_and_failover() {
    let harness = Redis::start_cluster(Flavor::Redis);
    crate::store_contract::run_all(&harness);
    let other = if harness.format_of_store() == COMPACT {
        2
    } else {
        COMPACT
    };
    let harness = harness.in_format(other);
    crate::store_contract::run_all(&harness);
    let runtime = crate::store_contract::runtime();
    runtime.block_on(a_burst_costs_each_master_at_most_one_script_run(
        harness.cluster(),
    ));
    runtime.block_on(reshard_and_failover(harness.cluster()));
}

/// The same on a cluster of Valkey 8.1, where claims and commits are plain commands.
#[test]
fn valkey_cluster_shares_one_table_through_reshard_and_failover() {
    let harness = Redis::start_cluster(Flavor::Valkey);
    crate::store_contract::run_all(&harness);
    let other = if harness.format_of_store() == COMPACT {
        2
    } else {
        COMPACT
    };
    let harness = harness.in_format(other);
    crate::store_contract::run_all(&harness);
    let runtime = crate::store_contract::runtime();
    runtime.block_on(reshard_and_failover(harness.cluster()));
}

/// A burst claimed and then committed costs each master that holds some of its sets one
/// script run for the claims and one for the commits, whatever the script does inside them:
/// no run per set, no slot map read again, no redirect, no script loaded again, no error.
async fn a_burst_costs_each_master_at_most_one_script_run(cluster: &RedisCluster) {
    const BURST: u64 = 300;
    let store = connect_sets(
        config(&cluster.urls(), true, &unique_namespace("cluster-runs")),
        Geometry::new(1 << 20, 8).unwrap(),
    )
    .await
    .unwrap();
    let burst: Vec<Digest> = (50_000..50_000 + BURST).map(digest).collect();
    let masters = cluster.masters(0);
    let mut held_by = std::collections::HashMap::new();
    for &m in &masters {
        let ranges = slots_served_by(cluster, m, 0);
        let held = burst
            .iter()
            .filter(|&&d| {
                let slot = RedisStore::key_slot(store.set_key(d).as_bytes());
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
            })
            .count();
        assert!(held > 0, "master {m} holds none of {BURST} sets");
        held_by.insert(m, held as u64);
    }
    // A digest whose set came earlier in the burst finds it (its claim goes to the script).
    let mut seen = std::collections::HashSet::new();
    let mut found_by = std::collections::HashMap::new();
    for &d in &burst {
        let key = store.set_key(d);
        let slot = RedisStore::key_slot(key.as_bytes());
        let m = cluster.master_of_slot(slot, 0);
        if !seen.insert(key) {
            *found_by.entry(m).or_insert(0u64) += 1;
        }
    }
    for &m in &masters {
        cluster.nodes[m].cli(&["config", "resetstat"]);
    }
    assert_eq!(
        claimed(store.claim_many(&burst).await).unwrap(),
        vec![Claim::New; burst.len()]
    );
    assert_eq!(commit_all(&store, &burst).await, vec![true; burst.len()]);
    // What a script run may send from inside, counted apart from the runs.
    const DATA: [&str; 6] = ["get", "mget", "set", "getrange", "setrange", "del"];
    for &m in &masters {
        let node = &cluster.nodes[m];
        let mut calls = command_calls(node);
        // The test's own reset, and the replica's acknowledgements of the replication stream.
        calls.retain(|command, _| {
            !DATA.contains(&command.as_str())
                && command != "config|resetstat"
                && command != "replconf"
        });
        let data = command_calls(node);
        let found = found_by.get(&m).copied().unwrap_or(0);
        let runs: std::collections::BTreeMap<String, u64> = if found > 0 {
            [("evalsha".to_owned(), 1)].into()
        } else {
            [].into()
        };
        assert_eq!(
            calls, runs,
            "master {m}: one claim run for the {found} claims of sets the burst made, nothing else"
        );
        let held = held_by[&m];
        assert_eq!(
            (data.get("getrange"), data.get("setrange")),
            (Some(&held), Some(&held)),
            "master {m}: a commit reads and writes its entry, without the script: {data:?}"
        );
        assert!(
            data.get("set").copied().unwrap_or(0) >= held,
            "master {m}: a claim creates its set: {data:?}"
        );
        let errors = node.cli(&["info", "errorstats"]);
        assert!(
            !errors.contains("errorstat_"),
            "master {m} answered errors: {errors}"
        );
    }
    assert_eq!(store.redirects(), 0);
}

async fn reshard_and_failover(cluster: &RedisCluster) {
    let urls = cluster.urls();

    // Large enough that 6,000 digests never overflow a set: whatever is missing was lost.
    let geometry = Geometry::new(1 << 17, 8).unwrap();
    let lease = Duration::from_millis(1_000);
    let store = connect_sets(
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
    let cli = cluster.flavor.cli_bin();
    let Processed { errors, .. } = process_all(&store, &digests, 500, move || {
        // It prints a line per slot it moves. How long 3,000 slots take follows the load
        // (Valkey's took over 80 s on a loaded 2-core machine): what fails is a slot that
        // does not move.
        let output = finish_while_printing(
            std::process::Command::new(cli)
                .args(["--cluster", "reshard", &format!("127.0.0.1:{seed_port}")])
                .args(["--cluster-from", &from, "--cluster-to", &to])
                .args(["--cluster-slots", "3000", "--cluster-yes"]),
            Duration::from_secs(30),
            Duration::from_secs(600),
        )
        .unwrap_or_else(|failure| panic!("reshard: {failure}"));
        *log.lock().unwrap() = output;
    })
    .await;
    assert!(
        resharded.lock().unwrap().contains("Moving slot"),
        "no slot moved"
    );
    cluster.wait_until_ok(&[]);
    let claims = claim_in_chunks(&store, &digests).await;
    // Met while the slots moved, or by these claims, routed by the map read before the last
    // slots moved.
    let redirects = store.redirects();
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
    let Processed { errors, left_after } = process_all(&store, &digests, 500, move || {
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
        "failover: 3000 messages in {took:?}, {left_after} left when the master was killed, {errors} store errors retried, {repeats} would be delivered again (writes the dead master acknowledged but had not replicated)"
    );
    // A store may wait out the failover inside one operation (the compact layout's key-by-key
    // path follows it until `store.timeout`) and answer no error: the test holds if the master
    // died while work was left.
    assert!(
        left_after > 0,
        "the master was killed after every message was processed: nothing was tested"
    );
}

// ---------------------------------------------------------------------------------------------
// The sidecar with Redis: two consumers sharing one table, and an outage under both policies.

/// Settings of a sidecar consuming `brokers` with a table of `buckets` in Redis at `url`.
fn sidecar_settings(
    brokers: &[SocketAddr],
    url: &str,
    namespace: &str,
    buckets: u64,
) -> nsq_dedupe::Settings {
    let mut raw = raw_config(brokers);
    raw.store.kind = Some(StoreKind::Redis);
    raw.store.redis_urls = Some(vec![url.to_owned()]);
    raw.store.namespace = Some(namespace.to_owned());
    raw.store.buckets = Some(buckets);
    // Exactly once holds while the store answers: a claim or commit past its time limit is a
    // store error, which may let a copy through. A busy machine may take longer than 500 ms.
    raw.store.timeout = Some(Dur(Duration::from_secs(5)));
    // Each copy is a duplicate once: a message nsqd redelivers after `msg_timeout` (2 s in
    // `raw_config`, which a loaded machine exceeded) comes in again and is decided again.
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(60)));
    raw.validate().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_sharing_redis_deliver_each_payload_once() {
    for flavor in BOTH {
        let server = RedisServer::of(flavor, &[]);
        let namespace = unique_namespace("sidecars");
        two_sidecars_deliver_each_payload_once(&server, &namespace, 1 << 16, 2_000).await;
    }
}

/// The same on a table whose sets are all full before the stream starts, as a table is once
/// it has run for a window: each claim replaces the oldest entry of its set while the other
/// sidecar claims the copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_sharing_a_full_redis_table_deliver_each_payload_once() {
    for flavor in BOTH {
        two_sidecars_sharing_a_full_table_on(flavor).await;
    }
}

async fn two_sidecars_sharing_a_full_table_on(flavor: Flavor) {
    let server = RedisServer::of(flavor, &[]);
    let namespace = unique_namespace("sidecars-full");
    // 512 sets of 8 ways, each filled about three times over with digests of no payload.
    const BUCKETS: u64 = 4_096;
    let store = RedisStore::connect(
        config(&[server.url()], false, &namespace),
        Geometry::new(BUCKETS, 8).unwrap(),
    )
    .await
    .unwrap();
    let fill: Vec<Digest> = (1_000_000..1_000_000 + 3 * BUCKETS).map(digest).collect();
    for burst in fill.chunks(256) {
        claimed(store.claim_done_many(burst).await).unwrap();
    }
    server.cli(&["config", "resetstat"]);
    // 300 payloads in 512 sets: none is pushed out before its copy comes.
    two_sidecars_deliver_each_payload_once(&server, &namespace, BUCKETS, 300).await;
    let calls = command_calls(&server);
    // Each key of the compact layout is written whole by a compare-and-set: the script's on
    // Redis 7.0 (its own `SET`s counted too), `SET … IFEQ` on Valkey 8.1, where the script
    // runs only for a key whose compare failed eight rounds in a row while both sidecars
    // wrote it (64 keys here, so that they meet often).
    let writes = calls.get("set").copied().unwrap_or(0);
    assert!(
        writes >= 300,
        "{flavor:?}: claims replaced entries of full sets: {calls:?}"
    );
    let scripts = calls.get("evalsha").copied().unwrap_or(0);
    match flavor {
        Flavor::Redis => assert!(scripts >= 300, "{calls:?}"),
        Flavor::Valkey => assert!(scripts * 10 < writes, "few script runs: {calls:?}"),
    }
}

/// Two sidecars on `namespace` of a table of `buckets`, each reading two brokers that hold
/// the same `n` payloads (in another order): each payload is delivered exactly once.
async fn two_sidecars_deliver_each_payload_once(
    server: &RedisServer,
    namespace: &str,
    buckets: u64,
    n: usize,
) {
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let brokers = [a.tcp_addr(), b.tcp_addr()];
    let recorder = Recorder::default();
    let settings = || sidecar_settings(&brokers, &server.url(), namespace, buckets);
    let first = Running::start(settings(), recorder.clone()).await;
    let second = Running::start(settings(), recorder.clone()).await;
    // Published once both are ready on both brokers, so that the first cannot take the whole
    // stream before the second connects (it did on a loaded machine with 300 payloads).
    let ready = |broker: &Broker| {
        broker
            .clients()
            .iter()
            .filter(|c| c.subscription.is_some() && c.rdy > 0)
            .count()
    };
    wait_until_or(
        "both sidecars ready on both brokers",
        Duration::from_secs(30),
        || ready(&a) == 2 && ready(&b) == 2,
        || format!("ready: {}, {}", ready(&a), ready(&b)),
    )
    .await;
    a.publish_many(TOPIC, (0..n).map(payload));
    b.publish_many(TOPIC, order.iter().map(|&i| payload(i)));
    wait_until_or(
        "every payload delivered and both brokers drained",
        Duration::from_secs(60),
        || recorder.distinct_delivered() == n && drained(&a) && drained(&b),
        || format!("{} distinct delivered", recorder.distinct_delivered()),
    )
    .await;
    let (m1, m2) = (first.metrics.clone(), second.metrics.clone());
    first.stop().await;
    second.stop().await;
    let delivered = recorder.delivered();
    let store_errors = get(&m1.store_errors) + get(&m2.store_errors);
    for i in 0..n {
        assert_eq!(
            delivered.get(&payload(i)),
            Some(&1),
            "payload {i} ({store_errors} store errors)"
        );
    }
    let unique = (get(&m1.unique), get(&m2.unique));
    let duplicates = get(&m1.duplicates) + get(&m2.duplicates);
    let redelivered = a.stats().timeouts + b.stats().timeouts;
    println!(
        "two sidecars sharing Redis: {n} payloads published to 2 nsqd, unique {unique:?}, {duplicates} duplicates, {} store errors, {redelivered} redelivered after msg_timeout",
        get(&m1.store_errors) + get(&m2.store_errors)
    );
    assert!(unique.0 > 0 && unique.1 > 0, "both sidecars took part");
    assert_eq!(unique.0 + unique.1, n as u64, "in: 2n messages, out: n");
    assert_eq!(
        duplicates, n as u64,
        "each copy a duplicate once ({redelivered} messages redelivered after msg_timeout)"
    );
}

/// A sidecar on two nsqd with the same payloads; Redis is killed for 1.5 s mid-stream.
/// Returns (delivered at the kill, delivered 1.5 s later, deliveries in all) and checks that
/// every payload was delivered.
async fn redis_outage(flavor: Flavor, policy: StoreErrorPolicy) -> (usize, usize, u32, u64) {
    let mut server = RedisServer::of(flavor, &[]);
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
        "{flavor:?} outage, on_store_error = {policy:?}: {at_stop} delivered at the kill, {during} 1.5 s later, {} store errors, {} extra deliveries",
        get(&metrics.store_errors),
        total as usize - N
    );
    (at_stop, during, total, get(&metrics.store_error_requeues))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_with_requeue_loses_nothing_and_waits() {
    for flavor in BOTH {
        let (at_stop, during, _, requeues) = redis_outage(flavor, StoreErrorPolicy::Requeue).await;
        assert!(requeues > 0, "{flavor:?}");
        assert!(
            during - at_stop < 100,
            "{flavor:?}: with policy requeue, little is delivered while the store is down \
             ({at_stop} -> {during})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_with_process_loses_nothing_and_keeps_delivering() {
    let (at_stop, during, _, requeues) =
        redis_outage(Flavor::Redis, StoreErrorPolicy::Process).await;
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
        let store = connect_sets(config(&[server.url()], false, "nsq-dedupe"), geometry)
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
    a_burst_fails_only_the_digests_of_a_failed_master_on(Flavor::Redis).await;
}

/// The same on Valkey 8.1, whose claims and commits are pipelines of plain commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_valkey_fails_only_the_digests_of_a_failed_master() {
    a_burst_fails_only_the_digests_of_a_failed_master_on(Flavor::Valkey).await;
}

async fn a_burst_fails_only_the_digests_of_a_failed_master_on(flavor: Flavor) {
    let cluster = RedisCluster::of(flavor, Duration::from_secs(1));
    let store = connect_sets(
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
        // The burst goes once the signal took effect: a master still dying could run a
        // claim, replicate it and die before answering, and its digests would be in flight.
        wait_until_signalled(pid, signal);
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

/// Waits (at most 5 s) until process `pid` is stopped (`STOP`) or dead (`KILL`), as
/// `/proc/<pid>/stat` tells.
fn wait_until_signalled(pid: u32, signal: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit(')')
                    .next()
                    .and_then(|rest| rest.trim().chars().next())
            });
        let done = match (signal, state) {
            ("STOP", Some(state)) => state == 'T',
            (_, None) => true,
            (_, Some(state)) => state == 'Z' || state == 'X',
        };
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "SIG{signal} did not take effect on {pid}: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A cluster run that reaches a key its node does not serve (routed by a stale slot map)
/// fails, and leaves none of the sets its claims created before that key: the script is run
/// as the store sends it, on a master, its first keys the master's and its last another's.
#[tokio::test]
async fn a_cluster_run_that_reaches_another_nodes_key_leaves_nothing_written() {
    let cluster = RedisCluster::start();
    let namespace = unique_namespace("non-local");
    let key = |i: u64| format!("{namespace}:{i}");
    let master = |key: &String| cluster.master_of_slot(RedisStore::key_slot(key.as_bytes()), 0);
    let home = master(&key(0));
    let mut keys: Vec<String> = (0..)
        .map(key)
        .filter(|k| master(k) == home)
        .take(5)
        .collect();
    keys.push((0..).map(key).find(|k| master(k) != home).unwrap());
    let mut conn = redis::Client::open(cluster.nodes[home].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let claim = |keys: &[String]| claim_script(SET_SCRIPT, keys);
    let failed = claim(&keys)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        failed.to_string().contains("non local key"),
        "the run fails at the other node's key: {failed}"
    );
    for key in &keys[..5] {
        let exists: u64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{key} was created by the failed run and removed");
    }
    // The node's own keys alone: each claimed new, in slot 0.
    let answers: Vec<i64> = claim(&keys[..5]).query_async(&mut conn).await.unwrap();
    assert_eq!(
        answers,
        [0, 0, 0, 0, 0, 0, 5],
        "five new claims, no unreadable set, five keys that held none"
    );
}

/// The store's set script.
const SET_SCRIPT: &str = include_str!("../src/dedup/redis/set.lua");

/// An `EVAL` of `script` as the store sends its set script: a claim (8 ways, no `max_age`) of
/// the `i`th test digest in the set at `keys[i]`, by one owner, with a lease of a minute.
fn claim_script(script: &str, keys: &[String]) -> redis::Cmd {
    claim_script_op(script, "c", keys)
}

/// [`claim_script`] with the operation `op` ("c" a claim, "d" a claim written done).
fn claim_script_op(script: &str, op: &str, keys: &[String]) -> redis::Cmd {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut eval = redis::cmd("EVAL");
    eval.arg(script)
        .arg(1)
        .arg(&keys[0])
        .arg(op)
        .arg(&[7u8; 8][..])
        .arg(now)
        .arg(now + 60_000)
        .arg("")
        .arg(8)
        .arg(1);
    for i in 0..keys.len() {
        eval.arg(&digest(i as u64).to_bytes()[..]);
    }
    eval.arg(keys);
    eval
}

/// A server that refuses `NX` with `GET` (before Redis 7.0, "ERR syntax error") has its claims
/// read with `GET` and written as before: shown with a copy of the script whose `SET … NX GET`
/// carries an argument that no server takes.
#[tokio::test]
async fn a_server_that_refuses_nx_with_get_has_its_claims_read_first() {
    let server = RedisServer::start();
    let refused = SET_SCRIPT.replace("'NX', 'GET')", "'NX', 'GET', 'REFUSED')");
    assert_ne!(refused, SET_SCRIPT, "the script sends SET … NX GET");
    let namespace = unique_namespace("refused");
    let keys: Vec<String> = (0..5).map(|i| format!("{namespace}:{i}")).collect();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let answers: Vec<i64> = claim_script(&refused, &keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        answers,
        [0, 0, 0, 0, 0, 0, 5],
        "five new claims, no unreadable set, five keys that held none"
    );
    let calls = command_calls(&server);
    assert_eq!(calls.get("get"), Some(&5), "each set read: {calls:?}");
    for (i, key) in keys.iter().enumerate() {
        let value = raw_get(&server.url(), key).await.unwrap();
        assert_eq!(value.len(), 3 + 34, "{key} holds its one entry");
        assert_eq!(&value[4..20], &digest(i as u64).to_bytes());
    }
    // The same claims through the store's own script: each in flight.
    let answers: Vec<i64> = claim_script(SET_SCRIPT, &keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answers, [1, 1, 1, 1, 1, 0, 0]);
}
