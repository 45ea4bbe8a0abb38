//! [`Edit`] against the model: for random items, values and operations, the same answers and
//! byte for byte the same value as decoding, applying on the [`ItemState`] and encoding.

use proptest::prelude::*;

use super::super::{COMPACT_UNTIMED, MAX_SLOTS};
use super::*;

/// One operation of a run: the set within the item, the operation, a fingerprint from a small
/// pool (so that entries meet), the owner, and how far the clock moves first.
type Step = (usize, Op, u64, u64, u64);

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Claim),
        2 => Just(Op::ClaimDone),
        3 => Just(Op::Commit),
        2 => Just(Op::Erase),
        1 => Just(Op::Renew),
    ]
}

fn steps(len: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0..64usize, op(), 0..14u64, 1..3u64, 0..120u64), 0..len)
}

/// The facts of a run's operations, timed with `max_age_ms`: the clock at `now_ms`, a lease of
/// 100 ms.
fn facts(now_ms: u64, owner: u64, max_age_ms: Option<u64>) -> LeaseFacts {
    LeaseFacts {
        now_ms,
        lease_until_ms: now_ms + 100,
        owner,
        max_age_ms,
    }
}

/// Runs `steps` from `now_ms` on whatever `apply` changes, the set taken within `sets`;
/// returns the answers.
fn run(
    steps: &[Step],
    sets: usize,
    max_age_ms: Option<u64>,
    mut now_ms: u64,
    mut apply: impl FnMut(usize, Op, Digest, LeaseFacts) -> (Outcome, bool),
) -> Vec<(Outcome, bool)> {
    steps
        .iter()
        .map(|&(set, op, print, owner, step_ms)| {
            now_ms += step_ms;
            let digest = Digest::from_u128(u128::from(print));
            apply(set % sets, op, digest, facts(now_ms, owner, max_age_ms))
        })
        .collect()
}

/// The value format written with `max_age_ms`, as the stores pick it.
fn version(max_age_ms: Option<u64>) -> u8 {
    if max_age_ms.is_some() {
        COMPACT_TIMED
    } else {
        COMPACT_UNTIMED
    }
}

fn is_bytes(edit: &Edit) -> bool {
    matches!(edit.held, Held::Bytes(_))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// A value this version wrote (after `before`, in the format `written_timed` says), maybe
    /// with bytes changed (`damage`), then `after` on it: `Edit` answers as the model does and
    /// writes the model's bytes; a value the model writes is edited in place, and stays so.
    #[test]
    fn edits_answer_and_write_as_the_model(
        (sets, ways) in (1..=20usize, 1..=8usize),
        written_timed in any::<bool>(),
        max_age_ms in prop::option::of(0..3_000u64),
        before in steps(80),
        after in steps(40),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        start_ms in 1_000_000..1_010_000u64,
    ) {
        prop_assume!(sets * ways <= MAX_SLOTS);
        let written_age = written_timed.then_some(2_000);
        let mut model = ItemState::empty(sets, ways);
        run(&before, sets, written_age, start_ms, |set, op, digest, facts| {
            apply(&mut model, set, op, digest, facts)
        });
        let mut value = Vec::new();
        encode_into(&model, version(written_age), &mut value);
        let undamaged = damage.is_empty();
        for (at, byte) in damage {
            let at = at.index(value.len());
            value[at] ^= byte;
        }
        let target = version(max_age_ms);
        let now_ms = start_ms + 10_000;

        let decoded = decode(&value, sets, ways);
        prop_assert_eq!(decodes(&value, sets, ways), decoded.is_ok());
        let edit = Edit::read(value.clone(), sets, ways, target);
        let (mut model, mut edit) = match (decoded, edit) {
            (Ok(model), Ok(edit)) => (model, edit),
            (Err(expected), read) => {
                prop_assert_eq!(read, Err(expected));
                return Ok(());
            }
            (Ok(_), Err(err)) => return Err(TestCaseError::fail(format!("refused: {err:?}"))),
        };
        if undamaged && written_timed == max_age_ms.is_some() {
            prop_assert!(is_bytes(&edit), "a value as this version writes it is edited in place");
        }
        let in_place = is_bytes(&edit);
        let expected = run(&after, sets, max_age_ms, now_ms, |set, op, digest, facts| {
            apply(&mut model, set, op, digest, facts)
        });
        let answers = run(&after, sets, max_age_ms, now_ms, |set, op, digest, facts| {
            edit.apply(set, op, digest, facts)
        });
        prop_assert_eq!(answers, expected);
        prop_assert_eq!(is_bytes(&edit), in_place, "an item edited in place stays so");
        let mut written = Vec::new();
        encode_into(&model, target, &mut written);
        prop_assert_eq!(edit.into_value(), written);
    }

    /// An empty item is the model's empty item, edited in place.
    #[test]
    fn an_empty_item_is_the_models(
        (sets, ways) in (1..=40usize, 1..=8usize),
        max_age_ms in prop::option::of(0..3_000u64),
        steps in steps(60),
    ) {
        prop_assume!(sets * ways <= MAX_SLOTS);
        let target = version(max_age_ms);
        let mut model = ItemState::empty(sets, ways);
        let mut edit = Edit::empty(sets, ways, target);
        prop_assert!(is_bytes(&edit));
        let expected = run(&steps, sets, max_age_ms, 5_000_000, |set, op, digest, facts| {
            apply(&mut model, set, op, digest, facts)
        });
        let answers = run(&steps, sets, max_age_ms, 5_000_000, |set, op, digest, facts| {
            edit.apply(set, op, digest, facts)
        });
        prop_assert_eq!(answers, expected);
        prop_assert!(is_bytes(&edit));
        let mut written = Vec::new();
        encode_into(&model, target, &mut written);
        prop_assert_eq!(edit.into_value(), written);
    }
}

/// A timed value whose empty slot carries a second (no version writes one) is not edited in
/// place: the model keeps that second where the bytes would drop it with the set's tail.
#[test]
fn an_empty_slot_with_a_second_is_decoded() {
    let facts = facts(9_000_000, 1, Some(1_000));
    let mut model = ItemState::empty(1, 4);
    for print in 1..=3 {
        apply(&mut model, 0, Op::Claim, Digest::from_u128(print), facts);
    }
    apply(&mut model, 0, Op::Erase, Digest::from_u128(2), facts);
    let mut value = Vec::new();
    encode_into(&model, COMPACT_TIMED, &mut value);
    // The short form: header, cursor, length 3, then the second slot's second.
    assert_eq!(value[..6], [COMPACT_TIMED + SHORT, 1, 4, 2, 0, 3]);
    let edit = Edit::read(value.clone(), 1, 4, COMPACT_TIMED).unwrap();
    assert!(is_bytes(&edit));
    value[6 + 12 + 8..6 + 12 + 12].copy_from_slice(&7u32.to_be_bytes());
    let edit = Edit::read(value.clone(), 1, 4, COMPACT_TIMED).unwrap();
    assert!(!is_bytes(&edit));
    assert_eq!(edit.into_value(), value);
}
