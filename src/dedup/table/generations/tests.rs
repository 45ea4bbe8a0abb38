use std::collections::HashMap;

use proptest::prelude::*;

use crate::dedup::table::tests::{pool, Model, POOL};
use crate::dedup::table::Table;
use crate::dedup::{Claim, Digest, Geometry};

#[derive(Debug, Clone)]
enum Op {
    Claim(usize),
    ContainsAndAdd(usize),
    Commit(usize),
    Erase(usize),
    /// Resize to a shape picked from a list by the index.
    Resize(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let index = 0usize..POOL;
    prop_oneof![
        6 => index.clone().prop_map(Op::Claim),
        4 => index.clone().prop_map(Op::ContainsAndAdd),
        4 => index.clone().prop_map(Op::Commit),
        3 => index.prop_map(Op::Erase),
        1 => (0usize..16).prop_map(Op::Resize),
    ]
}

/// The generations as specified, over the single-generation model: claims look in the
/// previous generations first, insert in the current one, and the previous ones retire once
/// the current one has taken as many new entries as it has slots.
struct Generations {
    current: Model,
    previous: Vec<Model>,
    inserts: u64,
    turnover: u64,
}

impl Generations {
    fn claim(&mut self, digest: Digest, as_done: bool) -> Claim {
        if let Some(held) = self.previous.iter_mut().find_map(|m| m.lookup(digest)) {
            return held;
        }
        let claim = self.current.claim(digest, as_done);
        if claim == Claim::New && !self.previous.is_empty() {
            self.inserts += 1;
            if self.inserts >= self.turnover {
                self.previous.clear();
            }
        }
        claim
    }

    fn commit(&mut self, digest: Digest) -> bool {
        self.current.commit(digest) || self.previous.iter_mut().any(|m| m.commit(digest))
    }

    fn erase(&mut self, digest: Digest) -> bool {
        self.current.erase(digest) || self.previous.iter_mut().any(|m| m.erase(digest))
    }

    fn resize(&mut self, geometry: Geometry) {
        let old = std::mem::replace(&mut self.current, Model::new(geometry));
        self.previous.insert(0, old);
        self.inserts = 0;
        self.turnover = geometry.slots();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over random claims, commits, erases and resizes of tables small enough that sets
    /// overflow and previous generations retire all the time, the table answers exactly as
    /// the generations' specification does.
    #[test]
    fn resized_tables_follow_the_generations_model(
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let shape = |i: usize| {
            let ways = [1u32, 2, 4, 8][i % 4];
            Geometry::new((1 + (i / 4) as u64) * u64::from(ways), ways).unwrap()
        };
        let mut table = Table::new(shape(5)).unwrap();
        let mut model = Generations {
            current: Model::new(shape(5)),
            previous: Vec::new(),
            inserts: 0,
            turnover: 0,
        };
        let digests = pool(seed);
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Claim(i) => prop_assert_eq!(
                    table.claim(digests[i]), model.claim(digests[i], false), "step {}", step
                ),
                Op::ContainsAndAdd(i) => prop_assert_eq!(
                    table.contains_and_add(digests[i]),
                    model.claim(digests[i], true) != Claim::New,
                    "step {}", step
                ),
                Op::Commit(i) => prop_assert_eq!(
                    table.commit(digests[i]), model.commit(digests[i]), "step {}", step
                ),
                Op::Erase(i) => {
                    prop_assert_eq!(
                        table.erase(digests[i]), model.erase(digests[i]), "step {}", step
                    );
                    // The erase left no generation holding the digest: its retry is new.
                    prop_assert!(!table.contains(digests[i]), "step {}", step);
                }
                Op::Resize(i) => {
                    table = table.resize(shape(i)).unwrap();
                    model.resize(shape(i));
                }
            }
            prop_assert_eq!(
                table.resizing().map(|r| r.generations).unwrap_or(1),
                1 + model.previous.len(),
                "step {}", step
            );
        }
    }

    /// With tables large enough that nothing is evicted and no previous generation retires,
    /// any sequence of claims, commits, erases and resizes answers as a map of each digest's
    /// state: a committed digest is never new again (a copy is never delivered), one in flight
    /// stays in flight, and an erased one is new (its retry is never taken for a copy).
    #[test]
    fn resizes_forget_nothing_inside_the_window(
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        // 8 ways and at least 256 sets: 9 of 32 digests in one set does not happen.
        let shape = |i: usize| Geometry::new((2048 << (i % 4)) as u64, 8).unwrap();
        let mut table = Table::new(shape(0)).unwrap();
        let mut states: HashMap<usize, Claim> = HashMap::new();
        let digests = pool(seed);
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Claim(i) => {
                    let expected = states.get(&i).copied().unwrap_or(Claim::New);
                    prop_assert_eq!(table.claim(digests[i]), expected, "step {}", step);
                    states.entry(i).or_insert(Claim::InFlight);
                }
                Op::ContainsAndAdd(i) => {
                    prop_assert_eq!(
                        table.contains_and_add(digests[i]), states.contains_key(&i), "step {}", step
                    );
                    states.entry(i).or_insert(Claim::Duplicate);
                }
                Op::Commit(i) => {
                    let held = states.contains_key(&i);
                    prop_assert_eq!(table.commit(digests[i]), held, "step {}", step);
                    if held {
                        states.insert(i, Claim::Duplicate);
                    }
                }
                Op::Erase(i) => {
                    prop_assert_eq!(
                        table.erase(digests[i]), states.remove(&i).is_some(), "step {}", step
                    );
                }
                Op::Resize(i) => table = table.resize(shape(i)).unwrap(),
            }
        }
        for (i, digest) in digests.iter().enumerate() {
            prop_assert_eq!(table.contains(*digest), states.contains_key(&i), "digest {}", i);
        }
    }
}

/// A timed table's previous generation retires once `max_age` has passed since the resize,
/// even before the new table has turned over; its entries answer until then.
#[test]
fn with_max_age_the_previous_generation_retires_after_max_age() {
    use crate::dedup::clock::ManualClock;
    use std::sync::Arc;
    use std::time::Duration;
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let geometry = Geometry::new(1 << 10, 8).unwrap();
    let table = Table::with_max_age(geometry, Duration::from_secs(60), clock.clone()).unwrap();
    let digests = pool(7);
    assert!(!table.contains_and_add(digests[0]));
    let table = table.resize(Geometry::new(1 << 12, 8).unwrap()).unwrap();
    let resizing = table.resizing().unwrap();
    assert_eq!(
        (
            resizing.generations,
            resizing.previous_slots,
            resizing.seconds_left
        ),
        (2, 1 << 10, Some(60))
    );
    assert_eq!(resizing.inserts_left, 1 << 12);
    clock.advance_ms(30_000);
    assert!(
        table.contains_and_add(digests[0]),
        "held by the previous one"
    );
    assert!(!table.contains_and_add(digests[1]));
    assert_eq!(table.resizing().unwrap().seconds_left, Some(30));
    clock.advance_ms(31_000);
    // The next new entry finds max_age passed since the resize.
    assert!(!table.contains_and_add(digests[2]));
    assert_eq!(table.resizing(), None);
    assert!(table.contains(digests[1]) && table.contains(digests[2]));
}

/// Threads claiming while the previous generation retires under them (its memory released
/// while they read it): a new digest is never taken for a copy and none goes without a `New`,
/// and a digest the previous generation held is a copy until it retires, never in flight.
#[test]
fn claims_racing_the_retirement_never_take_a_new_digest_for_a_copy() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let digest = |i: u64| crate::DigestAlgorithm::default().digest(&i.to_le_bytes());
    for round in 0..20u64 {
        let old = Table::new(Geometry::new(1 << 12, 8).unwrap()).unwrap();
        let held: Vec<Digest> = (0..1000).map(|i| digest(round << 32 | i)).collect();
        for d in &held {
            assert!(!old.contains_and_add(*d));
        }
        // Turns over after 512 new entries: early in the threads' claims.
        let table = old.resize(Geometry::new(512, 8).unwrap()).unwrap();
        let news: Vec<AtomicU32> = (0..2000).map(|_| AtomicU32::new(0)).collect();
        let copies = AtomicU32::new(0);
        let held_in_flight = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                let (table, news, copies) = (&table, &news, &copies);
                scope.spawn(move || {
                    for i in 0..2000u64 {
                        match table.claim(digest(round << 32 | 1 << 20 | i)) {
                            Claim::New => news[i as usize].fetch_add(1, Ordering::Relaxed),
                            Claim::Duplicate => copies.fetch_add(1, Ordering::Relaxed),
                            Claim::InFlight => 0,
                        };
                    }
                });
            }
            let (table, held, held_in_flight) = (&table, &held, &held_in_flight);
            scope.spawn(move || {
                for d in held {
                    if table.claim(*d) == Claim::InFlight {
                        held_in_flight.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        });
        assert_eq!(table.resizing(), None, "round {round}: retired");
        assert_eq!(copies.load(Ordering::Relaxed), 0, "round {round}");
        assert_eq!(held_in_flight.load(Ordering::Relaxed), 0, "round {round}");
        assert!(
            news.iter().all(|n| n.load(Ordering::Relaxed) >= 1),
            "round {round}"
        );
    }
}
