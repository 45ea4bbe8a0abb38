//! The compact layout of a shared table (Memcached's key format 2, Redis's key format 3), in
//! one store-neutral model with no I/O: several consecutive sets of the table in one stored
//! value (a Memcached item, a Redis key), each entry an 8-byte fingerprint (and, when done
//! entries expire, the second of its commit), and a lease's owner and expiry kept only while
//! its entry is in flight. How an operation changes an item ([`apply`]) and the value's bytes
//! ([`encode_into`], [`decode`]). Each store reads a value, applies operations here and writes
//! the result back with its own compare-and-set. The stores apply them to the value's bytes in
//! place ([`Edit`], `compact/edit.rs`); the decoded [`ItemState`] is the model those edits are
//! tested against, and [`apply`] makes the same decisions on both ([`Slots`]).
//!
//! The value, big-endian, in one of two forms. The full form holds every slot:
//!
//! ```text
//! offset 0   u8    value format: 3 = untimed, 4 = timed (done entries carry their second)
//! offset 1   u8    sets in this item, s (the last item of a table may have fewer)
//! offset 2   u8    ways of each set, w
//! offset 3   u8    in-flight records, m
//! offset 4   s bytes: each set's cursor, the slot its next eviction replaces (below w)
//! then       s × w slots, set after set, each
//!              u64   fingerprint: the digest's low half (0 = an empty slot; a low half of 0
//!                    is stored as 1)
//!              u32   (timed only) done: the Unix second of its commit, 0 = never expires;
//!                    in flight: 0
//! then       m records of the entries in flight (and of those claimed done at once, while
//!            their lease lasts), 17 bytes each
//!              u8    slot (set × w + way)
//!              u64   lease expiry, milliseconds since the Unix epoch; its top bit set for
//!                    an entry claimed done at once
//!              u64   owner: the random id of the store instance that claimed it
//! ```
//!
//! The short form, for an item that is still filling, holds each set's slots only up to its
//! last occupied one (a set fills from its first slot, so that is how many it holds until it
//! is full or an erase empties one):
//!
//! ```text
//! offset 0   u8    value format: 5 = untimed, 6 = timed
//! offset 1   u8    s, as above
//! offset 2   u8    w
//! offset 3   u8    m
//! offset 4   s bytes: each set's cursor
//! then       s bytes: each set's length l, the slots it holds (at most w); the slots from
//!            l on are empty
//! then       each set's l slots, set after set, as above
//! then       m records, as above
//! ```
//!
//! An item is written in whichever form is shorter, the full form when they tie: so an item
//! of a filling table costs memcached its occupied slots alone (an item's first entry 45 bytes
//! where the full form takes 541 at 64 slots), and an item whose sets are all full is written
//! as it always was (the memory of a full table does not change). Every reader takes both.
//!
//! A slot with a record of an entry in flight is in flight; any other is done. So a done entry
//! costs 8 bytes (12 timed), and an entry in flight 17 more while it is in flight. The set is picked by the
//! digest's high half ([`Geometry::set_of`](crate::dedup::Geometry::set_of)), the fingerprint
//! is the low half: two digests of one set are told apart by 64 bits, so a message is taken
//! for another one with a chance of about `ways` in 2^64 a claim.
//!
//! Two rules differ from the 34-byte entries (Memcached's format 1, `memcached/set.rs`), both for the bytes a
//! done entry would otherwise keep. A committed entry has no owner, so it is final: an erase
//! answers `false` for it, whoever asks (erase is for a claim whose processing failed). An
//! entry claimed done at once keeps its claimer's record until its lease ends, so that a
//! handler that declared its message final and failed all the same can erase it for the
//! retry; after that it is final too, and the record goes with the item's next write. And a
//! done entry's time is a whole second, so `max_age` is counted up to a second long, never
//! short.

use crate::dedup::{Claim, Digest, Geometry};

mod edit;

#[cfg(feature = "redis")]
pub(crate) use edit::decodes;
#[cfg(feature = "redis")]
pub(crate) use edit::is_as_written;
pub(crate) use edit::Edit;

/// What one operation does to the entry of its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim,
    /// A claim whose new entry is written done, as a claim then a commit would leave it:
    /// for a handler whose accepted message is final.
    ClaimDone,
    Commit,
    Erase,
    Renew,
}

/// The answer of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Claim(Claim),
    Held(bool),
}

/// What a decision needs to know besides the stored value: the time, the lease, who we are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseFacts {
    pub(crate) now_ms: u64,
    pub(crate) lease_until_ms: u64,
    pub(crate) owner: u64,
    /// Done entries committed longer ago than this count as not seen.
    pub(crate) max_age_ms: Option<u64>,
}

/// The facts the tests decide by: `owner` at `now_ms`, a lease of 100 ms, no `max_age`.
#[cfg(test)]
pub(crate) fn test_facts(now_ms: u64, owner: u64) -> LeaseFacts {
    LeaseFacts {
        now_ms,
        lease_until_ms: now_ms + 100,
        owner,
        max_age_ms: None,
    }
}

/// The value format without times: done entries never expire.
pub(crate) const COMPACT_UNTIMED: u8 = 3;

/// The value format with the second of each done entry's commit (written with `max_age`).
pub(crate) const COMPACT_TIMED: u8 = 4;

/// The value format a store writes: timed when done entries expire (`max_age`).
pub(crate) const fn version(timed: bool) -> u8 {
    if timed {
        COMPACT_TIMED
    } else {
        COMPACT_UNTIMED
    }
}

/// The short form of [`COMPACT_UNTIMED`] and [`COMPACT_TIMED`]: each set's slots up to its
/// last occupied one (see the module docs). The short format is the full one plus this.
const SHORT: u8 = 2;

/// Bytes before the cursors: format, sets, ways, in-flight records.
const HEADER_BYTES: usize = 4;

/// Bytes of one in-flight record: slot, lease expiry, owner.
pub(crate) const FLIGHT_BYTES: usize = 17;

/// Bytes of one slot: a fingerprint, and in the timed format a second.
pub(crate) const fn slot_bytes(timed: bool) -> usize {
    if timed {
        12
    } else {
        8
    }
}

/// The most slots an item has: a slot's number, and the count of records, are a byte.
pub(crate) const MAX_SLOTS: usize = 255;

/// Whole sets of `ways` ways an item of `slots` slots holds, at least one: a store's item or
/// key holds that many consecutive sets, the last item of a table fewer.
pub(crate) fn sets_per_item(slots: u32, ways: u32) -> u64 {
    u64::from((slots / ways.max(1)).max(1))
}

/// How many sets item `item` holds in a table of `geometry` whose items hold `per` sets
/// each: `per`, or fewer for the last item. At most `per`, which fits a byte.
pub(crate) fn sets_in(item: u64, per: u64, geometry: Geometry) -> usize {
    geometry.sets().saturating_sub(item * per).min(per) as usize
}

/// The value's length for an item of `sets` sets of `ways` ways and `flights` entries in
/// flight.
pub(crate) const fn value_bytes(sets: usize, ways: usize, flights: usize, timed: bool) -> usize {
    HEADER_BYTES + sets + sets * ways * slot_bytes(timed) + flights * FLIGHT_BYTES
}

/// The fingerprint a digest is held by in its set.
pub(crate) fn fingerprint(digest: Digest) -> u64 {
    digest.lo().max(1)
}

/// One slot: the fingerprint of its entry (0: empty) and its commit's second (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Slot {
    fingerprint: u64,
    done_s: u32,
}

/// The lease of an entry in flight, or of one claimed done at once (`done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flight {
    slot: u8,
    lease_until_ms: u64,
    owner: u64,
    done: bool,
}

/// The top bit of a record's lease field: the entry was claimed done at once.
const DONE_BIT: u64 = 1 << 63;

/// One item: its sets' cursors, slots and in-flight leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ItemState {
    ways: usize,
    cursors: Vec<u8>,
    slots: Vec<Slot>,
    flights: Vec<Flight>,
}

impl ItemState {
    /// An item of `sets` empty sets of `ways` ways (`sets × ways` at most [`MAX_SLOTS`]).
    pub(crate) fn empty(sets: usize, ways: usize) -> Self {
        ItemState {
            ways,
            cursors: vec![0; sets],
            slots: vec![Slot::default(); sets * ways],
            flights: Vec::new(),
        }
    }

    /// How many entries are in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.flights.len()
    }
}

/// An item's slots, cursors and in-flight records as [`apply`] reads and changes them: decoded
/// ([`ItemState`], the model) or in its value's bytes ([`Edit`]). Slots are numbered as in the
/// value, `set × ways + way`; a slot that is not held reads as empty.
pub(crate) trait Slots {
    /// Ways of each set.
    fn ways(&self) -> usize;
    /// The way of set `set` whose fingerprint is `print` (never 0).
    fn find(&self, set: usize, print: u64) -> Option<usize>;
    /// The first empty way of set `set`.
    fn first_empty(&self, set: usize) -> Option<usize>;
    fn slot(&self, at: usize) -> Slot;
    fn set_slot(&mut self, at: usize, slot: Slot);
    fn cursor(&self, set: usize) -> u8;
    fn set_cursor(&mut self, set: usize, cursor: u8);
    /// The record of slot `at`, and its place among the records.
    fn flight(&self, at: usize) -> Option<(usize, Flight)>;
    /// Replaces record `i`'s lease expiry (its other fields stay).
    fn set_lease(&mut self, i: usize, lease_until_ms: u64);
    /// Drops slot `at`'s record, if any: the last record takes its place.
    fn land(&mut self, at: usize);
    /// Gives slot `flight.slot` the record `flight`: in place of its record, else last.
    fn fly(&mut self, flight: Flight);
    /// Drops the records for which `keep` is false, the others keeping their order.
    fn retain(&mut self, keep: impl FnMut(&Flight) -> bool);
}

impl Slots for ItemState {
    fn ways(&self) -> usize {
        self.ways
    }

    fn find(&self, set: usize, print: u64) -> Option<usize> {
        self.slots[set * self.ways..(set + 1) * self.ways]
            .iter()
            .position(|slot| slot.fingerprint == print)
    }

    fn first_empty(&self, set: usize) -> Option<usize> {
        self.find(set, 0)
    }

    fn slot(&self, at: usize) -> Slot {
        self.slots[at]
    }

    fn set_slot(&mut self, at: usize, slot: Slot) {
        self.slots[at] = slot;
    }

    fn cursor(&self, set: usize) -> u8 {
        self.cursors[set]
    }

    fn set_cursor(&mut self, set: usize, cursor: u8) {
        self.cursors[set] = cursor;
    }

    fn flight(&self, at: usize) -> Option<(usize, Flight)> {
        self.flights
            .iter()
            .position(|f| usize::from(f.slot) == at)
            .map(|i| (i, self.flights[i]))
    }

    fn set_lease(&mut self, i: usize, lease_until_ms: u64) {
        self.flights[i].lease_until_ms = lease_until_ms;
    }

    fn land(&mut self, at: usize) {
        if let Some((i, _)) = self.flight(at) {
            self.flights.swap_remove(i);
        }
    }

    fn fly(&mut self, flight: Flight) {
        match self.flight(usize::from(flight.slot)) {
            Some((i, _)) => self.flights[i] = flight,
            None => self.flights.push(flight),
        }
    }

    fn retain(&mut self, keep: impl FnMut(&Flight) -> bool) {
        self.flights.retain(keep);
    }
}

/// The second stored for an entry made done now: its commit's when done entries expire
/// (`max_age`), else 0.
fn done_second(facts: LeaseFacts) -> u32 {
    if facts.max_age_ms.is_some() {
        u32::try_from(facts.now_ms / 1_000)
            .unwrap_or(u32::MAX)
            .max(1)
    } else {
        0
    }
}

/// Applies `op` for `digest`, which belongs to set `set` of the item (its number within the
/// item). Returns the answer and whether the item changed (and must be written).
///
/// Replacement within the set is the in-process table's, as in `memcached/set.rs`: a new digest takes
/// the first empty slot, else the slot at the cursor, and the cursor moves on by one.
pub(crate) fn apply(
    item: &mut impl Slots,
    set: usize,
    op: Op,
    digest: Digest,
    facts: LeaseFacts,
) -> (Outcome, bool) {
    let ways = item.ways();
    let first = set * ways;
    let print = fingerprint(digest);
    let Some(at) = item.find(set, print).map(|way| first + way) else {
        return match op {
            Op::Claim | Op::ClaimDone => {
                let way = match item.first_empty(set) {
                    Some(empty) => empty,
                    None => {
                        let victim = usize::from(item.cursor(set)) % ways;
                        item.set_cursor(set, ((victim + 1) % ways) as u8);
                        victim
                    }
                };
                let at = first + way;
                // The entry pushed out takes its lease with it.
                item.land(at);
                claim_into(item, at, op, print, facts);
                prune(item, facts.now_ms);
                (Outcome::Claim(Claim::New), true)
            }
            Op::Commit | Op::Erase | Op::Renew => (Outcome::Held(false), false),
        };
    };
    let (outcome, changed) = match item.flight(at) {
        Some((i, flight)) if !flight.done => in_flight(item, (at, i, flight), op, print, facts),
        claimed_done => done(item, at, claimed_done.map(|(_, f)| f), op, print, facts),
    };
    if changed {
        prune(item, facts.now_ms);
    }
    (outcome, changed)
}

/// [`apply`] to the entry in flight in slot `at`, whose record is the `i`th, `flight`.
fn in_flight(
    item: &mut impl Slots,
    (at, i, flight): (usize, usize, Flight),
    op: Op,
    print: u64,
    facts: LeaseFacts,
) -> (Outcome, bool) {
    let mine = flight.owner == facts.owner;
    match op {
        Op::Claim | Op::ClaimDone if flight.lease_until_ms > facts.now_ms => {
            (Outcome::Claim(Claim::InFlight), false)
        }
        Op::Claim | Op::ClaimDone => {
            // The owner let the lease lapse: take the entry over, in its slot.
            item.land(at);
            claim_into(item, at, op, print, facts);
            (Outcome::Claim(Claim::New), true)
        }
        Op::Commit if mine => {
            item.land(at);
            let slot = item.slot(at);
            item.set_slot(
                at,
                Slot {
                    done_s: done_second(facts),
                    ..slot
                },
            );
            (Outcome::Held(true), true)
        }
        Op::Erase if mine => {
            item.land(at);
            item.set_slot(at, Slot::default());
            (Outcome::Held(true), true)
        }
        Op::Renew if mine => {
            item.set_lease(i, facts.lease_until_ms & !DONE_BIT);
            (Outcome::Held(true), true)
        }
        Op::Commit | Op::Erase | Op::Renew => (Outcome::Held(false), false),
    }
}

/// [`apply`] to the done entry in slot `at`; `claimed_done` is its record when it was claimed
/// done at once and the record is still there.
fn done(
    item: &mut impl Slots,
    at: usize,
    claimed_done: Option<Flight>,
    op: Op,
    print: u64,
    facts: LeaseFacts,
) -> (Outcome, bool) {
    let done_s = item.slot(at).done_s;
    // Whole seconds: counted from the end of the commit's second, so never short.
    let expired = done_s != 0
        && facts.max_age_ms.is_some_and(|max| {
            facts.now_ms.saturating_sub(u64::from(done_s) * 1_000) > max + 1_000
        });
    // Its claimer's, claimed done at once, while its lease lasts.
    let erasable = claimed_done
        .is_some_and(|flight| flight.owner == facts.owner && flight.lease_until_ms > facts.now_ms);
    match op {
        Op::Claim | Op::ClaimDone if expired => {
            // Committed longer ago than `max_age`: claim it anew, in its slot.
            item.land(at);
            claim_into(item, at, op, print, facts);
            (Outcome::Claim(Claim::New), true)
        }
        Op::Claim | Op::ClaimDone => (Outcome::Claim(Claim::Duplicate), false),
        // A repeated commit is harmless, whoever sends it.
        Op::Commit => (Outcome::Held(true), false),
        Op::Erase if erasable => {
            item.land(at);
            item.set_slot(at, Slot::default());
            (Outcome::Held(true), true)
        }
        // Otherwise a done entry is final, and has no lease.
        Op::Erase | Op::Renew => (Outcome::Held(false), false),
    }
}

/// Drops the records of entries claimed done whose lease ended by `now_ms`: they go with the
/// item's next write.
fn prune(item: &mut impl Slots, now_ms: u64) {
    item.retain(|f| !f.done || f.lease_until_ms > now_ms);
}

/// Writes the claim `op` of the entry `print` into slot `at`: in flight with this owner's
/// lease, or done at once.
fn claim_into(item: &mut impl Slots, at: usize, op: Op, print: u64, facts: LeaseFacts) {
    let done = op == Op::ClaimDone;
    item.set_slot(
        at,
        Slot {
            fingerprint: print,
            done_s: if done { done_second(facts) } else { 0 },
        },
    );
    item.fly(Flight {
        // Below MAX_SLOTS, so a byte.
        slot: at as u8,
        lease_until_ms: facts.lease_until_ms & !DONE_BIT,
        owner: facts.owner,
        done,
    });
}

/// How many slots set `set` holds in the short form: up to its last occupied one.
fn held_len(item: &ItemState, set: usize) -> usize {
    let first = set * item.ways;
    item.slots[first..first + item.ways]
        .iter()
        .rposition(|slot| slot.fingerprint != 0)
        .map_or(0, |way| way + 1)
}

/// Encodes an item (see the module docs) in format `version` ([`COMPACT_UNTIMED`] or
/// [`COMPACT_TIMED`]) into `out`, replacing what it held: in the short form when that is
/// shorter than the full one.
pub(crate) fn encode_into(item: &ItemState, version: u8, out: &mut Vec<u8>) {
    let timed = version == COMPACT_TIMED;
    let width = slot_bytes(timed);
    let sets = item.cursors.len();
    // Each set's length in the short form, found once: at most `ways`, so a byte, and at
    // most MAX_SLOTS sets.
    let mut lengths = [0u8; MAX_SLOTS];
    let lengths = &mut lengths[..sets];
    for (set, len) in lengths.iter_mut().enumerate() {
        *len = held_len(item, set) as u8;
    }
    let held: usize = lengths.iter().map(|&len| usize::from(len)).sum();
    let full = value_bytes(sets, item.ways, item.flights.len(), timed);
    let short = full - (sets * item.ways - held) * width + sets;
    let short_form = short < full;
    out.clear();
    out.reserve(full.min(short));
    // At most MAX_SLOTS slots: the counts each fit in a byte.
    out.push(if short_form { version + SHORT } else { version });
    out.push(sets as u8);
    out.push(item.ways as u8);
    out.push(item.flights.len() as u8);
    out.extend_from_slice(&item.cursors);
    if short_form {
        out.extend_from_slice(lengths);
    }
    // The slots and records are written into place, a field at a time, in one pass each.
    let at = out.len();
    out.resize(full.min(short), 0);
    let (slots_out, records_out) =
        out[at..].split_at_mut((if short_form { held } else { sets * item.ways }) * width);
    let mut slots_out = slots_out.chunks_exact_mut(width);
    for (set, &len) in lengths.iter().enumerate() {
        let first = set * item.ways;
        let len = if short_form {
            usize::from(len)
        } else {
            item.ways
        };
        // The slots first: `zip` asks its first iterator first, and must not take a place
        // of the next set once this set's slots are done.
        for (slot, raw) in item.slots[first..first + len]
            .iter()
            .zip(slots_out.by_ref())
        {
            raw[..8].copy_from_slice(&slot.fingerprint.to_be_bytes());
            if timed {
                raw[8..12].copy_from_slice(&slot.done_s.to_be_bytes());
            }
        }
    }
    for (raw, flight) in records_out
        .chunks_exact_mut(FLIGHT_BYTES)
        .zip(&item.flights)
    {
        raw[0] = flight.slot;
        let lease = flight.lease_until_ms | if flight.done { DONE_BIT } else { 0 };
        raw[1..9].copy_from_slice(&lease.to_be_bytes());
        raw[9..17].copy_from_slice(&flight.owner.to_be_bytes());
    }
}

/// Why a value could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Shorter or longer than its counts say.
    Length,
    /// Written by another format.
    Version(u8),
    /// Another count of sets or ways than the table's item has.
    Shape,
    /// A cursor outside its set, or a record of an empty, foreign or repeated slot.
    Slot(u8),
}

/// Decodes an item of `sets` sets of `ways` ways, in either form.
pub(crate) fn decode(value: &[u8], sets: usize, ways: usize) -> Result<ItemState, DecodeError> {
    let [version, held_sets, held_ways, flights, rest @ ..] = value else {
        return Err(DecodeError::Length);
    };
    let (timed, short) = match *version {
        COMPACT_UNTIMED => (false, false),
        COMPACT_TIMED => (true, false),
        v if v == COMPACT_UNTIMED + SHORT => (false, true),
        v if v == COMPACT_TIMED + SHORT => (true, true),
        other => return Err(DecodeError::Version(other)),
    };
    if usize::from(*held_sets) != sets || usize::from(*held_ways) != ways {
        return Err(DecodeError::Shape);
    }
    let flights = usize::from(*flights);
    let (cursors, rest) = rest.split_at_checked(sets).ok_or(DecodeError::Length)?;
    if let Some(&bad) = cursors.iter().find(|&&c| usize::from(c) >= ways) {
        return Err(DecodeError::Slot(bad));
    }
    let (lengths, rest) = if short {
        rest.split_at_checked(sets).ok_or(DecodeError::Length)?
    } else {
        (&[][..], rest)
    };
    if let Some(&bad) = lengths.iter().find(|&&len| usize::from(len) > ways) {
        return Err(DecodeError::Slot(bad));
    }
    let held = if short {
        lengths.iter().map(|&len| usize::from(len)).sum()
    } else {
        sets * ways
    };
    let width = slot_bytes(timed);
    if rest.len() != held * width + flights * FLIGHT_BYTES {
        return Err(DecodeError::Length);
    }
    let (slots, records) = rest.split_at(held * width);
    let mut slots = slots.chunks_exact(width).map(|raw| Slot {
        fingerprint: u64::from_be_bytes(array(&raw[..8])),
        done_s: if timed {
            u32::from_be_bytes(array(&raw[8..12]))
        } else {
            0
        },
    });
    let slots = if short {
        let mut all = Vec::with_capacity(sets * ways);
        for &len in lengths {
            all.extend(slots.by_ref().take(usize::from(len)));
            all.resize(all.len() + ways - usize::from(len), Slot::default());
        }
        all
    } else {
        slots.collect()
    };
    let mut item = ItemState {
        ways,
        cursors: cursors.to_vec(),
        slots,
        flights: Vec::with_capacity(flights + 1),
    };
    // The slots that have a record so far, a bit each: a repeated one is refused without a
    // search of the records before it.
    let mut recorded = [0u64; 4];
    for raw in records.chunks_exact(FLIGHT_BYTES) {
        let slot = raw[0];
        let held = item
            .slots
            .get(usize::from(slot))
            .is_some_and(|s| s.fingerprint != 0);
        let (word, bit) = (usize::from(slot / 64), 1u64 << (slot % 64));
        if !held || recorded[word] & bit != 0 {
            return Err(DecodeError::Slot(slot));
        }
        recorded[word] |= bit;
        let lease = u64::from_be_bytes(array(&raw[1..9]));
        item.flights.push(Flight {
            slot,
            lease_until_ms: lease & !DONE_BIT,
            owner: u64::from_be_bytes(array(&raw[9..17])),
            done: lease & DONE_BIT != 0,
        });
    }
    Ok(item)
}

/// The bytes of a fixed-size field, whose length the callers' ranges make exact.
fn array<const N: usize>(raw: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(raw);
    out
}

#[cfg(test)]
mod tests;
