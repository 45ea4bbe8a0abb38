use super::*;

use super::test_facts as facts;

fn d(n: u128) -> Digest {
    Digest::from_u128(n)
}

fn run(item: &mut ItemState, op: Op, n: u128, facts: LeaseFacts) -> (Outcome, bool) {
    apply(item, 0, op, d(n), facts)
}

#[test]
fn claims_follow_leases_and_owners() {
    let (me, other) = (1, 2);
    let mut item = ItemState::empty(1, 2);
    assert_eq!(
        run(&mut item, Op::Claim, 10, facts(0, me)),
        (Outcome::Claim(Claim::New), true)
    );
    assert_eq!(
        run(&mut item, Op::Claim, 10, facts(50, other)),
        (Outcome::Claim(Claim::InFlight), false)
    );
    // After the lease (until 100), another owner takes over in place.
    assert_eq!(
        run(&mut item, Op::Claim, 10, facts(100, other)),
        (Outcome::Claim(Claim::New), true)
    );
    assert_eq!(item.in_flight(), 1);
    assert_eq!(
        run(&mut item, Op::Commit, 10, facts(110, me)),
        (Outcome::Held(false), false)
    );
    assert_eq!(
        run(&mut item, Op::Commit, 10, facts(110, other)),
        (Outcome::Held(true), true)
    );
    assert_eq!(item.in_flight(), 0, "a done entry keeps no lease");
    assert_eq!(
        run(&mut item, Op::Commit, 10, facts(110, me)),
        (Outcome::Held(true), false),
        "committing a done entry is a no-op that reports it held"
    );
    assert_eq!(
        run(&mut item, Op::Claim, 10, facts(10_000, me)),
        (Outcome::Claim(Claim::Duplicate), false)
    );
    // Erase and renew by a non-owner do nothing; renew extends the owner's lease.
    run(&mut item, Op::Claim, 12, facts(200, me));
    assert_eq!(
        run(&mut item, Op::Erase, 12, facts(200, other)),
        (Outcome::Held(false), false)
    );
    assert_eq!(
        run(&mut item, Op::Renew, 12, facts(250, other)),
        (Outcome::Held(false), false)
    );
    assert_eq!(
        run(&mut item, Op::Renew, 12, facts(250, me)),
        (Outcome::Held(true), true)
    );
    assert_eq!(
        run(&mut item, Op::Claim, 12, facts(340, other)),
        (Outcome::Claim(Claim::InFlight), false),
        "renewed until 350"
    );
    assert_eq!(
        run(&mut item, Op::Erase, 12, facts(300, me)),
        (Outcome::Held(true), true)
    );
    assert_eq!(
        run(&mut item, Op::Claim, 12, facts(300, other)),
        (Outcome::Claim(Claim::New), true),
        "erased: new again"
    );
}

#[test]
fn a_committed_entry_is_final_and_one_claimed_done_is_its_claimers_while_its_lease_lasts() {
    let me = 1;
    let mut item = ItemState::empty(1, 4);
    run(&mut item, Op::Claim, 5, facts(0, me));
    run(&mut item, Op::Commit, 5, facts(10, me));
    assert_eq!(item.in_flight(), 0, "a committed entry keeps no record");
    assert_eq!(
        run(&mut item, Op::Erase, 5, facts(20, me)),
        (Outcome::Held(false), false),
        "not even its claimer erases it"
    );
    assert_eq!(
        run(&mut item, Op::Renew, 5, facts(20, me)),
        (Outcome::Held(false), false)
    );
    // Claimed done at once: a duplicate to all, erasable by its claimer until its lease ends.
    run(&mut item, Op::ClaimDone, 6, facts(30, me));
    assert_eq!(
        run(&mut item, Op::Claim, 6, facts(40, 2)),
        (Outcome::Claim(Claim::Duplicate), false)
    );
    assert_eq!(
        run(&mut item, Op::Erase, 6, facts(40, 2)),
        (Outcome::Held(false), false)
    );
    assert_eq!(
        run(&mut item, Op::Renew, 6, facts(40, me)),
        (Outcome::Held(false), false),
        "no lease to renew"
    );
    assert_eq!(
        run(&mut item, Op::Erase, 6, facts(129, me)),
        (Outcome::Held(true), true)
    );
    assert_eq!(
        run(&mut item, Op::Claim, 6, facts(130, 2)),
        (Outcome::Claim(Claim::New), true),
        "erased: its retry is new"
    );
    // After its lease (until 300) it is final, and the item's next write drops its record.
    run(&mut item, Op::ClaimDone, 7, facts(200, me));
    assert_eq!(item.in_flight(), 2);
    assert_eq!(
        run(&mut item, Op::Erase, 7, facts(300, me)),
        (Outcome::Held(false), false)
    );
    run(&mut item, Op::Claim, 8, facts(300, me));
    assert_eq!(item.in_flight(), 2, "6 and 8 in flight, 7's record gone");
    assert_eq!(
        run(&mut item, Op::Claim, 7, facts(310, 2)),
        (Outcome::Claim(Claim::Duplicate), false)
    );
}

#[test]
fn max_age_counts_whole_seconds_never_short() {
    let timed = |now_ms| LeaseFacts {
        max_age_ms: Some(1_000),
        ..facts(now_ms, 1)
    };
    let mut item = ItemState::empty(1, 2);
    run(&mut item, Op::Claim, 7, timed(5_999));
    run(&mut item, Op::Commit, 7, timed(5_999));
    // Committed in second 5: seen until the end of second 6 plus max_age.
    assert_eq!(
        run(&mut item, Op::Claim, 7, timed(7_000)),
        (Outcome::Claim(Claim::Duplicate), false)
    );
    assert_eq!(
        run(&mut item, Op::Claim, 7, timed(7_001)),
        (Outcome::Claim(Claim::New), true)
    );
    // A claim done at once is timed the same; without max_age nothing expires.
    run(&mut item, Op::ClaimDone, 8, timed(10_000));
    assert_eq!(
        run(&mut item, Op::Claim, 8, timed(12_001)),
        (Outcome::Claim(Claim::New), true)
    );
    let mut untimed = ItemState::empty(1, 2);
    run(&mut untimed, Op::ClaimDone, 9, facts(1_000, 1));
    assert_eq!(
        run(&mut untimed, Op::Claim, 9, timed(u64::MAX / 2)),
        (Outcome::Claim(Claim::Duplicate), false)
    );
}

#[test]
fn replacement_matches_the_in_process_cursor_within_each_set() {
    let me = 1;
    let mut item = ItemState::empty(2, 4);
    let claim = |item: &mut ItemState, set: usize, n: u128| {
        apply(item, set, Op::Claim, d(n), facts(0, me)).0
    };
    for n in 1..=4 {
        assert_eq!(claim(&mut item, 1, n), Outcome::Claim(Claim::New));
    }
    assert_eq!(item.in_flight(), 4);
    // Full: the cursor (slot 0) is replaced, and its lease goes with it.
    assert_eq!(claim(&mut item, 1, 5), Outcome::Claim(Claim::New));
    assert_eq!(item.in_flight(), 4);
    assert_eq!(
        claim(&mut item, 1, 1),
        Outcome::Claim(Claim::New),
        "pushed out"
    );
    assert_eq!(claim(&mut item, 1, 3), Outcome::Claim(Claim::InFlight));
    // The other set of the item is apart: the same digest is new there.
    assert_eq!(claim(&mut item, 0, 3), Outcome::Claim(Claim::New));
    // An erased slot is refilled first.
    apply(&mut item, 1, Op::Erase, d(4), facts(0, me));
    claim(&mut item, 1, 9);
    assert_eq!(
        claim(&mut item, 1, 2),
        Outcome::Claim(Claim::New),
        "the cursor moved on to 2"
    );
}

#[test]
fn values_round_trip_and_refuse_what_they_are_not() {
    let me = 1;
    let mut item = ItemState::empty(3, 2);
    apply(&mut item, 0, Op::Claim, d(1), facts(0, me));
    apply(&mut item, 2, Op::ClaimDone, d(2), facts(0, me));
    apply(&mut item, 2, Op::Claim, d(3), facts(0, me));
    // Pushes out the done 2, and its record: three in flight.
    apply(&mut item, 2, Op::Claim, d(4), facts(0, me));
    assert_eq!(item.in_flight(), 3);
    apply(&mut item, 1, Op::ClaimDone, d(5), facts(0, me));
    let mut bytes = Vec::new();
    encode_into(&item, COMPACT_UNTIMED, &mut bytes);
    // Two sets hold one slot of their two: the short form, with each set's length.
    assert_eq!(bytes.len(), 4 + 3 + 3 + 4 * 8 + 4 * 17);
    assert_eq!(decode(&bytes, 3, 2), Ok(item.clone()));
    let mut timed = Vec::new();
    encode_into(&item, COMPACT_TIMED, &mut timed);
    assert_eq!(timed.len(), 4 + 3 + 3 + 4 * 12 + 4 * 17);
    assert_eq!(decode(&timed, 3, 2), Ok(item.clone()));
    assert_eq!(decode(&bytes, 2, 2), Err(DecodeError::Shape));
    assert_eq!(decode(&bytes, 3, 4), Err(DecodeError::Shape));
    assert_eq!(
        decode(&bytes[..bytes.len() - 1], 3, 2),
        Err(DecodeError::Length)
    );
    assert_eq!(decode(&[], 3, 2), Err(DecodeError::Length));
    let mut foreign = bytes.clone();
    foreign[0] = 1;
    assert_eq!(decode(&foreign, 3, 2), Err(DecodeError::Version(1)));
    let mut cursor = bytes.clone();
    cursor[4] = 2;
    assert_eq!(decode(&cursor, 3, 2), Err(DecodeError::Slot(2)));
    // A record of an empty slot (slot 1 holds nothing).
    let mut record = bytes.clone();
    let first_record = bytes.len() - 4 * FLIGHT_BYTES;
    record[first_record] = 1;
    assert_eq!(decode(&record, 3, 2), Err(DecodeError::Slot(1)));
    // A second record of a slot that has one (slot 0, held and in flight).
    let mut repeated = bytes.clone();
    repeated[first_record + FLIGHT_BYTES] = 0;
    assert_eq!(decode(&repeated, 3, 2), Err(DecodeError::Slot(0)));
}

#[test]
fn a_fingerprint_is_never_the_empty_slot() {
    assert_eq!(fingerprint(Digest::from_u128(7u128 << 64)), 1);
    assert_eq!(fingerprint(Digest::from_u128(5)), 5);
}

#[test]
fn a_filling_item_is_written_short_and_a_full_one_whole() {
    let me = 1;
    let mut item = ItemState::empty(8, 8);
    let mut bytes = Vec::new();
    apply(&mut item, 5, Op::Claim, d(1), facts(0, me));
    encode_into(&item, COMPACT_UNTIMED, &mut bytes);
    // Header, cursors, lengths, one slot, its record: not the 541 bytes of every slot.
    assert_eq!(bytes.len(), 4 + 8 + 8 + 8 + FLIGHT_BYTES);
    assert_eq!(bytes[0], COMPACT_UNTIMED + SHORT);
    assert_eq!(decode(&bytes, 8, 8), Ok(item.clone()));
    apply(&mut item, 5, Op::Commit, d(1), facts(0, me));
    encode_into(&item, COMPACT_TIMED, &mut bytes);
    assert_eq!(bytes.len(), 4 + 8 + 8 + 12);
    assert_eq!(decode(&bytes, 8, 8), Ok(item.clone()));
    for set in 0..8 {
        for n in 0..8 {
            let digest = d((u128::from(set as u8) << 8) + n + 2);
            apply(&mut item, set, Op::Claim, digest, facts(1_000, me));
            apply(&mut item, set, Op::Commit, digest, facts(1_000, me));
        }
    }
    // Every set full: the full form, as a full table always had.
    encode_into(&item, COMPACT_UNTIMED, &mut bytes);
    assert_eq!(bytes[0], COMPACT_UNTIMED);
    assert_eq!(bytes.len(), value_bytes(8, 8, 0, false));
    assert_eq!(decode(&bytes, 8, 8), Ok(item.clone()));
    // Short and full forms refuse what they are not.
    let mut short = ItemState::empty(2, 4);
    apply(&mut short, 1, Op::Claim, d(3), facts(0, me));
    encode_into(&short, COMPACT_UNTIMED, &mut bytes);
    assert_eq!(bytes.len(), 4 + 2 + 2 + 8 + FLIGHT_BYTES);
    assert_eq!(
        decode(&bytes[..bytes.len() - 1], 2, 4),
        Err(DecodeError::Length)
    );
    let mut long = bytes.clone();
    long[4 + 2] = 5;
    assert_eq!(decode(&long, 2, 4), Err(DecodeError::Slot(5)));
    let mut more = bytes.clone();
    more[4 + 2] = 1;
    assert_eq!(decode(&more, 2, 4), Err(DecodeError::Length));
}

mod codec {
    use proptest::prelude::*;

    use super::super::*;

    /// An operation of a random sequence: which op, on which of a few digests of which set,
    /// by which of two owners, at which time step.
    fn step() -> impl Strategy<Value = (u8, u8, u8, bool, u8)> {
        (0..5u8, 0..16u8, 0..8u8, any::<bool>(), 0..4u8)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Over random operations on items of random shapes, every value decodes to the item
        /// it was encoded from, in the shorter of the two forms (the full one on a tie), and
        /// none of its shorter prefixes decodes.
        #[test]
        fn every_item_round_trips_in_its_shorter_form(
            sets in 1..9usize,
            ways in 1..9usize,
            timed in any::<bool>(),
            steps in prop::collection::vec(step(), 0..120),
        ) {
            let version = if timed { COMPACT_TIMED } else { COMPACT_UNTIMED };
            let mut item = ItemState::empty(sets, ways);
            let mut bytes = Vec::new();
            let mut now_ms = 1_000_000;
            for (op, n, set, other, wait) in steps {
                let op = [Op::Claim, Op::ClaimDone, Op::Commit, Op::Erase, Op::Renew][usize::from(op)];
                now_ms += u64::from(wait) * 40;
                let facts = LeaseFacts {
                    now_ms,
                    lease_until_ms: now_ms + 100,
                    owner: if other { 2 } else { 1 },
                    max_age_ms: timed.then_some(2_000),
                };
                let set = usize::from(set) % sets;
                let digest = Digest::from_u128((u128::from(n) << 64) | u128::from(n));
                apply(&mut item, set, op, digest, facts);
                encode_into(&item, version, &mut bytes);
                let full = value_bytes(sets, ways, item.flights.len(), timed);
                let held: usize = (0..sets).map(|s| held_len(&item, s)).sum();
                let short = full - (sets * ways - held) * slot_bytes(timed) + sets;
                prop_assert_eq!(bytes.len(), full.min(short));
                prop_assert_eq!(bytes[0] == version, full <= short);
                prop_assert_eq!(decode(&bytes, sets, ways), Ok(item.clone()));
                for cut in 0..bytes.len() {
                    prop_assert!(decode(&bytes[..cut], sets, ways).is_err());
                }
            }
        }

        /// Any bytes at all decode to an item or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_are_refused(
            version in COMPACT_UNTIMED..COMPACT_TIMED + SHORT + 1,
            sets in 1..4usize,
            ways in 1..4usize,
            flights in 0..3u8,
            body in prop::collection::vec(any::<u8>(), 0..120),
        ) {
            // A header of the item's shape, so that the bytes after it are what is tried.
            let mut value = vec![version, sets as u8, ways as u8, flights];
            value.extend(body);
            let _ = decode(&value, sets, ways);
        }
    }
}
