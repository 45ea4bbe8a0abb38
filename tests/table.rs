//! The table against the sizing formula and against exact de-duplication.

use std::collections::{HashMap, HashSet, VecDeque};

use nsq_dedupe::filter::{filter_records, FilterStats};
use nsq_dedupe::sizing::catch_probability;
use nsq_dedupe::{Digest, DigestAlgorithm, Geometry, Keyer, Table};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inserts a stream of distinct random digests and, for every `stride`-th one, asks whether it
/// is still held `delay` distinct digests later. Returns the share still held.
fn measured_catch_rate(geometry: Geometry, delay: usize, samples: usize, seed: u64) -> f64 {
    const STRIDE: usize = 3;
    let table = Table::new(geometry).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pending: VecDeque<(usize, Digest)> = VecDeque::new();
    let (mut caught, mut asked) = (0usize, 0usize);
    for i in 0.. {
        let digest = Digest::from_u128(rng.gen());
        assert!(
            !table.contains_and_add(digest),
            "a fresh random digest was reported seen"
        );
        if i % STRIDE == 0 && i / STRIDE < samples {
            pending.push_back((i, digest));
        }
        while let Some(&(at, old)) = pending.front() {
            if i - at < delay {
                break;
            }
            pending.pop_front();
            asked += 1;
            caught += usize::from(table.contains(old));
        }
        if asked == samples {
            break;
        }
    }
    caught as f64 / asked as f64
}

#[test]
fn measured_catch_rate_matches_the_formula_for_one_and_eight_ways() {
    const SAMPLES: usize = 20_000;
    for ways in [1, 8] {
        let geometry = Geometry::new(4096, ways).unwrap();
        for (k, delay) in [256, 1024, 4096, 6000, 8192].into_iter().enumerate() {
            let expected = catch_probability(geometry, delay as f64);
            let measured = measured_catch_rate(geometry, delay, SAMPLES, k as u64);
            // Samples overlap in time, so allow well beyond the binomial standard error.
            let tolerance = 5.0 * (expected * (1.0 - expected) / SAMPLES as f64).sqrt() + 0.01;
            assert!(
                (measured - expected).abs() <= tolerance,
                "ways {ways}, delay {delay}: measured {measured:.4}, formula {expected:.4}"
            );
        }
    }
    // The two shapes really differ, so the check above tells them apart: at a delay of one
    // table size, eight ways keep about 45% and one way about 37%.
    let one = catch_probability(Geometry::new(4096, 1).unwrap(), 4096.0);
    let eight = catch_probability(Geometry::new(4096, 8).unwrap(), 4096.0);
    assert!(eight - one > 0.05, "{one} {eight}");
}

/// Whether every repeated record arrives while its first copy must still be in the table: fewer
/// than `ways` other distinct keys landed in its set in between.
fn no_set_overflows_within_a_delay(geometry: Geometry, keys: &[Digest]) -> bool {
    let mut first_seen: HashMap<Digest, usize> = HashMap::new();
    let mut arrivals_per_set: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        let set = geometry.set_of(*key);
        match first_seen.get(key) {
            None => {
                first_seen.insert(*key, i);
                arrivals_per_set.entry(set).or_default().push(i);
            }
            Some(&first) => {
                let later = arrivals_per_set[&set]
                    .iter()
                    .filter(|&&at| at > first)
                    .count();
                if later >= geometry.ways() as usize {
                    return false;
                }
            }
        }
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the table's size, no record is lost (the output holds every distinct record,
    /// first copies in input order); and when no set overflows within any copy's delay, the
    /// output is exactly that of a perfect de-duplicator.
    #[test]
    fn filter_never_loses_and_equals_exact_dedup_without_overflow(
        records in prop::collection::vec(0u32..400, 0..1500),
        ways in prop::sample::select(vec![1u32, 8]),
        sets in prop::sample::select(vec![16u64, 128, 4096]),
    ) {
        let geometry = Geometry::new(sets * u64::from(ways), ways).unwrap();
        let table = Table::new(geometry).unwrap();
        let input: Vec<u8> = records.iter().flat_map(|r| format!("r{r}\n").into_bytes()).collect();
        let mut output = Vec::new();
        let mut stats = FilterStats::default();
        filter_records(&input[..], &mut output, &table, &Keyer::default(), false, false, &mut stats)
            .unwrap();

        let mut seen = HashSet::new();
        let exact: Vec<String> = records
            .iter()
            .filter(|r| seen.insert(**r))
            .map(|r| format!("r{r}"))
            .collect();
        let got: Vec<String> = String::from_utf8(output)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        // Nothing lost: the exact output is a subsequence of ours.
        let mut got_iter = got.iter();
        for line in &exact {
            prop_assert!(got_iter.any(|g| g == line), "lost or reordered {}", line);
        }
        prop_assert_eq!(stats.records_in, records.len() as u64);
        prop_assert_eq!(stats.records_out + stats.duplicates, stats.records_in);

        let algorithm = DigestAlgorithm::default();
        let keys: Vec<Digest> =
            records.iter().map(|r| algorithm.digest(format!("r{r}").as_bytes())).collect();
        if no_set_overflows_within_a_delay(geometry, &keys) {
            prop_assert_eq!(got, exact);
        }
    }
}

#[test]
fn the_overflow_check_sees_both_outcomes() {
    // The property above only means something if both branches occur: a roomy table must pass
    // the check and a tiny one must fail it on the same stream.
    let algorithm = DigestAlgorithm::default();
    let keys: Vec<Digest> = (0..300u32)
        .chain(0..300)
        .map(|r| algorithm.digest(format!("r{r}").as_bytes()))
        .collect();
    assert!(no_set_overflows_within_a_delay(
        Geometry::new(1 << 16, 8).unwrap(),
        &keys
    ));
    assert!(!no_set_overflows_within_a_delay(
        Geometry::new(128, 8).unwrap(),
        &keys
    ));
}

/// The rules every store keeps (see `store_contract`), against the in-process table.
mod contract {
    crate::store_contract::store_contract_tests!(every: crate::store_contract::InProcess::default());
}
