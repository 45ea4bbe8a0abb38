//! The store contract: the rules every store keeps, written once and run against each store.
//!
//! A [`Harness`] connects stores of one kind to a table; each rule is a function generic over
//! it, listed once in [`each_rule!`] with the stores it applies to and how it runs.
//! [`store_contract_tests!`] makes a test of each rule in the module that calls it: the
//! in-process table (`table::contract`), Memcached (`memcached::contract`) and Redis
//! (`redis::contract`); [`run_all`] runs every rule in one test against a Redis Cluster, so that
//! its six servers start once. What only one store does (its protocol, its failover) stays in
//! that store's own file.
//!
//! The rules of owners and leases, the fleet's counters and the race of several OS processes
//! belong to the shared stores ([`SharedHarness`]); the in-process table has one owner, its
//! process.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::LocalBoxFuture;
use nsq_dedupe::error::StoreError;
use nsq_dedupe::{Claim, Digest, FleetCounters, Geometry, Store};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::support::child::Child;
use crate::util::claimed;

/// A namespace no other test (or earlier case) uses, so tests can share nothing by accident.
pub fn unique_namespace(tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `n`th test digest.
pub fn digest(n: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
}

/// Milliseconds since the epoch: an instant that other processes read alike.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// `per_set` distinct digests in every set of `geometry`, checked with `Geometry::set_of`.
pub fn digests_per_set(geometry: Geometry, per_set: u64) -> Vec<Digest> {
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

/// Two digests of one set of `geometry`.
pub fn same_set_pair(geometry: Geometry) -> (Digest, Digest) {
    let first = digest(1_000);
    let set = geometry.set_of(first);
    let second = (1_001..)
        .map(digest)
        .find(|d| geometry.set_of(*d) == set)
        .expect("another digest of the set");
    (first, second)
}

/// The table a store is connected to, and how the store treats it.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Stores of one namespace share one table.
    pub namespace: String,
    pub geometry: Geometry,
    /// How long a claim is held for its owner; the store's default when `None`.
    pub lease: Option<Duration>,
    /// How long a committed digest counts as seen.
    pub max_age: Option<Duration>,
    /// The length of a bucket of the fleet's counters.
    pub fleet_interval: Option<Duration>,
    /// The store's other path, where it has one (Memcached: coalescing off, each single
    /// operation on its own connection; Redis on a server with `SET … IFEQ`: the set script,
    /// as a client of an earlier version decides).
    pub single_path: bool,
}

impl Spec {
    /// A table of `geometry` in a namespace of its own, with the store's defaults.
    pub fn new(tag: &str, geometry: Geometry) -> Self {
        Spec {
            namespace: unique_namespace(tag),
            geometry,
            lease: None,
            max_age: None,
            fleet_interval: None,
            single_path: false,
        }
    }
}

/// A kind of store under test: connects stores to tables.
pub trait Harness: Sync {
    type Store: Store + Clone + Send + Sync + 'static;

    /// Whether each connected store is an owner of its own, with leases (every shared store).
    /// Without owners, every store of a table acts as one.
    const OWNERS: bool;

    /// Connects a store to the table `spec` names: every store connected to a namespace
    /// shares its table.
    fn connect(&self, spec: &Spec) -> impl Future<Output = Self::Store> + Send;

    /// The values the store found unreadable and replaced so far.
    fn unreadable_values(store: &Self::Store) -> u64;

    /// Whether a committed entry is final: its owner's erase answers `false` as anyone's (the
    /// shared stores' compact layout keeps no owner of a committed entry). Where it is not,
    /// the owner may erase it. An entry claimed done at once stays its claimer's to erase
    /// either way (while its lease lasts), for a final handler that failed all the same.
    fn committed_is_final(&self) -> bool {
        false
    }

    /// The cases of [`random_operations_match_the_table_model`].
    const MODEL_CASES: u32 = 64;
}

/// A store shared by processes: owners, leases, the fleet's counters.
pub trait SharedHarness: Harness<Store: FleetCounters> + Sized {
    /// The name [`claim_worker_process`] knows the store by.
    const KIND: &'static str;

    /// How another process reaches the servers, one word: [`SharedHarness::reach`] reads it.
    fn address(&self) -> String;

    /// A harness for the servers that [`SharedHarness::address`] named, in another process.
    fn reach(address: &str) -> Self;

    /// The writes that lost a compare-and-swap race, for a store that writes so.
    fn cas_conflicts(store: &Self::Store) -> Option<u64>;
}

// ---------------------------------------------------------------------------------------------
// Every store.

/// A burst answers as its claims would one after another, and a full set pushes out its
/// oldest entry, as the in-process table does.
pub async fn batch_claims_follow_the_single_claim_rules<H: Harness>(h: &H) {
    let a = h
        .connect(&Spec::new("batch", Geometry::new(16 * 2, 2).unwrap()))
        .await;
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
    let same_set = digests_per_set(a.geometry().unwrap(), 3);
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

    // Replacement follows the cursor: in a table of one two-way set, the third digest pushes
    // out the first; the first then takes the second's slot (the cursor's), and the second
    // comes back in the third's.
    let store = h
        .connect(&Spec::new("fifo", Geometry::new(2, 2).unwrap()))
        .await;
    let digests: Vec<Digest> = (0..3).map(digest).collect();
    let claims = claimed(store.claim_many(&digests).await).unwrap();
    assert_eq!(claims, [Claim::New; 3]);
    assert_eq!(store.claim(digests[1]).await.unwrap(), Claim::InFlight);
    assert_eq!(store.claim(digests[0]).await.unwrap(), Claim::New);
    assert_eq!(
        claimed(store.claim_many(&[digests[1], digests[1]]).await).unwrap(),
        [Claim::New, Claim::InFlight],
        "pushed out by the first; a batch's repeat is in flight"
    );
    assert_eq!(store.claim(digests[2]).await.unwrap(), Claim::New);
}

/// A burst claimed done (for a handler whose accepted message is final) answers as a burst of
/// claims and leaves its new digests done, as claims then commits would: the next claim finds
/// them duplicates, a repeat within the burst is a duplicate, an entry in flight stays in
/// flight, a full set pushes out its oldest entry, the claimer may still erase one, and
/// `max_age` applies to them as to a commit.
pub async fn claimed_done_digests_are_duplicates_at_once<H: Harness>(h: &H) {
    let spec = Spec::new("claim-done", Geometry::new(64, 4).unwrap());
    let a = h.connect(&spec).await;
    let (w, x, y, z) = (digest(20), digest(21), digest(22), digest(23));
    assert_eq!(a.claim(x).await, Ok(Claim::New));
    assert_eq!(a.claim(w).await, Ok(Claim::New));
    assert_eq!(a.commit(w).await, Ok(true));
    assert_eq!(
        claimed(a.claim_done_many(&[x, y, y, w, z]).await).unwrap(),
        [
            Claim::InFlight,
            Claim::New,
            Claim::Duplicate,
            Claim::Duplicate,
            Claim::New
        ]
    );
    assert_eq!(
        claimed(a.claim_many(&[x, y, z]).await).unwrap(),
        [Claim::InFlight, Claim::Duplicate, Claim::Duplicate],
        "x is still in flight; y and z are done"
    );
    let other = h.connect(&spec).await;
    assert_eq!(
        other.claim(y).await,
        Ok(Claim::Duplicate),
        "another store sees it"
    );
    assert_eq!(a.commit(x).await, Ok(true));
    assert_eq!(
        claimed(a.claim_done_many(&[x]).await).unwrap(),
        [Claim::Duplicate]
    );
    assert_eq!(a.erase(y).await, Ok(true), "its claimer may forget it");
    assert_eq!(a.claim(y).await, Ok(Claim::New));
    assert_eq!(claimed(a.claim_done_many(&[]).await).unwrap(), []);

    // Three digests in one two-way set: the third pushes out the first.
    let store = h
        .connect(&Spec::new("claim-done-fifo", Geometry::new(2, 2).unwrap()))
        .await;
    let digests: Vec<Digest> = (0..3).map(digest).collect();
    assert_eq!(
        claimed(store.claim_done_many(&digests).await).unwrap(),
        [Claim::New; 3]
    );
    assert_eq!(store.claim(digests[1]).await, Ok(Claim::Duplicate));
    assert_eq!(
        store.claim(digests[0]).await,
        Ok(Claim::New),
        "pushed out (FIFO)"
    );

    // Done at the claim: counted as seen for `max_age` from then, new again once older (the
    // in-process table counts whole seconds, so two of them).
    let spec = Spec {
        max_age: Some(Duration::from_secs(1)),
        ..Spec::new("claim-done-max-age", Geometry::new(64, 8).unwrap())
    };
    let store = h.connect(&spec).await;
    let d = digest(24);
    assert_eq!(
        claimed(store.claim_done_many(&[d]).await).unwrap(),
        [Claim::New]
    );
    assert_eq!(store.claim(d).await, Ok(Claim::Duplicate));
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(
        claimed(store.claim_done_many(&[d]).await).unwrap(),
        [Claim::New],
        "older than max_age"
    );
    assert_eq!(store.claim(d).await, Ok(Claim::Duplicate));
}

/// A store built on one runtime keeps working on the next one, after the first is gone
/// (a background task of the first runtime goes with it).
pub fn store_outlives_the_runtime_that_first_used_it<H: Harness>(h: &H) {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    };
    let first = runtime();
    let store = first.block_on(h.connect(&Spec::new("runtimes", Geometry::new(64, 4).unwrap())));
    assert_eq!(first.block_on(store.claim(digest(50))), Ok(Claim::New));
    drop(first);
    // A second runtime gets new tasks and the same table.
    let second = runtime();
    assert_eq!(
        second.block_on(store.claim(digest(50))),
        Ok(Claim::InFlight)
    );
    assert_eq!(second.block_on(store.commit(digest(50))), Ok(true));
}

// Property test: random operation sequences against an exact model of the table.

#[derive(Debug, Clone)]
enum Action {
    Claim(usize, usize),
    ClaimMany(usize, Vec<usize>),
    ClaimDoneMany(usize, Vec<usize>),
    Commit(usize, usize),
    CommitMany(usize, Vec<usize>),
    EraseMany(usize, Vec<usize>),
    Erase(usize, usize),
    Renew(usize, usize),
}

impl Action {
    /// The store (0 or 1) that acts.
    fn who(&self) -> usize {
        match self {
            Action::Claim(w, _)
            | Action::ClaimMany(w, _)
            | Action::ClaimDoneMany(w, _)
            | Action::Commit(w, _)
            | Action::CommitMany(w, _)
            | Action::EraseMany(w, _)
            | Action::Erase(w, _)
            | Action::Renew(w, _) => *w,
        }
    }
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
        1 => (who.clone(), prop::collection::vec(0..pool, 1..6)).prop_map(|(w, ds)| Action::ClaimDoneMany(w, ds)),
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
    /// Committed.
    Done,
    /// Claimed done at once (`claim_done_many`).
    ClaimedDone,
}

/// The table as specified (the in-process table's rules): per set, `ways` slots and a
/// cursor; a new digest takes the first empty slot, else the slot at the cursor, which then
/// moves on; owners; no lease expiry (leases in this test outlive it).
struct Model {
    geometry: Geometry,
    /// Whether renew asks for the caller's in-flight claim (stores with owners) or only
    /// whether the digest is held.
    owners: bool,
    /// Whether a committed entry is final, even to its owner ([`Harness::committed_is_final`]).
    committed_final: bool,
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

    /// A claim; with `done`, a new entry is held done at once (`claim_done_many`).
    fn claim(&mut self, who: usize, d: Digest, done: bool) -> Claim {
        if let Some(entry) = self.find(d) {
            return match entry.1 {
                ModelState::InFlight => Claim::InFlight,
                ModelState::Done | ModelState::ClaimedDone => Claim::Duplicate,
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
        let state = if done {
            ModelState::ClaimedDone
        } else {
            ModelState::InFlight
        };
        set.slots[victim] = Some((d, state, who));
        Claim::New
    }

    fn commit(&mut self, who: usize, d: Digest) -> bool {
        match self.find(d) {
            Some(e) if e.1 != ModelState::InFlight => true,
            Some(e) if e.2 == who => {
                e.1 = ModelState::Done;
                true
            }
            _ => false,
        }
    }

    fn erase(&mut self, who: usize, d: Digest) -> bool {
        let committed_final = self.committed_final;
        let set = self.set(d);
        match set.slots.iter_mut().find(|slot| {
            slot.is_some_and(|e| {
                e.0 == d && e.2 == who && !(committed_final && e.1 == ModelState::Done)
            })
        }) {
            Some(slot) => {
                *slot = None;
                true
            }
            None => false,
        }
    }

    fn renew(&mut self, who: usize, d: Digest) -> bool {
        let owners = self.owners;
        self.find(d)
            .is_some_and(|e| !owners || (e.2 == who && e.1 == ModelState::InFlight))
    }
}

async fn run_case<H: Harness>(h: &H, ways: u32, actions: &[Action]) -> Result<(), TestCaseError> {
    let geometry = Geometry::new(PROP_SETS * u64::from(ways), ways).expect("valid geometry");
    let spec = Spec::new("prop", geometry);
    // Store 0 sends single operations the store's usual way, store 1 its other way where it
    // has one: both paths must give the model's answers. With owners, they are two owners.
    let stores = [
        h.connect(&spec).await,
        h.connect(&Spec {
            single_path: true,
            ..spec.clone()
        })
        .await,
    ];
    let pool: Vec<Digest> = (0..pool_size(ways) as u64).map(digest).collect();
    let mut model = Model {
        geometry,
        owners: H::OWNERS,
        committed_final: h.committed_is_final(),
        sets: HashMap::new(),
    };
    let mut ever_claimed = HashSet::new();
    let fail = |e: StoreError| TestCaseError::fail(e.to_string());
    for action in actions {
        // Without owners the two stores act as one owner.
        let owner = if H::OWNERS { action.who() } else { 0 };
        let store = &stores[action.who()];
        match action {
            Action::Claim(_, i) => {
                let got = store.claim(pool[*i]).await.map_err(fail)?;
                if !ever_claimed.contains(i) {
                    prop_assert_eq!(got, Claim::New, "a digest never claimed was reported seen");
                }
                prop_assert_eq!(got, model.claim(owner, pool[*i], false), "{:?}", action);
                ever_claimed.insert(*i);
            }
            Action::ClaimMany(_, indices) | Action::ClaimDoneMany(_, indices) => {
                let batch: Vec<Digest> = indices.iter().map(|&i| pool[i]).collect();
                let done = matches!(action, Action::ClaimDoneMany(..));
                let got = if done {
                    store.claim_done_many(&batch).await
                } else {
                    store.claim_many(&batch).await
                };
                let got = claimed(got).map_err(fail)?;
                let mut seen_in_batch = HashSet::new();
                for ((i, d), claim) in indices.iter().zip(&batch).zip(&got) {
                    if !ever_claimed.contains(i) && seen_in_batch.insert(*i) {
                        prop_assert_eq!(
                            *claim,
                            Claim::New,
                            "a digest never claimed was reported seen"
                        );
                    }
                    prop_assert_eq!(*claim, model.claim(owner, *d, done), "{:?}", action);
                }
                ever_claimed.extend(indices.iter().copied());
            }
            Action::Commit(_, i) => {
                let got = store.commit(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.commit(owner, pool[*i]), "{:?}", action);
            }
            Action::CommitMany(_, indices) | Action::EraseMany(_, indices) => {
                let batch: Vec<Digest> = indices.iter().map(|&i| pool[i]).collect();
                let commit = matches!(action, Action::CommitMany(..));
                let got = if commit {
                    store.commit_many(&batch).await
                } else {
                    store.erase_many(&batch).await
                };
                prop_assert_eq!(got.len(), batch.len());
                // A batch is applied as its operations one after another.
                for (d, got) in batch.iter().zip(got) {
                    let expected = if commit {
                        model.commit(owner, *d)
                    } else {
                        model.erase(owner, *d)
                    };
                    prop_assert_eq!(got.map_err(fail)?, expected, "{:?}", action);
                }
            }
            Action::Renew(_, i) => {
                let got = store.renew(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.renew(owner, pool[*i]), "{:?}", action);
            }
            Action::Erase(_, i) => {
                let got = store.erase(pool[*i]).await.map_err(fail)?;
                prop_assert_eq!(got, model.erase(owner, pool[*i]), "{:?}", action);
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
                        ModelState::Done | ModelState::ClaimedDone => {
                            stores[owner].commit(other).await.map_err(fail)?
                        }
                    };
                    prop_assert!(held, "erase of {:?} removed {:?}", pool[*i], other);
                }
            }
        }
    }
    prop_assert_eq!(
        H::unreadable_values(&stores[0]) + H::unreadable_values(&stores[1]),
        0
    );
    Ok(())
}

/// Random sequences of every operation, by two stores of one table, give the answers of an
/// exact model of the table (`H::MODEL_CASES` cases of up to 80 operations, 1 to 8 ways).
pub fn random_operations_match_the_table_model<H: Harness>(h: &H) {
    let runtime = runtime();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: H::MODEL_CASES,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    });
    let strategy = prop::sample::select(vec![1u32, 2, 4, 8]).prop_flat_map(|ways| {
        (
            Just(ways),
            prop::collection::vec(action(pool_size(ways)), 1..80),
        )
    });
    let result = runner.run(&strategy, |(ways, actions)| {
        runtime.block_on(run_case(h, ways, &actions))
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Shared stores: owners and leases.

/// Two stores (two owners) of one table, as two consumer processes are.
async fn two_stores<H: Harness>(h: &H, spec: &Spec) -> (H::Store, H::Store) {
    (h.connect(spec).await, h.connect(spec).await)
}

/// The lease of a dead consumer's claim ends: another owner takes the claim over, and the
/// old owner can neither commit, renew nor erase it.
pub async fn expired_lease_is_taken_over<H: SharedHarness>(h: &H) {
    let spec = Spec {
        lease: Some(Duration::from_millis(1_000)),
        ..Spec::new("lease", Geometry::new(64, 4).unwrap())
    };
    let (a, b) = two_stores(h, &spec).await;
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
    assert!(!a.commit(d).await.unwrap(), "the old owner lost it");
    assert!(!a.renew(d).await.unwrap());
    assert!(!a.erase(d).await.unwrap());
    assert!(b.renew(d).await.unwrap());
    assert!(b.commit(d).await.unwrap());
    assert_eq!(a.claim(d).await.unwrap(), Claim::Duplicate);
}

/// Renewals keep a claim past its lease; only the owner renews, and a done entry has no
/// lease.
pub async fn renew_keeps_the_claim<H: SharedHarness>(h: &H) {
    let spec = Spec {
        lease: Some(Duration::from_millis(1_000)),
        ..Spec::new("renew", Geometry::new(64, 4).unwrap())
    };
    let (a, b) = two_stores(h, &spec).await;
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

/// Commit and erase touch only the caller's own entry: a non-owner's do nothing, and the
/// owner's leave the other entries of the set as they were. A committed entry is final where
/// the store says so ([`Harness::committed_is_final`]).
pub async fn commit_and_erase_by_a_non_owner_do_nothing<H: SharedHarness>(h: &H) {
    let geometry = Geometry::new(64, 4).unwrap();
    let (a, b) = two_stores(h, &Spec::new("owner", geometry)).await;
    let (d, never) = (digest(3), digest(4));
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    assert!(!b.commit(d).await.unwrap());
    assert!(!b.erase(d).await.unwrap());
    assert!(!b.renew(d).await.unwrap());
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
    if h.committed_is_final() {
        assert!(
            !a.erase(d).await.unwrap(),
            "committed, it is final, even to its owner"
        );
        assert_eq!(b.claim(d).await.unwrap(), Claim::Duplicate);
    } else {
        assert!(a.erase(d).await.unwrap(), "the owner may forget its entry");
        assert_eq!(b.claim(d).await.unwrap(), Claim::New);
    }
    // Clones share the owner.
    let a2 = a.clone();
    assert_eq!(a2.claim(never).await.unwrap(), Claim::New);
    assert!(a.commit(never).await.unwrap());

    // Two owners' entries in one set.
    let (a, b) = two_stores(h, &Spec::new("owner-set", geometry)).await;
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
    assert_eq!(H::unreadable_values(&a), 0);
}

/// A committed digest counts as seen for `max_age`, and is new again once older.
pub async fn max_age_lets_a_committed_digest_be_claimed_again_once_older<H: SharedHarness>(h: &H) {
    let spec = Spec {
        max_age: Some(Duration::from_secs(1)),
        ..Spec::new("max-age", Geometry::new(64, 8).unwrap())
    };
    let store = h.connect(&spec).await;
    let d = digest(1);
    assert_eq!(store.claim(d).await, Ok(Claim::New));
    assert_eq!(store.commit(d).await, Ok(true));
    assert_eq!(store.claim(d).await, Ok(Claim::Duplicate));
    // A store may count whole seconds (never short), so two of them.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(store.claim(d).await, Ok(Claim::New), "older than max_age");
    assert_eq!(store.claim(d).await, Ok(Claim::InFlight));
}

/// Two owners, four tasks each, claim every digest of the contention scenario in bursts of
/// 48 in their own orders, all at once: each digest is `New` for exactly one task. Then each
/// owner commits its own in bursts, and erasing the other owner's does nothing.
pub async fn racing_bursts_of_two_owners_get_one_new_per_digest<H: SharedHarness>(h: &H) {
    let (geometry, digests) = contention_scenario();
    let (a, b) = two_stores(h, &Spec::new("racing-bursts", geometry)).await;
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
    // 768 digests: more than one round trip (or script run) takes, so several answer in order.
    assert_eq!(
        claimed(a.claim_many(&digests).await).unwrap(),
        vec![Claim::Duplicate; digests.len()]
    );
}

/// Two consumers of one table add 300 and 100 distinct messages per 200 ms bucket: each
/// learns the fleet's 2,000 a second, and a consumer of another table only its own 250. The
/// two are at two sizes, as during a resize, when one follows the new size before the other:
/// the fleet's count is the table's, not a size's.
pub async fn consumers_of_one_table_each_learn_the_fleets_distinct_rate<H: SharedHarness>(h: &H) {
    let spec = Spec {
        fleet_interval: Some(Duration::from_millis(200)),
        ..Spec::new("fleet", Geometry::new(1024, 8).unwrap())
    };
    let a = h.connect(&spec).await;
    let b = h
        .connect(&Spec {
            geometry: Geometry::new(2048, 8).unwrap(),
            ..spec.clone()
        })
        .await;
    let other = h
        .connect(&Spec {
            namespace: unique_namespace("fleet-other"),
            ..spec
        })
        .await;
    crate::util::assert_each_learns_the_fleets_rate(&a, &b, &other).await;
}

// ---------------------------------------------------------------------------------------------
// Shared stores: the server killed and started again.

/// The digests of the outage test, claimed before the server is killed.
pub async fn claimed_before_the_outage<S: Store>(store: &S) -> [Digest; 2] {
    let (d, e) = (digest(30), digest(31));
    assert_eq!(store.claim(d).await.unwrap(), Claim::New);
    assert_eq!(claimed(store.claim_many(&[e]).await).unwrap(), [Claim::New]);
    [d, e]
}

/// `store` (a timeout of 300 ms) with its one server killed: every operation fails, as
/// `Unavailable` or `Timeout`, within 3 s in all.
pub async fn fails_fast_while_its_server_is_down<S: Store>(store: &S, [d, e]: [Digest; 2]) {
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
}

/// Once a new, empty server runs in place of the killed one, claims are decided again
/// within 10 s, the digests new again. Returns the claims that recovery took.
pub async fn recovers_once_an_empty_server_is_back<S: Store>(
    store: &S,
    [d, e]: [Digest; 2],
) -> u32 {
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
    assert_eq!(
        claimed(store.claim_many(&[d, e]).await).unwrap(),
        [Claim::InFlight, Claim::New]
    );
    attempts
}

// ---------------------------------------------------------------------------------------------
// Shared stores: tasks and OS processes claiming the same digests at once.

/// The shape and digests of the concurrency scenario: 6 digests in each of 128 sets of 8 ways,
/// so no set overflows.
pub fn contention_scenario() -> (Geometry, Vec<Digest>) {
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

/// What one claimer reports: the digests it got `New` for, when it started and ended (ms since
/// the epoch), and how many of its writes lost a compare-and-swap race (0 for a store that
/// does not count them).
type Claimed = (Vec<Digest>, u64, u64, u64);

/// One claimer: from the wall-clock instant `start_ms`, claims every digest in a seeded random
/// order, by `seed % 3`: singly one after another, in batches of 16, or 16 single claims at
/// once (which the store pipelines). Once its first 16 are claimed it waits at `meeting` for
/// the other claimers' first 16: on a loaded machine a claimer (a whole process) started
/// after the others had claimed every digest, and there was no race.
async fn claim_all<H: SharedHarness>(
    store: &H::Store,
    digests: &[Digest],
    seed: u64,
    (start_ms, meeting): (u64, &std::path::Path),
) -> Claimed {
    let mut order = digests.to_vec();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let now = now_ms();
    if start_ms > now {
        tokio::time::sleep(Duration::from_millis(start_ms - now)).await;
    }
    let start = now_ms();
    let mut news = Vec::new();
    for (i, chunk) in order.chunks(16).enumerate() {
        if i == 1 {
            meet(meeting, seed).await;
        }
        let claims = match seed % 3 {
            0 => {
                let mut claims = Vec::new();
                for &d in chunk {
                    claims.push(store.claim(d).await);
                }
                claims.into_iter().collect()
            }
            1 => claimed(store.claim_many(chunk).await),
            _ => futures::future::try_join_all(chunk.iter().map(|&d| store.claim(d))).await,
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
    let conflicts = H::cas_conflicts(store).unwrap_or(0);
    (news, start, now_ms(), conflicts)
}

/// The claimers of the race in [`tasks_and_processes_get_one_new_per_digest`].
const CLAIMERS: usize = 8;

/// Says at `meeting` (a directory) that claimer `seed` is there, then waits until all
/// [`CLAIMERS`] are.
async fn meet(meeting: &std::path::Path, seed: u64) {
    std::fs::write(meeting.join(format!("met-{seed}")), "").expect("a claimer says it met");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let met = std::fs::read_dir(meeting)
            .expect("the meeting's directory")
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("met-"))
            })
            .count();
        if met >= CLAIMERS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{met} of {CLAIMERS} claimers met in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Two stores of the table of `spec` for two claimers, each its own owner; the store's other
/// path for the second.
async fn two_owners<H: SharedHarness>(h: &H, spec: &Spec) -> [H::Store; 2] {
    let other_path = Spec {
        single_path: true,
        ..spec.clone()
    };
    [h.connect(spec).await, h.connect(&other_path).await]
}

/// A claimer on each of `stores`, with `seeds`, starting at `start_ms`, meeting the others
/// at `meeting` (see [`claim_all`]).
fn start_claimers<H: SharedHarness>(
    stores: [H::Store; 2],
    seeds: [u64; 2],
    (start_ms, meeting): (u64, &std::path::Path),
) -> Vec<tokio::task::JoinHandle<Claimed>> {
    let (_, digests) = contention_scenario();
    stores
        .into_iter()
        .zip(seeds)
        .map(|(store, seed)| {
            let (digests, meeting) = (digests.clone(), meeting.to_owned());
            tokio::spawn(async move {
                claim_all::<H>(&store, &digests, seed, (start_ms, &meeting)).await
            })
        })
        .collect()
}

/// The start of the race, once the file `go` holds it: each process connects its stores
/// first, says so, and then all start together.
async fn start_of_the_race(go: &std::path::Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(start) = std::fs::read_to_string(go)
            .ok()
            .and_then(|text| text.parse().ok())
        {
            return start;
        }
        assert!(Instant::now() < deadline, "no start of the race in 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const WORKER_ENV: &str = "NSQ_DEDUPE_TEST_CLAIM_WORKER";

/// Not a test: the body of the other OS processes of
/// [`tasks_and_processes_get_one_new_per_digest`], which runs this binary again with this
/// filter and `NSQ_DEDUPE_TEST_CLAIM_WORKER=<kind> <address> <namespace> <seed> <output
/// file>`. The worker creates `<output file>.ready` once connected, and starts at the instant
/// (ms since the epoch) that the file `go` beside it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of tasks_and_processes_get_one_new_per_digest"]
async fn claim_worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let fields: Vec<&str> = spec.split(' ').collect();
    let [kind, address, namespace, seed, out] = fields[..] else {
        panic!("bad {WORKER_ENV}: {spec}");
    };
    let (seed, out) = (seed.parse().unwrap(), std::path::Path::new(out));
    let report = match kind {
        crate::memcached::Memcached::KIND => {
            claim_worker::<crate::memcached::Memcached>(address, namespace, seed, out).await
        }
        crate::redis::Redis::KIND => {
            claim_worker::<crate::redis::Redis>(address, namespace, seed, out).await
        }
        _ => panic!("bad store kind in {WORKER_ENV}: {spec}"),
    };
    std::fs::write(out, report).expect("worker writes its report");
}

/// Two claimers on the servers at `address`; their report, a line `T <begin> <end>
/// <conflicts>` per claimer and `N <digest>` per digest it got `New` for.
async fn claim_worker<H: SharedHarness>(
    address: &str,
    namespace: &str,
    seed: u64,
    out: &std::path::Path,
) -> String {
    let h = H::reach(address);
    let (geometry, _) = contention_scenario();
    let spec = Spec {
        namespace: namespace.to_owned(),
        ..Spec::new("worker", geometry)
    };
    let stores = two_owners(&h, &spec).await;
    std::fs::write(out.with_extension("ready"), "").expect("worker says it is ready");
    let go = out.with_file_name("go");
    let start = start_of_the_race(&go).await;
    let meeting = go.parent().expect("the race's directory");
    let mut report = String::new();
    for task in start_claimers::<H>(stores, [seed * 10, seed * 10 + 1], (start, meeting)) {
        let (news, begin, end, conflicts) = task.await.expect("worker task");
        report.push_str(&format!("T {begin} {end} {conflicts}\n"));
        for d in news {
            report.push_str(&format!("N {}\n", d.as_u128()));
        }
    }
    report
}

/// Eight claimers at once, four tasks in this process and two in each of two more OS
/// processes, every one its own owner and every one claiming every digest of the contention
/// scenario: each digest is `New` exactly once in all, and still held after.
pub async fn tasks_and_processes_get_one_new_per_digest<H: SharedHarness>(h: &H) {
    let (geometry, digests) = contention_scenario();
    let spec = Spec::new("race", geometry);
    let dir = tempfile::tempdir().expect("temp dir");

    // Two more OS processes: this test binary, running only `claim_worker_process`.
    let mut workers = Vec::new();
    for p in 0..2u64 {
        let out = dir.path().join(format!("worker-{p}.txt"));
        let child = Child::spawn(
            std::process::Command::new(std::env::current_exe().expect("test binary path"))
                .args([
                    "store_contract::claim_worker_process",
                    "--exact",
                    "--ignored",
                    "--test-threads=1",
                ])
                .env(
                    WORKER_ENV,
                    format!(
                        "{} {} {} {} {}",
                        H::KIND,
                        h.address(),
                        spec.namespace,
                        100 + p,
                        out.display()
                    ),
                ),
        );
        workers.push((child, out));
    }

    // Four tasks in this process: every way of claiming, on both of the store's paths. All
    // eight claimers start 100 ms after the last of them is connected.
    let (first, second) = (two_owners(h, &spec).await, two_owners(h, &spec).await);
    let deadline = Instant::now() + Duration::from_secs(60);
    for (worker, out) in &mut workers {
        while !out.with_extension("ready").exists() {
            assert!(
                !worker.has_exited() && Instant::now() < deadline,
                "a worker process did not connect: {}",
                worker.stderr()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let start = now_ms() + 100;
    let go = dir.path().join("go");
    std::fs::write(go.with_extension("new"), start.to_string()).expect("write the start");
    std::fs::rename(go.with_extension("new"), &go).expect("publish the start");
    let mut tasks = start_claimers::<H>(first, [0, 1], (start, dir.path()));
    tasks.extend(start_claimers::<H>(second, [2, 3], (start, dir.path())));
    let mut news: HashMap<Digest, u32> = HashMap::new();
    let mut intervals = Vec::new();
    let mut conflicts = 0;
    let mut here = 0;
    for task in tasks {
        let (got, begin, end, lost) = task.await.expect("claim task");
        intervals.push((begin, end));
        conflicts += lost;
        here += got.len();
        for d in got {
            *news.entry(d).or_default() += 1;
        }
    }

    let mut elsewhere = Vec::new();
    for (child, out) in workers {
        child
            .finish_within(Duration::from_secs(60))
            .await
            .assert_success();
        let report = std::fs::read_to_string(&out).expect("worker report");
        let (mut worker_intervals, mut worker_news) = (0, 0);
        for line in report.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts[..] {
                ["T", begin, end, lost] => {
                    intervals.push((begin.parse().unwrap(), end.parse().unwrap()));
                    conflicts += lost.parse::<u64>().unwrap();
                    worker_intervals += 1;
                }
                ["N", d] => {
                    worker_news += 1;
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
        elsewhere.push(worker_news);
    }

    // The eight claimers really ran at the same time, and raced for the same sets.
    println!(
        "{} digests: {here} New here, {elsewhere:?} in the other processes, {conflicts} compare-and-swap conflicts",
        digests.len()
    );
    if H::cas_conflicts(&h.connect(&spec).await).is_some() {
        assert!(
            conflicts > 0,
            "no write ever lost a race: the test did not test atomicity"
        );
    }
    assert!(
        here > 0 && elsewhere.iter().all(|&n| n > 0),
        "one process claimed everything: the race did not happen"
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
    let check = h.connect(&spec).await;
    let claims = claimed(check.claim_many(&digests).await).expect("final claims");
    assert!(claims.iter().all(|c| *c == Claim::InFlight));
    assert_eq!(H::unreadable_values(&check), 0);
}

// ---------------------------------------------------------------------------------------------
// Instances.

/// A runtime of two worker threads, for the tests that are not `async` themselves.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Every rule of the contract, each once: calls [`rule!`] with `$context` and the rule, as
/// `<stores> <order> <test>`, where
/// - `<stores>` is `every` (every store) or `shared` (the shared stores, [`SharedHarness`]);
/// - `<order>` is how [`run_all`] runs it: `joined` (at once with the other joined rules),
///   `sequential` (one after another in this list's order, while the joined ones run),
///   `thread` (on a thread of its own meanwhile) or `after` (alone, after all of those);
/// - `<test>` is the rule's own test in a store's module: its attributes (the runtime it runs
///   on), then `async` for a rule that is a future, or `fn` for one that blocks on runtimes of
///   its own.
macro_rules! each_rule {
    ($($context:tt)*) => {
        $crate::store_contract::rule!(($($context)*) every joined
            #[tokio::test] async batch_claims_follow_the_single_claim_rules);
        $crate::store_contract::rule!(($($context)*) every joined
            #[tokio::test] async claimed_done_digests_are_duplicates_at_once);
        $crate::store_contract::rule!(($($context)*) every thread
            #[test] fn random_operations_match_the_table_model);
        $crate::store_contract::rule!(($($context)*) every after
            #[test] fn store_outlives_the_runtime_that_first_used_it);
        $crate::store_contract::rule!(($($context)*) shared joined
            #[tokio::test] async expired_lease_is_taken_over);
        $crate::store_contract::rule!(($($context)*) shared joined
            #[tokio::test] async renew_keeps_the_claim);
        $crate::store_contract::rule!(($($context)*) shared joined
            #[tokio::test] async commit_and_erase_by_a_non_owner_do_nothing);
        $crate::store_contract::rule!(($($context)*) shared joined
            #[tokio::test] async max_age_lets_a_committed_digest_be_claimed_again_once_older);
        $crate::store_contract::rule!(($($context)*) shared sequential
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async racing_bursts_of_two_owners_get_one_new_per_digest);
        $crate::store_contract::rule!(($($context)*) shared sequential
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async tasks_and_processes_get_one_new_per_digest);
        // The fleet's counters need each share in its bucket, so nothing else runs meanwhile.
        $crate::store_contract::rule!(($($context)*) shared after
            #[tokio::test] async consumers_of_one_table_each_learn_the_fleets_distinct_rate);
    };
}
pub(crate) use each_rule;

/// One rule of [`each_rule!`], in its context: `(tests <stores> (<harness>))` makes the rule's
/// test, with a harness of its own from `<harness>`, if the rule applies to `<stores>`;
/// `(run_all <h> <queues>)` puts the rule, on the harness `<h>`, in the [`Queues`] of
/// [`run_all`] that its order names.
macro_rules! rule {
    ((tests every ($harness:expr)) shared $($rule:tt)*) => {};
    ((tests $stores:ident ($harness:expr)) $applies:ident $order:ident
        $(#[$attr:meta])* async $name:ident) => {
        $(#[$attr])*
        async fn $name() {
            $crate::store_contract::$name(&$harness).await;
        }
    };
    ((tests $stores:ident ($harness:expr)) $applies:ident $order:ident
        $(#[$attr:meta])* fn $name:ident) => {
        $(#[$attr])*
        fn $name() {
            $crate::store_contract::$name(&$harness);
        }
    };
    ((run_all $h:ident $queues:ident) $stores:ident joined $(#[$attr:meta])* async $name:ident) => {
        $queues.joined.push(Box::pin($crate::store_contract::$name($h)));
    };
    ((run_all $h:ident $queues:ident) $stores:ident sequential
        $(#[$attr:meta])* async $name:ident) => {
        $queues.sequential.push(Box::pin($crate::store_contract::$name($h)));
    };
    ((run_all $h:ident $queues:ident) $stores:ident thread $(#[$attr:meta])* fn $name:ident) => {
        $queues.threads.push(Box::new(move || $crate::store_contract::$name($h)));
    };
    ((run_all $h:ident $queues:ident) $stores:ident after $(#[$attr:meta])* async $name:ident) => {
        $queues.after.push(Box::new(move || {
            $crate::store_contract::runtime().block_on($crate::store_contract::$name($h))
        }));
    };
    ((run_all $h:ident $queues:ident) $stores:ident after $(#[$attr:meta])* fn $name:ident) => {
        $queues.after.push(Box::new(move || $crate::store_contract::$name($h)));
    };
}
pub(crate) use rule;

/// Makes a test of each rule of the contract in the calling module, each with a harness of
/// its own from `$harness` (an expression that starts the servers it needs): `every: ...`
/// makes the rules of every store, `shared: ...` those of the shared stores too.
macro_rules! store_contract_tests {
    ($stores:ident: $harness:expr) => {
        $crate::store_contract::each_rule!(tests $stores ($harness));
    };
}
pub(crate) use store_contract_tests;

/// The rules [`run_all`] runs, by their order in [`each_rule!`].
#[derive(Default)]
struct Queues<'a> {
    joined: Vec<LocalBoxFuture<'a, ()>>,
    sequential: Vec<LocalBoxFuture<'a, ()>>,
    threads: Vec<Box<dyn FnOnce() + Send + 'a>>,
    after: Vec<Box<dyn FnOnce() + 'a>>,
}

/// Every rule against the stores of `h` in one test, for a store whose servers are costly to
/// start (a Redis Cluster). The rules run at once, each on a table of its own (most of them
/// mostly wait), as [`each_rule!`] orders them.
pub fn run_all<H: SharedHarness>(h: &H) {
    let started = Instant::now();
    let mut queues = Queues::default();
    each_rule!(run_all h queues);
    let Queues {
        joined,
        sequential,
        threads,
        after,
    } = queues;
    std::thread::scope(|scope| {
        let threads: Vec<_> = threads.into_iter().map(|rule| scope.spawn(rule)).collect();
        runtime().block_on(async {
            let sequential = async {
                for rule in sequential {
                    rule.await;
                }
            };
            tokio::join!(futures::future::join_all(joined), sequential);
        });
        for thread in threads {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    for rule in after {
        rule();
    }
    println!("the store contract took {:?}", started.elapsed());
}

/// The in-process table as a store of the contract: stores of one namespace are the same
/// table.
#[derive(Default)]
pub struct InProcess {
    tables: std::sync::Mutex<HashMap<String, SharedTable>>,
}

/// A table that several stores of the contract share.
#[derive(Clone)]
pub struct SharedTable(Arc<nsq_dedupe::Table>);

impl Store for SharedTable {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        Store::claim(&*self.0, digest).await
    }

    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        Store::claim_many(&*self.0, digests).await
    }

    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        Store::claim_done_many(&*self.0, digests).await
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        Store::commit(&*self.0, digest).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        Store::erase(&*self.0, digest).await
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        Store::renew(&*self.0, digest).await
    }

    fn geometry(&self) -> Option<Geometry> {
        Store::geometry(&*self.0)
    }
}

impl Harness for InProcess {
    type Store = SharedTable;
    const OWNERS: bool = false;

    async fn connect(&self, spec: &Spec) -> SharedTable {
        let mut tables = self.tables.lock().unwrap();
        tables
            .entry(spec.namespace.clone())
            .or_insert_with(|| {
                let table = match spec.max_age {
                    Some(max_age) => nsq_dedupe::Table::with_max_age(
                        spec.geometry,
                        max_age,
                        Arc::new(nsq_dedupe::dedup::clock::SystemClock),
                    ),
                    None => nsq_dedupe::Table::new(spec.geometry),
                };
                SharedTable(Arc::new(table.expect("a table")))
            })
            .clone()
    }

    fn unreadable_values(_: &SharedTable) -> u64 {
        0
    }
}
