//! A set's value as the set script (`set.lua`) reads and changes it, in Rust and without I/O:
//! for the path that decides a burst in the client and writes each set back whole with
//! `SET … IFEQ` (`ifeq`). Every rule is the script's, byte for byte: what a stored value
//! must look like to be read as a set (its length and header only), where a digest's entry is
//! found, which slot a new digest takes, and the bytes each operation writes. So a set changed
//! here holds exactly what the script would have left in it, and clients of both paths share
//! one table.
//!
//! The layout (`set.lua` has it too): a 3-byte header (version, cursor, ways), then one
//! 34-byte entry per slot that holds or held a digest (slot, digest, state 1 in flight or 2
//! done, time, owner), the entry of slot `i` at byte `3 + 34 i`; slots fill in order, so a
//! set grows by one entry until it is full. An erased entry keeps its slot byte, then 16 bytes
//! 0xFF and 17 zeros; a header of zeros is a set that a commit's write made in a key that held
//! nothing (`commit`), read as cursor 0.

use super::entry::{ENTRY_BYTES, HEADER_BYTES};
use super::Op;
use crate::dedup::Digest;

/// The digest field of an erased entry: a digest no message has.
const FREE: [u8; 16] = [0xFF; 16];

/// What a decision needs besides the set: the time, the lease, who we are, the table's shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Facts {
    pub(super) now_ms: u64,
    /// When a claim made now lets its lease lapse.
    pub(super) lease_until_ms: u64,
    pub(super) owner: u64,
    /// Done entries committed longer ago than this count as not seen.
    pub(super) max_age_ms: Option<u64>,
    pub(super) ways: u8,
    /// The value format written: 1, or 2 with commit times (`value_version`).
    pub(super) version: u8,
}

impl Facts {
    /// Bytes of a full set.
    fn size(&self) -> usize {
        HEADER_BYTES + ENTRY_BYTES * usize::from(self.ways)
    }

    /// The state and time of an entry made done now: the commit's time with `max_age`.
    fn done(&self) -> [u8; 9] {
        let mut done = [0u8; 9];
        done[0] = 2;
        let time = if self.max_age_ms.is_some() {
            self.now_ms
        } else {
            0
        };
        done[1..].copy_from_slice(&time.to_be_bytes());
        done
    }

    /// The state, time and owner a claim of `op` writes into its entry: in flight with this
    /// owner's lease, or done at once (`Op::ClaimDone`).
    fn claimed(&self, op: Op) -> [u8; 17] {
        let mut claimed = [0u8; 17];
        if op == Op::ClaimDone {
            claimed[..9].copy_from_slice(&self.done());
        } else {
            claimed[0] = 1;
            claimed[1..9].copy_from_slice(&self.lease_until_ms.to_be_bytes());
        }
        claimed[9..].copy_from_slice(&self.owner.to_be_bytes());
        claimed
    }
}

/// How the script reads what a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// A set of this table's ways in a known format.
    Set,
    /// A set whose header is zeros (read as version 0, cursor 0).
    ZeroHeader,
    /// Nothing, or a value that is not a set of this shape: read as a set with no entry.
    Empty,
}

/// How the script reads `stored` (`readable` and `read` in `set.lua`): checked by its length
/// and header only.
pub(super) fn shape(stored: Option<&[u8]>, facts: &Facts) -> Shape {
    let Some(value) = stored else {
        return Shape::Empty;
    };
    let n = value.len();
    if n < HEADER_BYTES || n > facts.size() || !(n - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
        return Shape::Empty;
    }
    match value[..3] {
        [0, 0, 0] => Shape::ZeroHeader,
        [v, cursor, w] if (v == 1 || v == 2) && cursor < facts.ways && w == facts.ways => {
            Shape::Set
        }
        _ => Shape::Empty,
    }
}

/// What a key holds as one burst's operations leave it: the bytes the script's writes would
/// have left there, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored(pub(super) Option<Vec<u8>>);

impl Stored {
    /// The set as the script reads it: the stored bytes (a header of zeros read as version 0,
    /// cursor 0 of this table's ways), or an empty set's header.
    fn view(&self, facts: &Facts) -> Vec<u8> {
        match (&self.0, shape(self.0.as_deref(), facts)) {
            (Some(value), Shape::Set) => value.clone(),
            (Some(value), Shape::ZeroHeader) => {
                let mut value = value.clone();
                value[2] = facts.ways;
                value
            }
            _ => vec![facts.version, 0, facts.ways],
        }
    }

    /// `SETRANGE` of `bytes` at `offset`: zeros pad a value shorter than the offset.
    fn set_range(&mut self, offset: usize, bytes: &[u8]) {
        let value = self.0.get_or_insert_with(Vec::new);
        if value.len() < offset + bytes.len() {
            value.resize(offset + bytes.len(), 0);
        }
        value[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// The script's `write`: `bytes` at `offset`, and the header's version when the set's
    /// (`version` as read) differs: the whole header over a header of zeros.
    fn write(&mut self, facts: &Facts, version: u8, offset: usize, bytes: &[u8]) {
        self.set_range(offset, bytes);
        if version == 0 {
            self.set_range(0, &[facts.version, 0, facts.ways]);
        } else if version != facts.version {
            self.set_range(0, &[facts.version]);
        }
    }
}

/// Where the entry of `digest` starts in `value` (0-based), if it holds one: the first slot
/// whose digest field is `digest` and whose state is not zero.
fn locate(value: &[u8], digest: &[u8; 16]) -> Option<usize> {
    slots(value).find(|&at| value[at + 1..at + 17] == digest[..] && value[at + 17] != 0)
}

/// The start (0-based) of each slot of `value`.
fn slots(value: &[u8]) -> impl Iterator<Item = usize> + '_ {
    (HEADER_BYTES..value.len())
        .step_by(ENTRY_BYTES)
        .filter(move |at| at + ENTRY_BYTES <= value.len())
}

/// The slot index of the entry that starts at `at`.
fn slot_of(at: usize) -> i64 {
    ((at - HEADER_BYTES) / ENTRY_BYTES) as i64
}

/// Applies `op` for `digest` to the set `stored`, as the script does: its answer, and whether
/// it wrote. A claim answers 0 (new), 1 (in flight) or 2 (duplicate), plus 4 times the slot of
/// the digest's entry; a commit, erase or renew 1 (held) or 0.
pub(super) fn apply(stored: &mut Stored, op: Op, digest: Digest, facts: &Facts) -> (i64, bool) {
    let digest = digest.to_bytes();
    let value = stored.view(facts);
    let version = value[0];
    let claiming = matches!(op, Op::Claim | Op::ClaimDone);
    let Some(at) = locate(&value, &digest) else {
        if !claiming {
            return (0, false);
        }
        return (4 * insert(stored, &value, op, &digest, facts), true);
    };
    let slot = 4 * slot_of(at);
    let state = value[at + 17];
    let mut time = [0u8; 8];
    time.copy_from_slice(&value[at + 18..at + 26]);
    let time = u64::from_be_bytes(time);
    if claiming {
        if state == 2 {
            // As the script's numbers: a commit time after now is not older than max_age.
            let expired = time != 0
                && facts.max_age_ms.is_some_and(|max| {
                    i128::from(facts.now_ms) - i128::from(time) > i128::from(max)
                });
            if !expired {
                return (slot + 2, false);
            }
        } else if time > facts.now_ms {
            return (slot + 1, false);
        }
        // Committed longer ago than max_age, or a lease that lapsed: claimed anew in its slot.
        stored.write(facts, version, at + 17, &facts.claimed(op));
        return (slot, true);
    }
    if op == Op::Commit && state == 2 {
        return (1, false);
    }
    if value[at + 26..at + 34] != facts.owner.to_be_bytes() {
        return (0, false);
    }
    match op {
        Op::Commit => stored.write(facts, version, at + 17, &facts.done()),
        Op::Erase => {
            let mut erased = [0u8; ENTRY_BYTES - 1];
            erased[..16].copy_from_slice(&FREE);
            stored.set_range(at + 1, &erased);
        }
        _ => {
            if state != 1 {
                return (0, false);
            }
            stored.write(facts, version, at + 17, &facts.claimed(Op::Claim));
        }
    }
    (1, true)
}

/// Claims `digest` where the set (`value` as read) does not hold it: the first slot an erase
/// emptied, else a new slot at the end, else the cursor's, which moves on. Returns the slot.
fn insert(stored: &mut Stored, value: &[u8], op: Op, digest: &[u8; 16], facts: &Facts) -> i64 {
    let mut entry = [0u8; ENTRY_BYTES];
    entry[1..17].copy_from_slice(digest);
    entry[17..].copy_from_slice(&facts.claimed(op));
    if let Some(at) = slots(value).find(|&at| value[at + 1..at + 17] == FREE && value[at + 17] == 0)
    {
        entry[0] = slot_of(at) as u8;
        stored.write(facts, value[0], at, &entry);
        return slot_of(at);
    }
    let n = value.len();
    if n < facts.size() {
        // The set grows: written whole, from what was read (an empty set's header for a value
        // that was not a set).
        let slot = slot_of(n);
        entry[0] = slot as u8;
        let mut grown = Vec::with_capacity(n + ENTRY_BYTES);
        grown.push(facts.version);
        grown.extend_from_slice(&value[1..]);
        grown.extend_from_slice(&entry);
        stored.0 = Some(grown);
        return slot;
    }
    // Full: the cursor's slot, written with the header that moves the cursor on.
    let cursor = value[1];
    entry[0] = cursor;
    let at = HEADER_BYTES + ENTRY_BYTES * usize::from(cursor);
    let mut header = Vec::with_capacity(at + ENTRY_BYTES);
    header.extend_from_slice(&[facts.version, (cursor + 1) % facts.ways, facts.ways]);
    header.extend_from_slice(&value[HEADER_BYTES..at]);
    header.extend_from_slice(&entry);
    stored.set_range(0, &header);
    i64::from(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u64 = 0x0101_0101_0101_0101;
    const OTHER: u64 = 0x0202_0202_0202_0202;

    fn facts(now_ms: u64, owner: u64, ways: u8) -> Facts {
        Facts {
            now_ms,
            lease_until_ms: now_ms + 100,
            owner,
            max_age_ms: None,
            ways,
            version: 1,
        }
    }

    fn d(n: u8) -> Digest {
        Digest::from_bytes([n; 16])
    }

    /// An entry as the script writes it.
    fn entry(slot: u8, digest: u8, state: u8, time: u64, owner: u64) -> Vec<u8> {
        let mut entry = vec![slot];
        entry.extend_from_slice(&[digest; 16]);
        entry.push(state);
        entry.extend_from_slice(&time.to_be_bytes());
        entry.extend_from_slice(&owner.to_be_bytes());
        entry
    }

    fn set(header: [u8; 3], entries: &[Vec<u8>]) -> Stored {
        let mut value = header.to_vec();
        for entry in entries {
            value.extend_from_slice(entry);
        }
        Stored(Some(value))
    }

    #[test]
    fn a_set_grows_by_one_entry_then_replaces_its_cursors() {
        let at = facts(1_000, ME, 2);
        let mut stored = Stored(None);
        assert_eq!(apply(&mut stored, Op::Claim, d(1), &at), (0, true));
        assert_eq!(stored, set([1, 0, 2], &[entry(0, 1, 1, 1_100, ME)]));
        // The second digest takes slot 1 (answer 4 × 1 + new).
        assert_eq!(apply(&mut stored, Op::Claim, d(2), &at), (4, true));
        // Full: the third takes the cursor's slot 0, and the cursor moves on.
        assert_eq!(apply(&mut stored, Op::Claim, d(3), &at), (0, true));
        assert_eq!(
            stored,
            set(
                [1, 1, 2],
                &[entry(0, 3, 1, 1_100, ME), entry(1, 2, 1, 1_100, ME)]
            )
        );
        // Found in flight in slot 1, by anyone: 4 × 1 + in flight; nothing written.
        let other = facts(1_050, OTHER, 2);
        assert_eq!(apply(&mut stored, Op::Claim, d(2), &other), (5, false));
    }

    #[test]
    fn commits_erases_and_renews_keep_to_their_owner() {
        let (me, other) = (facts(1_000, ME, 4), facts(1_010, OTHER, 4));
        let mut stored = Stored(None);
        apply(&mut stored, Op::Claim, d(1), &me);
        apply(&mut stored, Op::Claim, d(2), &me);
        assert_eq!(apply(&mut stored, Op::Commit, d(1), &other), (0, false));
        assert_eq!(apply(&mut stored, Op::Renew, d(1), &other), (0, false));
        assert_eq!(apply(&mut stored, Op::Erase, d(1), &other), (0, false));
        assert_eq!(apply(&mut stored, Op::Commit, d(1), &me), (1, true));
        assert_eq!(
            apply(&mut stored, Op::Commit, d(1), &other),
            (1, false),
            "done by anyone"
        );
        assert_eq!(
            apply(&mut stored, Op::Renew, d(1), &me),
            (0, false),
            "no lease"
        );
        assert_eq!(
            apply(&mut stored, Op::Claim, d(1), &other),
            (2, false),
            "duplicate"
        );
        let renewed = facts(1_050, ME, 4);
        assert_eq!(apply(&mut stored, Op::Renew, d(2), &renewed), (1, true));
        assert_eq!(
            apply(&mut stored, Op::Commit, d(9), &me),
            (0, false),
            "absent"
        );
        assert_eq!(
            stored,
            set(
                [1, 0, 4],
                &[entry(0, 1, 2, 0, ME), entry(1, 2, 1, 1_150, ME)]
            )
        );
        // An erase marks the slot, which the next new digest takes before the set grows.
        assert_eq!(apply(&mut stored, Op::Erase, d(1), &me), (1, true));
        let mut erased = vec![0u8];
        erased.extend_from_slice(&FREE);
        erased.extend_from_slice(&[0; 17]);
        assert_eq!(stored, set([1, 0, 4], &[erased, entry(1, 2, 1, 1_150, ME)]));
        assert_eq!(apply(&mut stored, Op::Claim, d(1), &other), (0, true));
        assert_eq!(
            stored,
            set(
                [1, 0, 4],
                &[entry(0, 1, 1, 1_110, OTHER), entry(1, 2, 1, 1_150, ME)]
            )
        );
    }

    #[test]
    fn lapsed_leases_and_old_commits_are_claimed_anew_in_their_slot() {
        let mut stored = Stored(None);
        apply(&mut stored, Op::Claim, d(1), &facts(1_000, ME, 2));
        // At the end of the lease, another owner takes the entry over.
        assert_eq!(
            apply(&mut stored, Op::Claim, d(1), &facts(1_099, OTHER, 2)),
            (1, false)
        );
        assert_eq!(
            apply(&mut stored, Op::Claim, d(1), &facts(1_100, OTHER, 2)),
            (0, true)
        );
        assert_eq!(stored, set([1, 0, 2], &[entry(0, 1, 1, 1_200, OTHER)]));
        // With max_age, a commit's time is kept (format 2), and a claim after it is new.
        let timed = |now_ms| Facts {
            max_age_ms: Some(500),
            version: 2,
            ..facts(now_ms, OTHER, 2)
        };
        assert_eq!(
            apply(&mut stored, Op::Commit, d(1), &timed(1_150)),
            (1, true)
        );
        assert_eq!(stored, set([2, 0, 2], &[entry(0, 1, 2, 1_150, OTHER)]));
        assert_eq!(
            apply(&mut stored, Op::Claim, d(1), &timed(1_650)),
            (2, false)
        );
        assert_eq!(
            apply(&mut stored, Op::ClaimDone, d(1), &timed(1_651)),
            (0, true)
        );
        assert_eq!(stored, set([2, 0, 2], &[entry(0, 1, 2, 1_651, OTHER)]));
    }

    #[test]
    fn values_are_read_by_their_length_and_header_as_the_script_reads_them() {
        let at = facts(1_000, ME, 2);
        let one = set([1, 0, 2], &[entry(0, 1, 2, 0, OTHER)]).0.unwrap();
        assert_eq!(shape(Some(&one), &at), Shape::Set);
        assert_eq!(shape(None, &at), Shape::Empty);
        assert_eq!(shape(Some(&one[..36]), &at), Shape::Empty, "short");
        assert_eq!(shape(Some(b"hello"), &at), Shape::Empty);
        assert_eq!(
            shape(Some(&one), &facts(1_000, ME, 4)),
            Shape::Empty,
            "ways"
        );
        let mut zeros = one.clone();
        zeros[..3].copy_from_slice(&[0, 0, 0]);
        assert_eq!(shape(Some(&zeros), &at), Shape::ZeroHeader);
        // Not a set: a claim writes a set of its one entry over it.
        let mut stored = Stored(Some(b"hello".to_vec()));
        assert_eq!(apply(&mut stored, Op::Claim, d(1), &at), (0, true));
        assert_eq!(stored, set([1, 0, 2], &[entry(0, 1, 1, 1_100, ME)]));
        // A header of zeros (a commit's write into a key that held nothing) is cursor 0; the
        // first write through it writes the whole header, an erase none.
        let mut stored = Stored(Some(zeros.clone()));
        assert_eq!(apply(&mut stored, Op::Claim, d(1), &at), (2, false));
        assert_eq!(
            apply(&mut stored, Op::Erase, d(1), &facts(1_000, OTHER, 2)),
            (1, true)
        );
        assert_eq!(stored.0.as_ref().unwrap()[..3], [0, 0, 0]);
        let mut stored = Stored(Some(zeros));
        assert_eq!(apply(&mut stored, Op::Claim, d(2), &at), (4, true));
        assert_eq!(
            stored,
            set(
                [1, 0, 2],
                &[entry(0, 1, 2, 0, OTHER), entry(1, 2, 1, 1_100, ME)]
            )
        );
        // A set of format 1 written by a store with max_age gets its version byte.
        let mut stored = Stored(Some(one));
        let timed = Facts {
            max_age_ms: Some(500),
            version: 2,
            ..at
        };
        assert_eq!(apply(&mut stored, Op::Claim, d(2), &timed), (4, true));
        assert_eq!(stored.0.as_ref().unwrap()[..3], [2, 0, 2]);
    }
}
