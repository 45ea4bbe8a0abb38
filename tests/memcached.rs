//! The Memcached-backed table against a real memcached that each test starts itself.
//!
//! Time limits here are generous (2 s per network step) because tests run as debug builds on
//! shared machines; the outage and timeout tests set short limits and check them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_memcached::{AsciiProtocol, Client, MetaProtocol};
use nsq_dedupe::error::StoreError;
use nsq_dedupe::{Claim, Digest, Geometry, MemcachedConfig, MemcachedStore, Store};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::support::memcached::MemcachedServer;
use crate::util::{claim_until_answered, claimed};

/// A namespace no other test (or earlier case) uses, so tests can share nothing by accident.
fn unique_namespace(tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
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

fn digest(n: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
}

/// `per_set` distinct digests in every set of `geometry`, checked with `Geometry::set_of`.
fn digests_per_set(geometry: Geometry, per_set: u64) -> Vec<Digest> {
    let sets = u128::from(geometry.sets());
    let mut digests = Vec::new();
    for set in 0..geometry.sets() {
        // The smallest high half that maps to `set`; the next few map there too.
        let first_hi = (u128::from(set) << 64).div_ceil(sets);
        for j in 0..per_set {
            let hi = first_hi as u64 + j;
            let d =
                Digest::from_u128((u128::from(hi) << 64) | u128::from(digest(set * 100 + j).lo()));
            assert_eq!(geometry.set_of(d), set);
            digests.push(d);
        }
    }
    digests
}

/// A plain async-memcached client (it needs a `tcp://` URL for an IP address).
async fn raw_client(addr: &str) -> Client {
    Client::new(format!("tcp://{addr}"))
        .await
        .expect("connect to memcached")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

// ---------------------------------------------------------------------------------------------
// Property test: random operation sequences against an exact model of the table.

#[derive(Debug, Clone)]
enum Action {
    Claim(usize, usize),
    ClaimMany(usize, Vec<usize>),
    Commit(usize, usize),
    CommitMany(usize, Vec<usize>),
    EraseMany(usize, Vec<usize>),
    Erase(usize, usize),
    Renew(usize, usize),
}

/// Sets in the property test's tables: not a power of two.
const PROP_SETS: u64 = 3;

/// Digests in play: one more per set than fits, so sets overflow and replacement decides.
fn pool_size(ways: u32) -> usize {
    (PROP_SETS * (u64::from(ways) + 1)) as usize
}

fn action(pool: usize) -> impl Strategy<Value = Action> {
    let who = 0..2usize;
    let d = 0..pool;
    prop_oneof![
        4 => (who.clone(), d.clone()).prop_map(|(w, d)| Action::Claim(w, d)),
        2 => (who.clone(), prop::collection::vec(0..pool, 1..6)).prop_map(|(w, ds)| Action::ClaimMany(w, ds)),
        2 => (who.clone(), d.clone()).prop_map(|(w, d)| Action::Commit(w, d)),
        1 => (who.clone(), prop::collection::vec(0..pool, 1..6)).prop_map(|(w, ds)| Action::CommitMany(w, ds)),
        1 => (who.clone(), prop::collection::vec(0..pool, 1..6)).prop_map(|(w, ds)| Action::EraseMany(w, ds)),
        2 => (who.clone(), d.clone()).prop_map(|(w, d)| Action::Erase(w, d)),
        1 => (who, d).prop_map(|(w, d)| Action::Renew(w, d)),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelState {
    InFlight,
    Done,
}

/// The table as specified (the in-process table's rules): per set, `ways` slots and a
/// cursor; a new digest takes the first empty slot, else the slot at the cursor, which then
/// moves on; owners; no lease expiry (leases in this test outlive it).
struct Model {
    geometry: Geometry,
    sets: HashMap<u64, ModelSet>,
}

#[derive(Clone)]
struct ModelSet {
    cursor: usize,
    slots: Vec<Option<(Digest, ModelState, usize)>>,
}

impl Model {
    fn set(&mut self, d: Digest) -> &mut ModelSet {
        let ways = self.geometry.ways() as usize;
        self.sets
            .entry(self.geometry.set_of(d))
            .or_insert_with(|| ModelSet {
                cursor: 0,
                slots: vec![None; ways],
            })
    }

    fn find(&mut self, d: Digest) -> Option<&mut (Digest, ModelState, usize)> {
        self.set(d).slots.iter_mut().flatten().find(|e| e.0 == d)
    }

    fn claim(&mut self, who: usize, d: Digest) -> Claim {
        if let Some(entry) = self.find(d) {
            return match entry.1 {
                ModelState::InFlight => Claim::InFlight,
                ModelState::Done => Claim::Duplicate,
            };
        }
        let set = self.set(d);
        let ways = set.slots.len();
        let victim = match set.slots.iter().position(Option::is_none) {
            Some(empty) => empty,
            None => {
                let victim = set.cursor;
                set.cursor = (set.cursor + 1) % ways;
                victim
            }
        };
        set.slots[victim] = Some((d, ModelState::InFlight, who));
        Claim::New
    }

    fn commit(&mut self, who: usize, d: Digest) -> bool {
        match self.find(d) {
            Some(e) if e.1 == ModelState::Done => true,
            Some(e) if e.2 == who => {
                e.1 = ModelState::Done;
                true
            }
            _ => false,
        }
    }

    fn erase(&mut self, who: usize, d: Digest) -> bool {
        let set = self.set(d);
        match set
            .slots
            .iter_mut()
            .find(|slot| slot.is_some_and(|e| e.0 == d && e.2 == who))
        {
            Some(slot) => {
                *slot = None;
                true
            }
            None => false,
        }
    }

    fn renew(&mut self, who: usize, d: Digest) -> bool {
        self.find(d)
            .is_some_and(|e| e.2 == who && e.1 == ModelState::InFlight)
    }
}

async fn run_case(addr: &str, ways: u32, actions: &[Action]) -> Result<(), TestCaseError> {
    let geometry = Geometry::new(PROP_SETS * u64::from(ways), ways).expect("valid geometry");
    let namespace = unique_namespace("prop");
    // Owner 0 coalesces single operations into pipelines, owner 1 sends each on its own
    // connection: both paths must give the model's answers.
    let mut stores = Vec::new();
    for coalesce in [true, false] {
        let config = MemcachedConfig {
            coalesce,
            ..config(&[addr.to_owned()], &namespace)
        };
        let store = MemcachedStore::connect(config, geometry)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        stores.push(store);
    }
    let pool: Vec<Digest> = (0..pool_size(ways) as u64).map(digest).collect();
    let mut model = Model {
        geometry,
        sets: HashMap::new(),
    };
    let mut ever_claimed = std::collections::HashSet::new();
    let fail = |e: StoreError| TestCaseError::fail(e.to_string());
    for action in actions {
        match action {
            Action::Claim(who, i) => {
                let got = stores[*who].claim(pool[*i]).await.map_err(fail)?;
                if !ever_claimed.contains(i) {
                    prop_assert_eq!(got, Claim::New, "a digest never claimed was reported seen");
                }
                prop_assert_eq!(got, model.claim(*who, pool[*i]), "{:?}", action);
                ever_claimed.insert(*i);
            }
            Action::ClaimMany(who, indices) => {
                let batch: Vec<Digest> = indices.iter().map(|&i| pool[i]).collect();
                let got = claimed(stores[*who].claim_many(&batch).await).map_err(fail)?;
                let mut seen_in_batch = std::collections::HashSet::new();
                for ((i, d), claim) in indices.iter().zip(&batch).zip(&got) {
                    if !ever_claimed.contains(i) && seen_in_batch.insert(*i) {
                        prop_assert_eq!(
                            *claim,
                            Claim::New,
                            "a digest never claimed was reported seen"
                        );
                    }
                    prop_assert_eq!(*claim, model.claim(*who, *d), "{:?}", action);
                }
                ever_claimed.extend(indices.iter().copied());
            }
            Action::Commit(who, i) => {
                let got = stores[*who].commit(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.commit(*who, pool[*i]), "{:?}", action);
            }
            Action::CommitMany(who, indices) | Action::EraseMany(who, indices) => {
                let batch: Vec<Digest> = indices.iter().map(|&i| pool[i]).collect();
                let commit = matches!(action, Action::CommitMany(..));
                let got = if commit {
                    stores[*who].commit_many(&batch).await
                } else {
                    stores[*who].erase_many(&batch).await
                };
                prop_assert_eq!(got.len(), batch.len());
                // A batch is applied as its operations one after another.
                for (d, got) in batch.iter().zip(got) {
                    let expected = if commit {
                        model.commit(*who, *d)
                    } else {
                        model.erase(*who, *d)
                    };
                    prop_assert_eq!(got.map_err(fail)?, expected, "{:?}", action);
                }
            }
            Action::Renew(who, i) => {
                let got = stores[*who].renew(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.renew(*who, pool[*i]), "{:?}", action);
            }
            Action::Erase(who, i) => {
                let got = stores[*who].erase(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.erase(*who, pool[*i]), "{:?}", action);
                // Erase never removes another digest: every other entry of the set is still
                // held (checked without changing anything but an in-flight lease).
                let others: Vec<_> = model
                    .set(pool[*i])
                    .slots
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                for (other, state, owner) in others {
                    let held = match state {
                        ModelState::InFlight => stores[owner].renew(other).await.map_err(fail)?,
                        ModelState::Done => stores[owner].commit(other).await.map_err(fail)?,
                    };
                    prop_assert!(held, "erase of {:?} removed {:?}", pool[*i], other);
                }
            }
        }
    }
    prop_assert_eq!(
        stores[0].unreadable_values() + stores[1].unreadable_values(),
        0
    );
    Ok(())
}

#[test]
fn random_operations_match_the_table_model() {
    let server = MemcachedServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    });
    let strategy = prop::sample::select(vec![1u32, 2, 4, 8]).prop_flat_map(|ways| {
        (
            Just(ways),
            prop::collection::vec(action(pool_size(ways)), 1..80),
        )
    });
    let addr = server.addr();
    let result = runner.run(&strategy, |(ways, actions)| {
        runtime.block_on(run_case(&addr, ways, &actions))
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency: tasks and processes claiming overlapping digests.

/// The shape and digests of the concurrency scenario: 6 digests in each of 128 sets of 8 ways,
/// so no set overflows.
fn contention_scenario() -> (Geometry, Vec<Digest>) {
    let geometry = Geometry::new(128 * 8, 8).expect("valid geometry");
    let digests = digests_per_set(geometry, 6);
    let mut per_set: HashMap<u64, u32> = HashMap::new();
    for d in &digests {
        *per_set.entry(geometry.set_of(*d)).or_default() += 1;
    }
    assert!(
        per_set.values().all(|&n| n <= geometry.ways()),
        "the scenario must not overflow a set"
    );
    (geometry, digests)
}

/// One claimer: claims every digest in a seeded random order, singly or in batches of 16.
/// Returns the digests it got `New` for, when it started and ended (ms since the epoch), and
/// how many of its writes lost a compare-and-swap race.
async fn claim_all(
    store: &MemcachedStore,
    digests: &[Digest],
    seed: u64,
    batched: bool,
) -> (Vec<Digest>, u64, u64, u64) {
    let mut order = digests.to_vec();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let start = now_ms();
    let mut news = Vec::new();
    if batched {
        for chunk in order.chunks(16) {
            let claims = claimed(store.claim_many(chunk).await)
                .unwrap_or_else(|e| panic!("claim_many failed: {e}"));
            news.extend(
                chunk
                    .iter()
                    .zip(claims)
                    .filter(|(_, c)| *c == Claim::New)
                    .map(|(d, _)| *d),
            );
        }
    } else {
        for d in order {
            match store.claim(d).await {
                Ok(Claim::New) => news.push(d),
                Ok(_) => {}
                Err(e) => panic!("claim failed: {e}"),
            }
        }
    }
    (news, start, now_ms(), store.cas_conflicts())
}

/// Sleeps until the wall-clock instant `at_ms`, so claimers in different processes start
/// together.
async fn wait_until(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

const WORKER_ENV: &str = "NSQ_DEDUPE_TEST_CLAIM_WORKER";

/// Not a test: the body of the second and third OS processes of
/// `tasks_and_processes_get_one_new_per_digest`, which runs this binary again with this filter
/// and `NSQ_DEDUPE_TEST_CLAIM_WORKER=<addr> <namespace> <start ms> <seed> <output file>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of tasks_and_processes_get_one_new_per_digest"]
async fn claim_worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let fields: Vec<&str> = spec.split(' ').collect();
    let [addr, namespace, start, seed, out] = fields[..] else {
        panic!("bad {WORKER_ENV}: {spec}");
    };
    let (start, seed): (u64, u64) = (start.parse().unwrap(), seed.parse().unwrap());
    let (geometry, digests) = contention_scenario();
    let mut tasks = Vec::new();
    for t in 0..2u64 {
        let config = MemcachedConfig {
            coalesce: seed % 2 == 0,
            ..config(&[addr.to_owned()], namespace)
        };
        let store = MemcachedStore::connect(config, geometry)
            .await
            .expect("worker connects");
        let digests = digests.clone();
        tasks.push(tokio::spawn(async move {
            wait_until(start).await;
            claim_all(&store, &digests, seed * 10 + t, t == 1).await
        }));
    }
    let mut report = String::new();
    for task in tasks {
        let (news, begin, end, conflicts) = task.await.expect("worker task");
        report.push_str(&format!("T {begin} {end} {conflicts}\n"));
        for d in news {
            report.push_str(&format!("N {}\n", d.as_u128()));
        }
    }
    std::fs::write(out, report).expect("worker writes its report");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_and_processes_get_one_new_per_digest() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("race");
    let (geometry, digests) = contention_scenario();
    let start = now_ms() + 2_000;
    let dir = tempfile::tempdir().expect("temp dir");

    // Two more OS processes: this test binary, running only `claim_worker_process`.
    let exe = std::env::current_exe().expect("test binary path");
    let mut children = Vec::new();
    for p in 0..2u64 {
        let out = dir.path().join(format!("worker-{p}.txt"));
        let child = std::process::Command::new(&exe)
            .args([
                "memcached::claim_worker_process",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env(
                WORKER_ENV,
                format!(
                    "{} {namespace} {start} {} {}",
                    server.addr(),
                    100 + p,
                    out.display()
                ),
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn worker process");
        children.push((child, out));
    }

    // Four tasks in this process, each a store of its own (its own owner id): single claims
    // coalesced and not, and batches.
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let config = MemcachedConfig {
            coalesce: t < 2,
            ..config(&[server.addr()], &namespace)
        };
        let store = MemcachedStore::connect(config, geometry)
            .await
            .expect("connect");
        let digests = digests.clone();
        tasks.push(tokio::spawn(async move {
            wait_until(start).await;
            claim_all(&store, &digests, t, t % 2 == 1).await
        }));
    }
    let mut news: HashMap<Digest, u32> = HashMap::new();
    let mut intervals = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let (got, begin, end, lost) = task.await.expect("claim task");
        intervals.push((begin, end));
        conflicts += lost;
        for d in got {
            *news.entry(d).or_default() += 1;
        }
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    for (mut child, out) in children {
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
        let mut worker_intervals = 0;
        for line in report.lines() {
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some("T"), Some(begin), Some(end), Some(lost)) => {
                    intervals.push((begin.parse().unwrap(), end.parse().unwrap()));
                    conflicts += lost.parse::<u64>().unwrap();
                    worker_intervals += 1;
                }
                (Some("N"), Some(d), None, None) => {
                    *news
                        .entry(Digest::from_u128(d.parse().unwrap()))
                        .or_default() += 1;
                }
                _ => panic!("bad worker line {line:?}"),
            }
        }
        assert_eq!(
            worker_intervals, 2,
            "each worker process reports two claimers"
        );
    }

    // The eight claimers really ran at the same time, and raced for the same sets.
    eprintln!("compare-and-swap conflicts: {conflicts}");
    assert!(
        conflicts > 0,
        "no write ever lost a race: the test did not test atomicity"
    );
    let latest_start = intervals.iter().map(|i| i.0).max().unwrap();
    let earliest_end = intervals.iter().map(|i| i.1).min().unwrap();
    assert!(
        latest_start < earliest_end,
        "claimers did not overlap: {intervals:?}"
    );
    let twice: Vec<_> = news.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} digests claimed New more than once, such as {:?}",
        twice.len(),
        &twice[..twice.len().min(3)]
    );
    assert_eq!(
        news.len(),
        digests.len(),
        "every digest was claimed New exactly once"
    );

    // And every digest is still held (in flight).
    let check = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .expect("connect");
    let claims = claimed(check.claim_many(&digests).await).expect("final claims");
    assert!(claims.iter().all(|c| *c == Claim::InFlight));
    assert_eq!(check.unreadable_values(), 0);
}

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

// ---------------------------------------------------------------------------------------------
// Leases and owners.

fn short_lease(server: &MemcachedServer, namespace: &str, lease_ms: u64) -> MemcachedConfig {
    MemcachedConfig {
        lease: Duration::from_millis(lease_ms),
        ..config(&[server.addr()], namespace)
    }
}

/// Two stores (two owners) on the same server and namespace, as two consumer processes are.
async fn two_stores(
    config: MemcachedConfig,
    geometry: Geometry,
) -> (MemcachedStore, MemcachedStore) {
    let a = MemcachedStore::connect(config.clone(), geometry)
        .await
        .unwrap();
    let b = MemcachedStore::connect(config, geometry).await.unwrap();
    (a, b)
}

#[tokio::test]
async fn expired_lease_is_taken_over() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("lease");
    let geometry = Geometry::new(64, 4).unwrap();
    let (a, b) = two_stores(short_lease(&server, &namespace, 1_000), geometry).await;
    let d = digest(1);
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert_eq!(b.claim(d).await.unwrap(), Claim::InFlight, "lease is live");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        b.claim(d).await.unwrap(),
        Claim::New,
        "expired lease is taken over"
    );
    assert_eq!(
        a.claim(d).await.unwrap(),
        Claim::InFlight,
        "b's new lease is live"
    );
    // a lost the claim: it can neither commit, renew nor erase it.
    assert!(!a.commit(d).await.unwrap());
    assert!(!a.renew(d).await.unwrap());
    assert!(!a.erase(d).await.unwrap());
    assert!(b.commit(d).await.unwrap());
    assert_eq!(a.claim(d).await.unwrap(), Claim::Duplicate);
}

#[tokio::test]
async fn renew_keeps_the_claim() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("renew");
    let geometry = Geometry::new(64, 4).unwrap();
    let (a, b) = two_stores(short_lease(&server, &namespace, 1_000), geometry).await;
    let d = digest(2);
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    // 5 × 400 ms = 2 s, twice the lease: only the renewals keep it.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(a.renew(d).await.unwrap());
        assert_eq!(b.claim(d).await.unwrap(), Claim::InFlight);
    }
    assert!(!b.renew(d).await.unwrap(), "a non-owner cannot renew");
    assert!(a.commit(d).await.unwrap());
    assert!(!a.renew(d).await.unwrap(), "a done entry has no lease");
    assert_eq!(b.claim(d).await.unwrap(), Claim::Duplicate);
}

#[tokio::test]
async fn commit_and_erase_by_a_non_owner_do_nothing() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("owner");
    let geometry = Geometry::new(64, 4).unwrap();
    let (a, b) = two_stores(config(&[server.addr()], &namespace), geometry).await;
    let (d, never) = (digest(3), digest(4));
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert!(!b.commit(d).await.unwrap());
    assert!(!b.erase(d).await.unwrap());
    assert_eq!(
        b.claim(d).await.unwrap(),
        Claim::InFlight,
        "still a's, still in flight"
    );
    assert!(!a.commit(never).await.unwrap());
    assert!(!a.erase(never).await.unwrap());
    assert!(a.commit(d).await.unwrap());
    assert!(
        b.commit(d).await.unwrap(),
        "committing a done entry is a harmless no-op"
    );
    assert!(!b.erase(d).await.unwrap());
    assert_eq!(b.claim(d).await.unwrap(), Claim::Duplicate);
    assert!(a.erase(d).await.unwrap(), "the owner may forget its entry");
    assert_eq!(b.claim(d).await.unwrap(), Claim::New);
    // Clones share the owner.
    let a2 = a.clone();
    assert_eq!(a2.claim(never).await.unwrap(), Claim::New);
    assert!(a.commit(never).await.unwrap());
}

#[tokio::test]
async fn batch_claims_follow_the_single_claim_rules() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("batch");
    let geometry = Geometry::new(16 * 2, 2).unwrap();
    let a = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let (x, y) = (digest(10), digest(11));
    assert_eq!(a.claim(x).await.unwrap(), Claim::New);
    assert!(a.commit(x).await.unwrap());
    let got = claimed(a.claim_many(&[x, y, y, x]).await).unwrap();
    assert_eq!(
        got,
        [
            Claim::Duplicate,
            Claim::New,
            Claim::InFlight,
            Claim::Duplicate
        ]
    );
    assert_eq!(claimed(a.claim_many(&[]).await).unwrap(), []);
    // Three digests in one two-way set: the third pushes out the first.
    let same_set = digests_per_set(geometry, 3);
    let (p, q, r) = (same_set[0], same_set[1], same_set[2]);
    assert_eq!(
        claimed(a.claim_many(&[p, q, r]).await).unwrap(),
        [Claim::New; 3]
    );
    assert_eq!(a.claim(q).await.unwrap(), Claim::InFlight);
    assert_eq!(
        a.claim(p).await.unwrap(),
        Claim::New,
        "p was pushed out (FIFO)"
    );
}

#[tokio::test]
async fn unreadable_value_is_counted_and_replaced() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("garbage");
    let geometry = Geometry::new(64, 4).unwrap();
    let store = MemcachedStore::connect(config(&[server.addr()], &namespace), geometry)
        .await
        .unwrap();
    let (d, e) = (digest(20), digest(21));
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
    // A value far larger than any set is skipped, not loaded, and replaced as well.
    let f = digest(22);
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
    let g = digest(23);
    raw.set(single.item_key(g), "\u{1}\u{0}\u{9}".as_bytes(), None, None)
        .await
        .unwrap();
    assert_eq!(single.claim(g).await.unwrap(), Claim::New);
    assert_eq!(single.claim(g).await.unwrap(), Claim::InFlight);
    assert_eq!(single.unreadable_values(), 1, "9 entries do not fit 4 ways");
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
    let (d, e) = (digest(30), digest(31));
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert_eq!(claimed(store.claim_many(&[e]).await).unwrap(), [Claim::New]);
    let old_pid = server.pid();

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
    let batch = store.claim_many(&[d, e]).await;
    assert!(batch.iter().all(|answer| answer.is_err()), "{batch:?}");
    assert!(store.commit(d).await.is_err());
    assert!(store.renew(d).await.is_err());
    assert!(store.erase(d).await.is_err());
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "failing took {:?}",
        began.elapsed()
    );

    server.restart();
    assert_ne!(server.pid(), old_pid);
    // A restarted memcached is empty, so the digests are new again once we reconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut attempts = 0;
    let recovered = loop {
        attempts += 1;
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
    assert!(attempts <= 2, "recovery took {attempts} attempts");
    assert_eq!(
        claimed(store.claim_many(&[d, e]).await).unwrap(),
        [Claim::InFlight, Claim::New]
    );
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
    let geometry = Geometry::new(256 * 4, 4).unwrap();
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

#[tokio::test]
async fn consumers_of_one_table_each_learn_the_fleets_distinct_rate() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("fleet");
    let geometry = Geometry::new(1024, 8).unwrap();
    let bucket = Duration::from_millis(200);
    let store = |namespace: &str| {
        let mut settings = config(&[server.addr()], namespace);
        settings.fleet_interval = bucket;
        MemcachedStore::connect(settings, geometry)
    };
    let (a, b) = (
        store(&namespace).await.unwrap(),
        store(&namespace).await.unwrap(),
    );
    let other = store(&unique_namespace("fleet-other")).await.unwrap();
    crate::util::assert_each_learns_the_fleets_rate(&a, &b, &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_ejected_after_the_bound_and_taken_back_when_it_answers() {
    let one = MemcachedServer::start();
    let mut two = MemcachedServer::start();
    let servers = vec![one.addr(), two.addr()];
    let mut settings = config(&servers, &unique_namespace("eject"));
    settings.timeout = Duration::from_millis(300);
    settings.eject_after = Some(Duration::from_secs(1));
    let geometry = Geometry::new(256 * 4, 4).unwrap();
    let store = MemcachedStore::connect(settings, geometry).await.unwrap();
    let home = |d: &Digest| store.server_of(&store.item_key(*d));
    let on_two: Vec<Digest> = (0..5000).map(digest).filter(|d| home(d) == 1).collect();
    let mut sets = std::collections::HashSet::new();
    let on_two: Vec<Digest> = on_two
        .into_iter()
        .filter(|d| sets.insert(store.item_key(*d)))
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
    let run_for = Duration::from_millis(2_500);
    // Eight tasks claim fresh digests without pause, recording when each call started and
    // ended and what it returned.
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut n = 0;
            while began.elapsed() < run_for && calls.len() < 100_000 {
                n += 1;
                let start = began.elapsed();
                let result = store.claim(digest(1_000_000 * (t + 1) + n)).await;
                let failed = result.is_err();
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
    server.restart();

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

#[test]
fn store_outlives_the_runtime_that_first_used_it() {
    let server = MemcachedServer::start();
    let namespace = unique_namespace("runtimes");
    let geometry = Geometry::new(64, 4).unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    };
    // The first runtime starts the coalescing task, then shuts down and takes it along.
    let first = runtime();
    let store = first
        .block_on(MemcachedStore::connect(
            config(&[server.addr()], &namespace),
            geometry,
        ))
        .unwrap();
    assert_eq!(first.block_on(store.claim(digest(50))), Ok(Claim::New));
    drop(first);
    // A second runtime gets a new task and the same table.
    let second = runtime();
    assert_eq!(
        second.block_on(store.claim(digest(50))),
        Ok(Claim::InFlight)
    );
    assert_eq!(second.block_on(store.commit(digest(50))), Ok(true));
}

#[tokio::test]
async fn max_age_lets_a_committed_digest_be_claimed_again_once_older() {
    let server = MemcachedServer::start();
    let mut config = config(&[server.addr()], &unique_namespace("max-age"));
    config.max_age = Some(Duration::from_secs(1));
    let geometry = Geometry::new(64, 8).unwrap();
    let store = MemcachedStore::connect(config, geometry).await.unwrap();
    let d = digest(1);
    assert_eq!(store.claim(d).await, Ok(Claim::New));
    assert_eq!(store.commit(d).await, Ok(true));
    assert_eq!(store.claim(d).await, Ok(Claim::Duplicate));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(store.claim(d).await, Ok(Claim::New), "older than max_age");
    assert_eq!(store.claim(d).await, Ok(Claim::InFlight));
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
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to memcached");
    conn.write_all(b"stats\r\n").expect("ask for stats");
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("read stats");
        if let Some(count) = line.strip_prefix("STAT cmd_get ") {
            return count.trim().parse().expect("a count");
        }
        assert!(!line.is_empty() && line != "END\r\n", "no cmd_get in stats");
    }
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
    let commits: Vec<bool> = store
        .commit_many(&burst)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(commits, [true; 50]);
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
