//! The pure model of one set as a Memcached value: its entries, how an operation changes
//! them ([`apply`]), and the value's bytes ([`encode`], [`decode`]). No I/O: the store reads a
//! value, applies operations here and compare-and-swaps the result.

pub(super) use crate::dedup::compact::{LeaseFacts, Op, Outcome};
use crate::dedup::shared::{FORMAT_VERSION, FORMAT_VERSION_TIMED};
use crate::dedup::{Claim, Digest};

/// Bytes of one entry in a value: slot index, digest, state, lease expiry, owner.
pub(super) const ENTRY_BYTES: usize = 34;

/// Bytes before the first entry: version, cursor, count.
const HEADER_BYTES: usize = 3;

/// The state of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    InFlight = 1,
    Done = 2,
}

/// One way of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) digest: Digest,
    pub(super) state: State,
    /// In flight: when the lease ends. Done: when it was committed (format 2), or 0 (format
    /// 1, or committed without `max_age`). Milliseconds since the Unix epoch.
    pub(super) lease_until_ms: u64,
    pub(super) owner: u64,
}

/// The most ways a set has ([`Geometry::SUPPORTED_WAYS`](crate::dedup::Geometry::SUPPORTED_WAYS)).
const MAX_WAYS: usize = 8;

/// One set: `ways` slots and the cursor of the next eviction, as in the in-process table.
///
/// The slots live in the value itself, not on the heap: a set is decoded, changed and encoded
/// for every operation, so it allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SetState {
    /// The slot a new digest replaces when no slot is empty.
    pub(super) cursor: usize,
    /// How many of `room` are the set's slots; those after them stay empty.
    ways: usize,
    room: [Option<Entry>; MAX_WAYS],
}

impl SetState {
    /// A set of `ways` empty slots (at most [`MAX_WAYS`]; more are cut to that).
    pub(super) fn empty(ways: usize) -> Self {
        SetState {
            cursor: 0,
            ways: ways.min(MAX_WAYS),
            room: [None; MAX_WAYS],
        }
    }

    /// Exactly `ways` slots.
    pub(super) fn slots(&self) -> &[Option<Entry>] {
        &self.room[..self.ways]
    }

    fn slots_mut(&mut self) -> &mut [Option<Entry>] {
        &mut self.room[..self.ways]
    }
}

/// Applies `op` for `digest` to a set. Returns the answer and whether the set changed (and
/// must be written).
///
/// Replacement is the in-process table's: a new digest takes the first empty slot, else the
/// slot at the cursor, and the cursor moves on by one. Slots fill in order and are replaced in
/// the same order (FIFO); a duplicate hit changes nothing; a slot emptied by `erase` is refilled
/// first and keeps its place in the rotation.
pub(super) fn apply(
    set: &mut SetState,
    op: Op,
    digest: Digest,
    facts: LeaseFacts,
) -> (Outcome, bool) {
    let found = set
        .slots()
        .iter()
        .position(|slot| slot.is_some_and(|entry| entry.digest == digest));
    // What a claim writes into its entry: in flight with this owner's lease, or, for a
    // claim done at once, done as a commit would write it.
    let (claimed, claimed_until_ms) = match op {
        Op::ClaimDone => (State::Done, done_time(facts)),
        _ => (State::InFlight, facts.lease_until_ms),
    };
    let Some(i) = found else {
        return match op {
            Op::Claim | Op::ClaimDone => {
                let ways = set.ways;
                let victim = match set.slots().iter().position(Option::is_none) {
                    Some(empty) => empty,
                    None => {
                        let victim = set.cursor % ways;
                        set.cursor = (victim + 1) % ways;
                        victim
                    }
                };
                set.slots_mut()[victim] = Some(Entry {
                    digest,
                    state: claimed,
                    lease_until_ms: claimed_until_ms,
                    owner: facts.owner,
                });
                (Outcome::Claim(Claim::New), true)
            }
            Op::Commit | Op::Erase | Op::Renew => (Outcome::Held(false), false),
        };
    };
    let slot = &mut set.slots_mut()[i];
    let Some(entry) = slot.as_mut() else {
        // `found` only points at occupied slots.
        return (Outcome::Held(false), false);
    };
    let mine = entry.owner == facts.owner;
    let expired = entry.state == State::Done
        && entry.lease_until_ms != 0
        && facts
            .max_age_ms
            .is_some_and(|max| facts.now_ms.saturating_sub(entry.lease_until_ms) > max);
    match (op, entry.state) {
        (Op::Claim | Op::ClaimDone, State::Done) if expired => {
            // Committed longer ago than `max_age`: a body sent again on purpose. Claim it anew,
            // in its slot.
            entry.state = claimed;
            entry.owner = facts.owner;
            entry.lease_until_ms = claimed_until_ms;
            (Outcome::Claim(Claim::New), true)
        }
        (Op::Claim | Op::ClaimDone, State::Done) => (Outcome::Claim(Claim::Duplicate), false),
        (Op::Claim | Op::ClaimDone, State::InFlight) if entry.lease_until_ms > facts.now_ms => {
            (Outcome::Claim(Claim::InFlight), false)
        }
        (Op::Claim | Op::ClaimDone, State::InFlight) => {
            // The owner let the lease lapse: take the entry over, in its slot.
            entry.state = claimed;
            entry.owner = facts.owner;
            entry.lease_until_ms = claimed_until_ms;
            (Outcome::Claim(Claim::New), true)
        }
        (Op::Commit, State::Done) => (Outcome::Held(true), false),
        (Op::Commit, State::InFlight) if mine => {
            entry.state = State::Done;
            entry.lease_until_ms = done_time(facts);
            (Outcome::Held(true), true)
        }
        (Op::Erase, _) if mine => {
            *slot = None;
            (Outcome::Held(true), true)
        }
        (Op::Renew, State::InFlight) if mine => {
            entry.lease_until_ms = facts.lease_until_ms;
            (Outcome::Held(true), true)
        }
        (Op::Commit | Op::Erase | Op::Renew, _) => (Outcome::Held(false), false),
    }
}

/// The time field of an entry made done now: the time of the commit when done entries
/// expire (`max_age`), else 0.
fn done_time(facts: LeaseFacts) -> u64 {
    if facts.max_age_ms.is_some() {
        facts.now_ms
    } else {
        0
    }
}

/// Encodes a set (see the module docs for the layout) in format `version`
/// ([`FORMAT_VERSION`] or [`FORMAT_VERSION_TIMED`]).
#[cfg(test)]
pub(super) fn encode(set: &SetState, version: u8) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(set, version, &mut out);
    out
}

/// [`encode`] into `out`, replacing what it held (and reusing its allocation).
pub(super) fn encode_into(set: &SetState, version: u8, out: &mut Vec<u8>) {
    let count = set.slots().iter().flatten().count();
    out.clear();
    out.reserve(HEADER_BYTES + count * ENTRY_BYTES);
    out.push(version);
    // At most 8 ways, so the cursor, the count and a slot index each fit in a byte.
    out.push(set.cursor as u8);
    out.push(count as u8);
    for (index, slot) in set.slots().iter().enumerate() {
        if let Some(entry) = slot {
            out.push(index as u8);
            out.extend_from_slice(&entry.digest.to_bytes());
            out.push(entry.state as u8);
            out.extend_from_slice(&entry.lease_until_ms.to_be_bytes());
            out.extend_from_slice(&entry.owner.to_be_bytes());
        }
    }
}

/// Why a value could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecodeError {
    /// Empty, or shorter or longer than its entry count says.
    Length,
    /// Written by another format version.
    Version(u8),
    /// More entries than the set has ways.
    Count(u8),
    /// A cursor or slot index outside the set, or two entries in one slot.
    Slot(u8),
    /// An unknown state byte.
    State(u8),
}

/// Decodes a set of `ways` ways.
pub(super) fn decode(value: &[u8], ways: usize) -> Result<SetState, DecodeError> {
    let [version, cursor, count, rest @ ..] = value else {
        return Err(DecodeError::Length);
    };
    if *version != FORMAT_VERSION && *version != FORMAT_VERSION_TIMED {
        return Err(DecodeError::Version(*version));
    }
    if usize::from(*cursor) >= ways {
        return Err(DecodeError::Slot(*cursor));
    }
    if usize::from(*count) > ways {
        return Err(DecodeError::Count(*count));
    }
    if rest.len() != usize::from(*count) * ENTRY_BYTES {
        return Err(DecodeError::Length);
    }
    let mut set = SetState::empty(ways);
    set.cursor = usize::from(*cursor);
    for raw in rest.chunks_exact(ENTRY_BYTES) {
        let index = raw[0];
        let slot = set
            .slots_mut()
            .get_mut(usize::from(index))
            .filter(|slot| slot.is_none())
            .ok_or(DecodeError::Slot(index))?;
        let state = match raw[17] {
            1 => State::InFlight,
            2 => State::Done,
            other => return Err(DecodeError::State(other)),
        };
        let array = |at: usize| -> Result<[u8; 8], DecodeError> {
            raw[at..at + 8].try_into().map_err(|_| DecodeError::Length)
        };
        let digest: [u8; 16] = raw[1..17].try_into().map_err(|_| DecodeError::Length)?;
        *slot = Some(Entry {
            digest: Digest::from_bytes(digest),
            state,
            lease_until_ms: u64::from_be_bytes(array(18)?),
            owner: u64::from_be_bytes(array(26)?),
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::compact::test_facts as facts;

    fn entry(n: u128, state: State, owner: u64) -> Entry {
        Entry {
            digest: Digest::from_u128(n),
            state,
            lease_until_ms: if state == State::Done {
                0
            } else {
                1_000 + n as u64 % 1_000
            },
            owner,
        }
    }

    fn set_of(cursor: usize, slots: Vec<Option<Entry>>) -> SetState {
        let mut set = SetState::empty(slots.len());
        set.cursor = cursor;
        set.slots_mut().copy_from_slice(&slots);
        set
    }

    fn digests(set: &SetState) -> Vec<Option<u128>> {
        set.slots()
            .iter()
            .map(|slot| slot.map(|e| e.digest.as_u128()))
            .collect()
    }

    #[test]
    fn value_round_trips() {
        let set = set_of(
            2,
            vec![
                Some(entry(u128::MAX - 3, State::InFlight, 7)),
                None,
                Some(entry(42, State::Done, u64::MAX)),
                None,
            ],
        );
        let bytes = encode(&set, FORMAT_VERSION);
        assert_eq!(bytes.len(), HEADER_BYTES + 2 * ENTRY_BYTES);
        assert_eq!(bytes[..4], [FORMAT_VERSION, 2, 2, 0]);
        assert_eq!(decode(&bytes, 4), Ok(set));
        assert_eq!(
            decode(&encode(&SetState::empty(1), FORMAT_VERSION), 1),
            Ok(SetState::empty(1))
        );
    }

    #[test]
    fn unreadable_bytes_are_rejected() {
        let good = encode(
            &set_of(0, vec![None, Some(entry(1, State::InFlight, 1))]),
            FORMAT_VERSION,
        );
        assert_eq!(
            decode(&good, 2).map(|s| digests(&s)),
            Ok(vec![None, Some(1)])
        );
        assert_eq!(decode(&[], 4), Err(DecodeError::Length));
        assert_eq!(decode(&good[..good.len() - 1], 2), Err(DecodeError::Length));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long, 2), Err(DecodeError::Length));
        let mut bad_state = good.clone();
        bad_state[HEADER_BYTES + 17] = 9;
        assert_eq!(decode(&bad_state, 2), Err(DecodeError::State(9)));
        // Slot 1 does not exist in a 1-way set, nor cursor 1.
        assert_eq!(decode(&good, 1), Err(DecodeError::Slot(1)));
        let mut bad_cursor = good.clone();
        bad_cursor[1] = 2;
        assert_eq!(decode(&bad_cursor, 2), Err(DecodeError::Slot(2)));
        // Two entries in one slot.
        let two = encode(
            &set_of(
                0,
                vec![
                    Some(entry(1, State::Done, 1)),
                    Some(entry(2, State::Done, 1)),
                ],
            ),
            FORMAT_VERSION,
        );
        let mut same_slot = two.clone();
        same_slot[HEADER_BYTES + ENTRY_BYTES] = 0;
        assert_eq!(decode(&same_slot, 2), Err(DecodeError::Slot(0)));
        assert_eq!(decode(&two, 1), Err(DecodeError::Count(2)));
        assert_eq!(decode(b"hello world", 8), Err(DecodeError::Version(b'h')));
    }

    #[test]
    fn a_claim_done_writes_the_entry_a_claim_and_commit_would() {
        let me = 1;
        let (d, e) = (Digest::from_u128(5), Digest::from_u128(6));
        for max_age_ms in [None, Some(10_000)] {
            let at = |now_ms| LeaseFacts {
                max_age_ms,
                ..facts(now_ms, me)
            };
            let mut two_steps = SetState::empty(2);
            apply(&mut two_steps, Op::Claim, d, at(1_000));
            apply(&mut two_steps, Op::Commit, d, at(1_000));
            let mut one_step = SetState::empty(2);
            assert_eq!(
                apply(&mut one_step, Op::ClaimDone, d, at(1_000)),
                (Outcome::Claim(Claim::New), true)
            );
            assert_eq!(one_step, two_steps, "max_age {max_age_ms:?}");
            assert_eq!(
                apply(&mut one_step, Op::ClaimDone, d, at(1_500)),
                (Outcome::Claim(Claim::Duplicate), false)
            );
            // An in-flight entry of another owner is still in flight to a claim done.
            apply(&mut one_step, Op::Claim, e, facts(1_000, 2));
            assert_eq!(
                apply(&mut one_step, Op::ClaimDone, e, at(1_050)),
                (Outcome::Claim(Claim::InFlight), false)
            );
            // Its claimer may erase it, as a committed one.
            assert_eq!(
                apply(&mut one_step, Op::Erase, d, at(1_600)),
                (Outcome::Held(true), true)
            );
        }
    }

    #[test]
    fn done_entries_older_than_max_age_are_claimed_anew() {
        let me = 1;
        let timed = |now_ms| LeaseFacts {
            max_age_ms: Some(10_000),
            ..facts(now_ms, me)
        };
        let d = Digest::from_u128(77);
        let mut set = SetState::empty(2);
        apply(&mut set, Op::Claim, d, timed(1_000));
        apply(&mut set, Op::Commit, d, timed(1_000));
        assert_eq!(
            set.slots()[0].unwrap().lease_until_ms,
            1_000,
            "the commit time"
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d, timed(11_000)),
            (Outcome::Claim(Claim::Duplicate), false)
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d, timed(11_001)),
            (Outcome::Claim(Claim::New), true)
        );
        assert_eq!(
            set.slots()[0].unwrap().state,
            State::InFlight,
            "in its slot"
        );
        // Format 2 round-trips the time; format 1's done entries (time 0) never expire.
        let bytes = encode(&set, FORMAT_VERSION_TIMED);
        assert_eq!(bytes[0], FORMAT_VERSION_TIMED);
        assert_eq!(decode(&bytes, 2), Ok(set.clone()));
        let mut old = set_of(0, vec![Some(entry(5, State::Done, 3)), None]);
        old = decode(&encode(&old, FORMAT_VERSION), 2).unwrap();
        assert_eq!(
            apply(
                &mut old,
                Op::Claim,
                Digest::from_u128(5),
                timed(u64::MAX / 2)
            ),
            (Outcome::Claim(Claim::Duplicate), false)
        );
    }

    #[test]
    fn other_format_version_is_rejected() {
        let mut bytes = encode(
            &set_of(0, vec![Some(entry(5, State::Done, 3)); 1]),
            FORMAT_VERSION,
        );
        bytes[0] = FORMAT_VERSION_TIMED + 1;
        assert_eq!(
            decode(&bytes, 1),
            Err(DecodeError::Version(FORMAT_VERSION_TIMED + 1))
        );
    }

    #[test]
    fn claims_follow_leases_and_owners() {
        let (me, other) = (1, 2);
        let mut set = SetState::empty(2);
        let d = Digest::from_u128;
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(0, me)),
            (Outcome::Claim(Claim::New), true)
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(50, other)),
            (Outcome::Claim(Claim::InFlight), false)
        );
        // After the lease (until 100), another owner takes over in place.
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(100, other)),
            (Outcome::Claim(Claim::New), true)
        );
        assert_eq!(set.slots()[0].unwrap().owner, other);
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, me)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, other)),
            (Outcome::Held(true), true)
        );
        assert_eq!(
            apply(&mut set, Op::Commit, d(10), facts(110, me)),
            (Outcome::Held(true), false),
            "committing a done entry is a no-op that reports it held"
        );
        assert_eq!(
            apply(&mut set, Op::Claim, d(10), facts(10_000, me)),
            (Outcome::Claim(Claim::Duplicate), false)
        );
        // Erase and renew by a non-owner do nothing; renew extends the owner's lease.
        apply(&mut set, Op::Claim, d(12), facts(200, me));
        assert_eq!(
            apply(&mut set, Op::Erase, d(12), facts(200, other)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Renew, d(12), facts(250, other)),
            (Outcome::Held(false), false)
        );
        assert_eq!(
            apply(&mut set, Op::Renew, d(12), facts(250, me)),
            (Outcome::Held(true), true)
        );
        assert_eq!(set.slots()[1].unwrap().lease_until_ms, 350);
        assert_eq!(
            apply(&mut set, Op::Renew, d(10), facts(250, other)),
            (Outcome::Held(false), false),
            "a done entry has no lease to renew"
        );
        assert_eq!(
            apply(&mut set, Op::Erase, d(12), facts(300, me)),
            (Outcome::Held(true), true)
        );
        assert_eq!(digests(&set), [Some(10), None]);
    }

    #[test]
    fn replacement_matches_the_in_process_cursor() {
        let me = 1;
        let mut set = SetState::empty(4);
        let claim = |set: &mut SetState, n: u128| {
            apply(set, Op::Claim, Digest::from_u128(n), facts(0, me)).0
        };
        for n in 1..=4 {
            assert_eq!(claim(&mut set, n), Outcome::Claim(Claim::New));
        }
        // Full: the cursor (slot 0) is replaced, then slot 1; a hit changes nothing.
        claim(&mut set, 5);
        assert_eq!(claim(&mut set, 3), Outcome::Claim(Claim::InFlight));
        claim(&mut set, 6);
        assert_eq!(digests(&set), [Some(5), Some(6), Some(3), Some(4)]);
        assert_eq!(set.cursor, 2);
        // An erased slot is refilled first and keeps its place in the rotation: 7 goes into
        // slot 0, and the next eviction still takes slot 2 (digest 3).
        apply(&mut set, Op::Erase, Digest::from_u128(5), facts(0, me));
        claim(&mut set, 7);
        assert_eq!(digests(&set), [Some(7), Some(6), Some(3), Some(4)]);
        claim(&mut set, 8);
        assert_eq!(digests(&set), [Some(7), Some(6), Some(8), Some(4)]);
        assert_eq!(set.cursor, 3);
    }
}
