//! An item of the compact layout changed in its value's bytes ([`Edit`]): an operation reads
//! and rewrites only its own set's slots, the item's in-flight records and a cursor, and
//! copies nothing else, where decoding the whole item into an [`ItemState`] and encoding it
//! back costs every slot of every set twice for each write.
//!
//! The decisions are [`apply`]'s, the same as on the decoded model; only where they read and
//! write differs. The value is kept as [`encode_into`] would write the item (its canonical
//! bytes), so a value edited here is byte for byte the one the model would write: the edits
//! keep the value's form (full or short) and, when the shorter form changes, the item is
//! decoded and encoded again (once, as an item fills up or an erase empties it). A value read
//! that is not already canonical in the format to write (another form than the shorter one,
//! the other value format, a set's last held slot empty, an empty slot with a second) is
//! decoded and changed on the model instead.

use super::{
    apply, decode, encode_into, DecodeError, Flight, ItemState, LeaseFacts, Op, Outcome, Slot,
    Slots, COMPACT_TIMED, DONE_BIT, FLIGHT_BYTES, HEADER_BYTES, MAX_SLOTS, SHORT,
};
use crate::dedup::Digest;

/// An item being changed by operations, and written once they are done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edit {
    /// The value format to write: [`COMPACT_UNTIMED`](super::COMPACT_UNTIMED), or
    /// [`COMPACT_TIMED`].
    version: u8,
    held: Held,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    /// The item's canonical value in format `version`, in either form.
    Bytes(Vec<u8>),
    /// The item decoded, for a value read that was not canonical.
    Model(ItemState),
}

impl Edit {
    /// An item of `sets` empty sets of `ways` ways, to be written in format `version`.
    pub(crate) fn empty(sets: usize, ways: usize, version: u8) -> Edit {
        if sets * ways == 0 {
            // No slot: the full form, as `encode_into` writes it.
            return Edit {
                version,
                held: Held::Model(ItemState::empty(sets, ways)),
            };
        }
        // Every slot empty: the short form, each set's length 0. At most MAX_SLOTS sets and
        // ways, so bytes.
        let mut bytes = vec![0; HEADER_BYTES + 2 * sets];
        bytes[..3].copy_from_slice(&[version + SHORT, sets as u8, ways as u8]);
        Edit {
            version,
            held: Held::Bytes(bytes),
        }
    }

    /// The item of `sets` sets of `ways` ways whose value is `value` (in either format and
    /// form), to be written in format `version`; the error of [`decode`] when it is not one.
    ///
    /// The operations' `facts` must carry `max_age` exactly when `version` is
    /// [`COMPACT_TIMED`], as every store writes.
    pub(crate) fn read(
        value: Vec<u8>,
        sets: usize,
        ways: usize,
        version: u8,
    ) -> Result<Edit, DecodeError> {
        let held = if Bytes::<&[u8]>::canonical(&value, sets, ways, version) {
            Held::Bytes(value)
        } else {
            Held::Model(decode(&value, sets, ways)?)
        };
        Ok(Edit { version, held })
    }

    /// The item whose value is `value`, as [`Edit::into_value`] gave it for format `version`
    /// (or as [`is_as_written`] found it): taken without a check (its bytes are the only ones
    /// an edit reads).
    #[cfg(any(feature = "memcached", feature = "redis"))]
    pub(crate) fn written(value: Vec<u8>, version: u8) -> Edit {
        debug_assert!(value.len() >= HEADER_BYTES);
        debug_assert!(Bytes::<&[u8]>::canonical(
            &value,
            usize::from(value[1]),
            usize::from(value[2]),
            version
        ));
        Edit {
            version,
            held: Held::Bytes(value),
        }
    }

    /// Applies `op` for `digest` of set `set` of the item, as [`apply`] does.
    pub(crate) fn apply(
        &mut self,
        set: usize,
        op: Op,
        digest: Digest,
        facts: LeaseFacts,
    ) -> (Outcome, bool) {
        debug_assert_eq!(facts.max_age_ms.is_some(), self.version == COMPACT_TIMED);
        match &mut self.held {
            Held::Model(item) => apply(item, set, op, digest, facts),
            Held::Bytes(bytes) => {
                let mut item = Bytes::of(bytes, self.version);
                let answer = apply(&mut item, set, op, digest, facts);
                let (sets, ways) = (item.sets, item.ways);
                if answer.1 && !item.in_shorter_form() {
                    // The other form is the shorter now: the model writes it.
                    if let Ok(decoded) = decode(bytes, sets, ways) {
                        encode_into(&decoded, self.version, bytes);
                    } else {
                        debug_assert!(false, "an edited value no longer decodes");
                    }
                }
                answer
            }
        }
    }

    /// The item's value in format `version`, as [`encode_into`] writes it.
    pub(crate) fn into_value(self) -> Vec<u8> {
        match self.held {
            Held::Bytes(bytes) => bytes,
            Held::Model(item) => {
                let mut out = Vec::new();
                encode_into(&item, self.version, &mut out);
                out
            }
        }
    }
}

/// Whether `value` is an item of `sets` sets of `ways` ways, in either format and form: as
/// [`decode`] would take it, without decoding one that is already canonical.
#[cfg(any(feature = "redis", test))]
pub(crate) fn decodes(value: &[u8], sets: usize, ways: usize) -> bool {
    [super::COMPACT_UNTIMED, COMPACT_TIMED]
        .into_iter()
        .any(|version| Bytes::<&[u8]>::canonical(value, sets, ways, version))
        || decode(value, sets, ways).is_ok()
}

/// Whether `value` is an item of `sets` sets of `ways` ways exactly as [`Edit::into_value`]
/// writes it in format `version`: one [`Edit::written`] takes without a second check.
#[cfg(feature = "redis")]
pub(crate) fn is_as_written(value: &[u8], sets: usize, ways: usize, version: u8) -> bool {
    Bytes::<&[u8]>::canonical(value, sets, ways, version)
}

/// A value seen as [`Slots`] (a canonical one, and in a `Vec` to change it): its header read
/// once, its fields found by offset.
struct Bytes<V> {
    bytes: V,
    short: bool,
    width: usize,
    sets: usize,
    ways: usize,
}

impl<'a> Bytes<&'a mut Vec<u8>> {
    /// The value `bytes`, canonical in format `version`.
    fn of(bytes: &'a mut Vec<u8>, version: u8) -> Self {
        Bytes {
            short: bytes[0] != version,
            width: super::slot_bytes(version == COMPACT_TIMED),
            sets: usize::from(bytes[1]),
            ways: usize::from(bytes[2]),
            bytes,
        }
    }
}

impl Bytes<&[u8]> {
    /// Whether `value` is an item of `sets` sets of `ways` ways exactly as [`encode_into`]
    /// writes it in format `version`: so that [`decode`] takes it, and encoding what it
    /// decodes gives these bytes again.
    fn canonical(value: &[u8], sets: usize, ways: usize, version: u8) -> bool {
        let [format, held_sets, held_ways, flights, ..] = *value else {
            return false;
        };
        let short = format == version + SHORT;
        if !(short || format == version)
            || usize::from(held_sets) != sets
            || usize::from(held_ways) != ways
            || sets == 0
        {
            return false;
        }
        let width = super::slot_bytes(version == COMPACT_TIMED);
        let lengths_end = HEADER_BYTES + sets * (1 + usize::from(short));
        let Some(head) = value.get(HEADER_BYTES..lengths_end) else {
            return false;
        };
        let (cursors, lengths) = head.split_at(sets);
        if cursors.iter().any(|&c| usize::from(c) >= ways)
            || lengths.iter().any(|&len| usize::from(len) > ways)
        {
            return false;
        }
        let slots = if short {
            lengths.iter().map(|&len| usize::from(len)).sum()
        } else {
            sets * ways
        };
        let records = usize::from(flights) * FLIGHT_BYTES;
        if value.len() != lengths_end + slots * width + records {
            return false;
        }
        let item = Bytes {
            bytes: value,
            short,
            width,
            sets,
            ways,
        };
        // Each set's first slot, found once for the records: the value is below 64 KiB.
        let mut starts = [0u16; MAX_SLOTS];
        let mut held = 0;
        for (set, (start, len)) in item.spans().enumerate() {
            starts[set] = start as u16;
            // In the short form, a set holds up to its last occupied slot.
            let last_held = match len.checked_sub(1) {
                Some(last) if short => item.print_at(start + last * width) != 0,
                _ => true,
            };
            if !last_held || !item.no_stray_second(start, len) {
                return false;
            }
            held += if short {
                len
            } else {
                item.held_len_at(start, len)
            };
        }
        if item.shorter_is_short(held) != short {
            return false;
        }
        // Each record of an occupied slot of its own.
        let mut recorded = [0u64; 4];
        value[value.len() - records..]
            .chunks_exact(FLIGHT_BYTES)
            .all(|record| {
                let slot = record[0];
                let (word, bit) = (usize::from(slot / 64), 1u64 << (slot % 64));
                let fresh = recorded[word] & bit == 0;
                recorded[word] |= bit;
                let (set, way) = (usize::from(slot) / ways, usize::from(slot) % ways);
                let len = if short {
                    lengths.get(set).map_or(0, |&len| usize::from(len))
                } else if set < sets {
                    ways
                } else {
                    0
                };
                fresh && way < len && item.print_at(usize::from(starts[set]) + way * width) != 0
            })
    }
}

impl<V: AsRef<[u8]>> Bytes<V> {
    fn raw(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// Whether no empty slot of the `len` slots from `start` carries a second (in the timed
    /// format), as [`encode_into`] writes them.
    fn no_stray_second(&self, start: usize, len: usize) -> bool {
        self.width == 8
            || (0..len).all(|way| {
                let at = start + way * self.width;
                self.print_at(at) != 0 || self.raw()[at + 8..at + 12] == [0; 4]
            })
    }

    /// Whether [`encode_into`] writes the short form for an item whose sets hold `held`
    /// slots: when it is shorter than the full one.
    fn shorter_is_short(&self, held: usize) -> bool {
        (self.sets * self.ways - held) * self.width > self.sets
    }

    /// Whether the value is in the shorter of its two forms, as [`encode_into`] picks it.
    fn in_shorter_form(&self) -> bool {
        // In the short form every set's last held slot is occupied (`slots_canonical`, and
        // the edits keep it so).
        let held: usize = self
            .spans()
            .map(|(start, len)| {
                if self.short {
                    len
                } else {
                    self.held_len_at(start, len)
                }
            })
            .sum();
        self.shorter_is_short(held) == self.short
    }

    /// How many slots set `set` holds in the short form: up to its last occupied one.
    fn held_len(&self, set: usize) -> usize {
        let (start, len) = self.set_span(set);
        self.held_len_at(start, len)
    }

    /// [`Self::held_len`] of the set whose `len` slots begin at `start`.
    fn held_len_at(&self, start: usize, len: usize) -> usize {
        (0..len)
            .rev()
            .find(|&way| self.print_at(start + way * self.width) != 0)
            .map_or(0, |way| way + 1)
    }

    /// Where the slots begin.
    fn slots_start(&self) -> usize {
        HEADER_BYTES + self.sets * (1 + usize::from(self.short))
    }

    /// Where each set's slots begin, and how many it holds, set after set.
    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut start = self.slots_start();
        (0..self.sets).map(move |set| {
            let len = if self.short {
                usize::from(self.raw()[HEADER_BYTES + self.sets + set])
            } else {
                self.ways
            };
            start += len * self.width;
            (start - len * self.width, len)
        })
    }

    /// Where set `set`'s slots begin, and how many it holds.
    fn set_span(&self, set: usize) -> (usize, usize) {
        if self.short {
            let lengths = &self.raw()[HEADER_BYTES + self.sets..];
            let before: usize = lengths[..set].iter().map(|&len| usize::from(len)).sum();
            (
                self.slots_start() + before * self.width,
                usize::from(lengths[set]),
            )
        } else {
            (self.slots_start() + set * self.ways * self.width, self.ways)
        }
    }

    /// Slot `at` (`set × ways + way`); empty past its set's held slots.
    fn read_slot(&self, at: usize) -> Slot {
        let (start, len) = self.set_span(at / self.ways);
        let way = at % self.ways;
        if way >= len {
            return Slot::default();
        }
        let raw = start + way * self.width;
        Slot {
            fingerprint: self.print_at(raw),
            done_s: if self.width == 8 {
                0
            } else {
                u32::from_be_bytes(super::array(&self.raw()[raw + 8..raw + 12]))
            },
        }
    }

    fn print_at(&self, at: usize) -> u64 {
        u64::from_be_bytes(super::array(&self.raw()[at..at + 8]))
    }

    fn records(&self) -> usize {
        usize::from(self.raw()[3])
    }

    /// Where record `i` begins: the records are the value's last bytes.
    fn record_at(&self, i: usize) -> usize {
        self.raw().len() - (self.records() - i) * FLIGHT_BYTES
    }

    fn record(&self, i: usize) -> Flight {
        let raw = &self.raw()[self.record_at(i)..][..FLIGHT_BYTES];
        let lease = u64::from_be_bytes(super::array(&raw[1..9]));
        Flight {
            slot: raw[0],
            lease_until_ms: lease & !DONE_BIT,
            owner: u64::from_be_bytes(super::array(&raw[9..17])),
            done: lease & DONE_BIT != 0,
        }
    }
}

impl Bytes<&mut Vec<u8>> {
    fn write_record(&mut self, i: usize, flight: Flight) {
        let at = self.record_at(i);
        let raw = &mut self.bytes[at..at + FLIGHT_BYTES];
        raw[0] = flight.slot;
        let lease = flight.lease_until_ms | if flight.done { DONE_BIT } else { 0 };
        raw[1..9].copy_from_slice(&lease.to_be_bytes());
        raw[9..17].copy_from_slice(&flight.owner.to_be_bytes());
    }

    /// Sets the count of records to `count` (below MAX_SLOTS: a record is of a slot).
    fn set_records(&mut self, count: usize) {
        self.bytes[3] = count as u8;
    }
}

impl Slots for Bytes<&mut Vec<u8>> {
    fn ways(&self) -> usize {
        self.ways
    }

    fn find(&self, set: usize, print: u64) -> Option<usize> {
        let (start, len) = self.set_span(set);
        (0..len).find(|&way| self.print_at(start + way * self.width) == print)
    }

    fn first_empty(&self, set: usize) -> Option<usize> {
        let (start, len) = self.set_span(set);
        // The slots past the held ones are empty.
        (0..len)
            .find(|&way| self.print_at(start + way * self.width) == 0)
            .or((len < self.ways).then_some(len))
    }

    fn slot(&self, at: usize) -> Slot {
        self.read_slot(at)
    }

    /// In the short form, a slot past the held ones makes the set hold up to it, and
    /// emptying the last held one makes it hold up to its last occupied one.
    fn set_slot(&mut self, at: usize, slot: Slot) {
        let set = at / self.ways;
        let (start, len) = self.set_span(set);
        let way = at % self.ways;
        if way >= len {
            // Only in the short form, whose slots past the held ones are empty.
            if slot == Slot::default() {
                return;
            }
            let end = start + len * self.width;
            let grow = (way + 1 - len) * self.width;
            self.bytes.splice(end..end, std::iter::repeat_n(0, grow));
            // At most `ways`, a byte.
            self.bytes[HEADER_BYTES + self.sets + set] = (way + 1) as u8;
        }
        let raw = start + way * self.width;
        self.bytes[raw..raw + 8].copy_from_slice(&slot.fingerprint.to_be_bytes());
        if self.width > 8 {
            self.bytes[raw + 8..raw + 12].copy_from_slice(&slot.done_s.to_be_bytes());
        }
        if self.short && slot.fingerprint == 0 && way + 1 >= len {
            let kept = self.held_len(set);
            self.bytes
                .drain(start + kept * self.width..start + len * self.width);
            // At most `ways`, a byte.
            self.bytes[HEADER_BYTES + self.sets + set] = kept as u8;
        }
    }

    fn cursor(&self, set: usize) -> u8 {
        self.bytes[HEADER_BYTES + set]
    }

    fn set_cursor(&mut self, set: usize, cursor: u8) {
        self.bytes[HEADER_BYTES + set] = cursor;
    }

    fn flight(&self, at: usize) -> Option<(usize, Flight)> {
        (0..self.records())
            .find(|&i| usize::from(self.raw()[self.record_at(i)]) == at)
            .map(|i| (i, self.record(i)))
    }

    fn set_lease(&mut self, i: usize, lease_until_ms: u64) {
        let flight = self.record(i);
        self.write_record(
            i,
            Flight {
                lease_until_ms,
                ..flight
            },
        );
    }

    fn land(&mut self, at: usize) {
        if let Some((i, _)) = self.flight(at) {
            let last = self.records() - 1;
            if i != last {
                let (from, to) = (self.record_at(last), self.record_at(i));
                self.bytes.copy_within(from..from + FLIGHT_BYTES, to);
            }
            self.bytes.truncate(self.bytes.len() - FLIGHT_BYTES);
            self.set_records(last);
        }
    }

    fn fly(&mut self, flight: Flight) {
        let i = match self.flight(usize::from(flight.slot)) {
            Some((i, _)) => i,
            None => {
                self.bytes.resize(self.bytes.len() + FLIGHT_BYTES, 0);
                let count = self.records() + 1;
                self.set_records(count);
                count - 1
            }
        };
        self.write_record(i, flight);
    }

    fn retain(&mut self, mut keep: impl FnMut(&Flight) -> bool) {
        let count = self.records();
        let mut kept = 0;
        for i in 0..count {
            if keep(&self.record(i)) {
                if kept != i {
                    let (from, to) = (self.record_at(i), self.record_at(kept));
                    self.bytes.copy_within(from..from + FLIGHT_BYTES, to);
                }
                kept += 1;
            }
        }
        if kept != count {
            // `record_at` counts from the end: the kept records are first.
            let start = self.record_at(0);
            self.bytes.truncate(start + kept * FLIGHT_BYTES);
            self.set_records(kept);
        }
    }
}

#[cfg(test)]
mod tests;
