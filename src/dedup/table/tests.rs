use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU32;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// One set of the model: `ways` optional entries and the cursor of the next eviction.
pub(super) type ModelSet = (Vec<Option<(Digest, Claim)>>, usize);

/// The specification the table must follow, kept in the plainest form.
pub(super) struct Model {
    geometry: Geometry,
    sets: Vec<ModelSet>,
}

impl Model {
    pub(super) fn new(geometry: Geometry) -> Self {
        let sets = (0..geometry.sets())
            .map(|_| (vec![None; geometry.ways() as usize], 0))
            .collect();
        Model { geometry, sets }
    }

    fn set(&mut self, digest: Digest) -> &mut ModelSet {
        &mut self.sets[self.geometry.set_of(digest) as usize]
    }

    pub(super) fn claim(&mut self, digest: Digest, as_done: bool) -> Claim {
        let (slots, cursor) = self.set(digest);
        if let Some((_, state)) = slots.iter().flatten().find(|(d, _)| *d == digest) {
            return *state;
        }
        // The first empty slot, else the one at the cursor, which then moves on.
        let victim = match slots.iter().position(Option::is_none) {
            Some(empty) => empty,
            None => {
                let victim = *cursor;
                *cursor = (*cursor + 1) % slots.len();
                victim
            }
        };
        let state = if as_done {
            Claim::Duplicate
        } else {
            Claim::InFlight
        };
        slots[victim] = Some((digest, state));
        Claim::New
    }

    /// What the set holds of `digest`, changing nothing.
    pub(super) fn lookup(&mut self, digest: Digest) -> Option<Claim> {
        let (slots, _) = self.set(digest);
        slots
            .iter()
            .flatten()
            .find(|(d, _)| *d == digest)
            .map(|(_, state)| *state)
    }

    pub(super) fn commit(&mut self, digest: Digest) -> bool {
        let entry = self
            .set(digest)
            .0
            .iter_mut()
            .flatten()
            .find(|(d, _)| *d == digest);
        entry.map(|entry| entry.1 = Claim::Duplicate).is_some()
    }

    pub(super) fn erase(&mut self, digest: Digest) -> bool {
        let slots = &mut self.set(digest).0;
        match slots
            .iter()
            .position(|e| matches!(e, Some((d, _)) if *d == digest))
        {
            Some(index) => {
                slots[index] = None;
                true
            }
            None => false,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Claim(usize),
    ContainsAndAdd(usize),
    Commit(usize),
    Erase(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let index = 0usize..POOL;
    prop_oneof![
        3 => index.clone().prop_map(Op::Claim),
        2 => index.clone().prop_map(Op::ContainsAndAdd),
        2 => index.clone().prop_map(Op::Commit),
        2 => index.prop_map(Op::Erase),
    ]
}

pub(super) const POOL: usize = 32;

/// Random digests with distinct fingerprints, so that only the set mapping can make two of
/// them meet.
pub(super) fn pool(seed: u64) -> Vec<Digest> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fingerprints = HashSet::new();
    std::iter::repeat_with(|| Digest::from_u128(rng.gen()))
        .filter(|d| fingerprints.insert(fingerprint(*d)))
        .take(POOL)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The table answers exactly as the model does, over random operation sequences on a
    /// table small enough that sets overflow all the time.
    #[test]
    fn table_follows_the_fifo_model(
        seed in any::<u64>(),
        ways in prop::sample::select(vec![1u32, 2, 4, 8]),
        sets in 1u64..6,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let geometry = Geometry::new(sets * u64::from(ways), ways).unwrap();
        let table = Table::new(geometry).unwrap();
        let mut model = Model::new(geometry);
        let digests = pool(seed);
        let mut ever_inserted = HashSet::new();
        for op in ops {
            match op {
                Op::Claim(i) => {
                    let got = table.claim(digests[i]);
                    prop_assert_eq!(got, model.claim(digests[i], false), "claim {}", i);
                    if got != Claim::New {
                        // A digest never inserted is never reported as seen.
                        prop_assert!(ever_inserted.contains(&i));
                    }
                    ever_inserted.insert(i);
                }
                Op::ContainsAndAdd(i) => {
                    let seen = table.contains_and_add(digests[i]);
                    prop_assert_eq!(seen, model.claim(digests[i], true) != Claim::New);
                    prop_assert!(!seen || ever_inserted.contains(&i));
                    ever_inserted.insert(i);
                }
                Op::Commit(i) => {
                    prop_assert_eq!(table.commit(digests[i]), model.commit(digests[i]));
                }
                Op::Erase(i) => {
                    let others: Vec<bool> =
                        digests.iter().map(|d| table.contains(*d)).collect();
                    prop_assert_eq!(table.erase(digests[i]), model.erase(digests[i]));
                    // Erase removes its own digest and nothing else.
                    prop_assert!(!table.contains(digests[i]));
                    for (j, was) in others.iter().enumerate() {
                        if j != i {
                            prop_assert_eq!(table.contains(digests[j]), *was);
                        }
                    }
                }
            }
        }
        let held = digests.iter().filter(|d| table.contains(**d)).count() as u64;
        prop_assert_eq!(table.occupied(), held);
    }
}

/// A case the model test once found (seed 0, one set of 8 ways): the same digest claimed twice
/// is in flight the second time, for every digest of the pool.
#[test]
fn a_second_claim_in_a_single_set_finds_the_first_in_flight() {
    for digest in pool(0) {
        let table = Table::new(Geometry::new(8, 8).unwrap()).unwrap();
        assert_eq!(table.claim(digest), Claim::New);
        assert_eq!(table.claim(digest), Claim::InFlight);
        assert!(table.commit(digest));
        assert_eq!(table.claim(digest), Claim::Duplicate);
    }
}

#[test]
fn shapes_are_validated_with_errors_that_name_the_knob() {
    assert_eq!(Table::with_slots(0, 8).unwrap_err(), TableError::ZeroSlots);
    assert_eq!(Table::with_slots(64, 3).unwrap_err(), TableError::Ways(3));
    assert_eq!(Table::with_slots(64, 0).unwrap_err(), TableError::Ways(0));
    assert_eq!(
        Table::with_memory(63, 8).unwrap_err().to_string(),
        "a budget of 63 B holds no complete set of 8 slots (8 B each); \
         the smallest table of 8 ways takes 64 B"
    );
    assert!(matches!(
        Table::with_slots(u64::MAX, 8),
        Err(TableError::TooLarge(_))
    ));
    // A size that fits the address space but not the machine is an error, not an abort.
    let error = Table::with_slots(99_999_999_999_999, 8).unwrap_err();
    assert!(
        matches!(error, TableError::Alloc { bytes, .. } if bytes == 100_000_000_000_000 * 8),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .starts_with("cannot allocate 727.6 TiB for the table"),
        "{error}"
    );
    // With max_age the times take as much again: slots that fit, with times that do not,
    // are refused before either is allocated.
    let machine = machine_memory_bytes().expect("/proc/meminfo names the machine's memory");
    let geometry = Geometry::with_memory(machine / 4 * 3, 8).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(crate::dedup::clock::SystemClock);
    let error = Table::with_max_age(geometry, Duration::from_secs(60), clock).unwrap_err();
    assert_eq!(
        error,
        TableError::Alloc {
            bytes: 2 * geometry.memory_bytes(),
            timed: true,
            machine_bytes: Some(machine),
        }
    );
    assert!(
        error
            .to_string()
            .contains("for the table with a time beside each slot (this machine has "),
        "{error}"
    );
    // Slots round up to whole sets; memory rounds down.
    assert_eq!(Table::with_slots(9, 8).unwrap().slots(), 16);
    assert_eq!(Table::with_memory(1000, 8).unwrap().slots(), 120);
    assert_eq!(Table::with_memory(1000, 8).unwrap().memory_bytes(), 960);
    assert_eq!(Table::with_slots(5, 1).unwrap().slots(), 5);
}

#[test]
fn a_full_set_evicts_its_oldest_entry_and_hits_do_not_refresh_age() {
    // One set of four ways.
    let table = Table::with_slots(4, 4).unwrap();
    let d: Vec<Digest> = pool(1);
    for digest in &d[..4] {
        assert!(!table.contains_and_add(*digest));
    }
    // A hit on the oldest does not make it young again.
    assert!(table.contains_and_add(d[0]));
    assert!(!table.contains_and_add(d[4]));
    assert!(!table.contains(d[0]), "the oldest entry is replaced first");
    assert!(d[1..5].iter().all(|x| table.contains(*x)));
    // An erased slot is reused before anything is evicted.
    assert!(table.erase(d[3]));
    assert!(!table.contains_and_add(d[5]));
    assert!([1, 2, 4, 5].iter().all(|&i| table.contains(d[i])));
}

#[test]
fn digests_that_share_part_of_a_fingerprint_are_told_apart() {
    // One set of eight ways. The 8-way insert first screens slots on the upper 32 bits of their
    // word; these digests share those bits (and the set) and differ below them, or are zero
    // there, as an empty slot is.
    let table = Table::with_slots(8, 8).unwrap();
    let digest = |lo: u64| Digest::from_u128(u128::from(lo) | 7 << 64);
    let shared = 0xDEAD_BEEF << 32;
    let upper_zero = [1 << 6, 2 << 6, 3 << 6];
    for lo in [shared | 1 << 6, shared | 2 << 6, shared | 1 << 31] {
        assert_eq!(table.claim(digest(lo)), Claim::New, "{lo:#x}");
    }
    for lo in upper_zero {
        assert_eq!(table.claim(digest(lo)), Claim::New, "{lo:#x}");
    }
    assert_eq!(table.occupied(), 6);
    assert!(table.commit(digest(shared | 2 << 6)));
    assert_eq!(table.claim(digest(shared | 1 << 6)), Claim::InFlight);
    assert_eq!(table.claim(digest(shared | 2 << 6)), Claim::Duplicate);
    assert_eq!(table.claim(digest(shared | 3 << 6)), Claim::New);
    assert_eq!(table.claim(digest(upper_zero[1])), Claim::InFlight);
    // The low 6 bits are not part of the fingerprint: this is the same entry.
    assert_eq!(table.claim(digest(upper_zero[1] | 5)), Claim::InFlight);
}

#[test]
fn commit_and_erase_act_only_on_their_own_digest() {
    let table = Table::with_slots(1, 1).unwrap();
    let d = pool(2);
    assert_eq!(table.claim(d[0]), Claim::New);
    // d[1] takes the only bucket: d[0]'s late commit and erase must not touch d[1].
    assert_eq!(table.claim(d[1]), Claim::New);
    assert!(!table.commit(d[0]));
    assert!(!table.erase(d[0]));
    assert_eq!(table.claim(d[1]), Claim::InFlight);
    assert!(table.commit(d[1]));
    assert_eq!(table.claim(d[1]), Claim::Duplicate);
}

/// Distinct random digests such that no set receives more than `ways` of them.
fn digests_without_overflow(geometry: Geometry, count: usize, seed: u64) -> Vec<Digest> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut per_set: HashMap<u64, u32> = HashMap::new();
    let mut fingerprints = HashSet::new();
    let mut digests = Vec::with_capacity(count);
    while digests.len() < count {
        let digest = Digest::from_u128(rng.gen());
        let load = per_set.entry(geometry.set_of(digest)).or_default();
        if *load < geometry.ways() && fingerprints.insert(fingerprint(digest)) {
            *load += 1;
            digests.push(digest);
        }
    }
    assert!(per_set.values().all(|&n| n <= geometry.ways()));
    digests
}

#[test]
#[cfg_attr(miri, ignore)]
fn concurrent_claims_of_one_digest_yield_exactly_one_new() {
    const THREADS: usize = 4;
    // Several rounds on fresh tables. All threads start together and walk the same order, so
    // each digest is claimed by several threads at the same moment; sets are nearly full, so
    // claims of different digests also meet in one set.
    for (round, ways) in [1, 8, 2, 8, 4, 8, 8, 8].into_iter().enumerate() {
        let geometry = Geometry::new(4096, ways).unwrap();
        let digests = digests_without_overflow(geometry, 4000, round as u64);
        let table = Table::new(geometry).unwrap();
        let news: Vec<AtomicU32> = digests.iter().map(|_| AtomicU32::new(0)).collect();
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                let (table, digests, news, start) = (&table, &digests, &news, &start);
                scope.spawn(move || {
                    start.wait();
                    for (i, digest) in digests.iter().enumerate() {
                        if table.claim(*digest) == Claim::New {
                            news[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let counts: Vec<u32> = news.iter().map(|n| n.load(Ordering::Relaxed)).collect();
        let wrong: Vec<(usize, u32)> = counts
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, n)| n != 1)
            .collect();
        assert!(
            wrong.is_empty(),
            "ways {ways}: every digest must get exactly one New; {} did not, first (index, count): {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        assert_eq!(table.occupied(), digests.len() as u64);
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn concurrent_claim_commit_erase_keep_the_books_balanced() {
    const THREADS: usize = 4;
    // Fresh tables each round, all threads starting together on the same order, so that
    // claims, commits and erases in one set happen at the same moment.
    for round in 0..16u64 {
        let geometry = Geometry::new(2048, 8).unwrap();
        let digests = digests_without_overflow(geometry, 2000, 9 + round);
        let table = Table::new(geometry).unwrap();
        let news: Vec<AtomicU32> = digests.iter().map(|_| AtomicU32::new(0)).collect();
        let erases: Vec<AtomicU32> = digests.iter().map(|_| AtomicU32::new(0)).collect();
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (table, digests, news, erases, start) =
                    (&table, &digests, &news, &erases, &start);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(100 * round + thread as u64);
                    start.wait();
                    for _ in 0..2 {
                        for (i, digest) in digests.iter().enumerate() {
                            if table.claim(*digest) != Claim::New {
                                continue;
                            }
                            news[i].fetch_add(1, Ordering::Relaxed);
                            // Only the owner of a claim ends it, and nothing overflows, so
                            // its entry is still there.
                            if rng.gen_ratio(1, 2) {
                                assert!(table.erase(*digest));
                                erases[i].fetch_add(1, Ordering::Relaxed);
                            } else {
                                assert!(table.commit(*digest));
                            }
                        }
                    }
                });
            }
        });
        for (i, digest) in digests.iter().enumerate() {
            let news = news[i].load(Ordering::Relaxed);
            let erases = erases[i].load(Ordering::Relaxed);
            assert!(news >= 1);
            // Every New turned an absent digest into a present one, every erase the reverse;
            // what is left was committed.
            let held = u32::from(table.contains(*digest));
            assert_eq!(held, news - erases, "round {round}, digest {i}");
            if held == 1 {
                assert_eq!(
                    table.claim(*digest),
                    Claim::Duplicate,
                    "round {round}, digest {i}"
                );
            }
        }
    }
}

#[test]
fn prefault_changes_nothing() {
    let table = Table::with_slots(1 << 16, 8).unwrap();
    let d = pool(3);
    assert_eq!(table.claim(d[0]), Claim::New);
    assert!(!table.contains_and_add(d[1]));
    table.prefault();
    assert_eq!(table.claim(d[0]), Claim::InFlight);
    assert_eq!(table.claim(d[1]), Claim::Duplicate);
    assert_eq!(table.occupied(), 2);
}

#[test]
fn claim_many_answers_as_single_claims_do() {
    let geometry = Geometry::new(64, 4).unwrap();
    let (batched, single) = (Table::new(geometry).unwrap(), Table::new(geometry).unwrap());
    // Repeats within the batch and sets that overflow.
    let d = pool(4);
    let digests: Vec<Digest> = (0..200).map(|i| d[(i * 7) % d.len()]).collect();
    let mut claims = Vec::new();
    batched.claim_many_into(&digests, &mut claims);
    let expected: Vec<Claim> = digests.iter().map(|x| single.claim(*x)).collect();
    assert_eq!(claims, expected);
    assert!(claims.contains(&Claim::New) && claims.contains(&Claim::InFlight));
}

#[test]
fn commit_many_and_erase_many_answer_as_single_calls_do() {
    let geometry = Geometry::new(64, 4).unwrap();
    let (batched, single) = (Table::new(geometry).unwrap(), Table::new(geometry).unwrap());
    // Claimed first, more than the sets keep (some entries were pushed out), then committed
    // and erased in a mixed order with repeats and digests never claimed.
    let d = pool(5);
    for table in [&batched, &single] {
        for digest in &d[..24] {
            table.claim(*digest);
        }
    }
    let commits: Vec<Digest> = (0..200).map(|i| d[(i * 7) % d.len()]).collect();
    let erases: Vec<Digest> = (0..200).map(|i| d[(i * 11 + 3) % d.len()]).collect();
    let (mut committed, mut erased) = (Vec::new(), Vec::new());
    batched.commit_many_into(&commits, &mut committed);
    batched.erase_many_into(&erases, &mut erased);
    let expected_commits: Vec<bool> = commits.iter().map(|x| single.commit(*x)).collect();
    let expected_erases: Vec<bool> = erases.iter().map(|x| single.erase(*x)).collect();
    assert_eq!(committed, expected_commits);
    assert_eq!(erased, expected_erases);
    assert!(committed.contains(&true) && committed.contains(&false));
    assert!(erased.contains(&true) && erased.contains(&false));
    let claims = |table: &Table| d.iter().map(|x| table.claim(*x)).collect::<Vec<_>>();
    assert_eq!(claims(&batched), claims(&single), "the same entries after");
}
