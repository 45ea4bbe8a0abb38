//! The two layouts of a Redis table, named by the key format in its namespace and in the
//! table's descriptor, and one key's operations decided on what it holds ([`Layout::decide`]):
//!
//! - **format 2** (`value.rs`, `set.lua`): a key per 8-way set, each entry 34 bytes (slot,
//!   the whole digest, state, time and owner) at a fixed offset, so that the script writes
//!   only the bytes an operation changes. Decided by the script, or in the client and
//!   written with `SET … IFEQ` (`ifeq`).
//! - **format 3** (the compact layout, [`crate::dedup::compact`], Memcached's format 2): a key
//!   holds [`SLOTS_PER_KEY`] slots (8 sets of 8 ways), each entry 8 bytes (12 with
//!   `max_age`), an entry in flight 17 more while it is in flight. Always decided in the
//!   client and written back whole by a compare-and-set: `SET … IFEQ` where the servers have
//!   it, else a script that compares and sets (`items`).
//!
//! A set is the same in both (the digest's set by [`Geometry::set_of`], the in-process
//! table's replacement), so the layout is only how many sets share a key and how an entry is
//! written.

use super::recycle;
use super::value::{self, Facts, Stored};
use super::Op;
use crate::dedup::compact::{self, Edit, LeaseFacts, Outcome};
use crate::dedup::shared::REDIS_KEY_VERSION;
use crate::dedup::{Claim, Digest, Geometry};

/// The key format of the layout of a key per set, with 34-byte entries.
pub(crate) const SETS_FORMAT: u8 = REDIS_KEY_VERSION;

/// The key format of the compact layout: several sets a key, 8-byte entries.
pub(crate) const ITEMS_FORMAT: u8 = 3;

/// Slots a key of the compact layout holds: whole sets, as many as fit (8 sets of 8 ways).
/// Redis spends about 100 bytes on a key besides its value (the key's entry, object, name
/// and dictionary slot), under 2 bytes a slot at 64; a key of 64 slots is a 524-byte value
/// when full, which its allocator keeps in 640 bytes (its size class above 512).
pub(crate) const SLOTS_PER_KEY: u32 = crate::dedup::REDIS_SLOTS_PER_KEY;

// A slot's number, and the count of records, are a byte.
const _: () = assert!(SLOTS_PER_KEY as usize <= compact::MAX_SLOTS);

/// How a table's sets are kept in keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Key format 2: a key per set.
    Sets,
    /// Key format 3: `sets_per_key` consecutive sets a key.
    Items { sets_per_key: u64 },
}

/// What one key's operations decided: the answers, as the set script answers them, and the
/// value to write when any of them changed it.
pub(super) struct Decided {
    /// Each operation's index in its run and its answer.
    pub(super) staged: Vec<(usize, i64)>,
    /// The new value, when an operation changed it.
    pub(super) value: Option<Vec<u8>>,
}

impl Layout {
    /// The layout of key format `format` for a table of `ways` ways; `None` for a format
    /// this version does not read.
    pub(crate) fn of(format: u8, ways: u32) -> Option<Layout> {
        match format {
            SETS_FORMAT => Some(Layout::Sets),
            ITEMS_FORMAT => Some(Layout::Items {
                sets_per_key: compact::sets_per_item(SLOTS_PER_KEY, ways),
            }),
            _ => None,
        }
    }

    /// The key format, part of the namespace.
    pub(crate) fn format(self) -> u8 {
        match self {
            Layout::Sets => SETS_FORMAT,
            Layout::Items { .. } => ITEMS_FORMAT,
        }
    }

    /// Sets a key holds (the last key of a table may hold fewer).
    pub(crate) fn sets_per_key(self) -> u64 {
        match self {
            Layout::Sets => 1,
            Layout::Items { sets_per_key } => sets_per_key,
        }
    }

    /// The key (its number) of set `set`.
    pub(crate) fn key_of(self, set: u64) -> u64 {
        set / self.sets_per_key()
    }

    /// How many sets key `key` of a table of `geometry` holds.
    fn sets_in(self, key: u64, geometry: Geometry) -> usize {
        compact::sets_in(key, self.sets_per_key(), geometry)
    }

    /// Whether what key `key` holds reads as nothing: no value, or one that is not a key of
    /// this layout and shape (written by something else), which a write replaces.
    pub(super) fn holds_nothing(
        self,
        read: Option<&[u8]>,
        key: u64,
        geometry: Geometry,
        facts: &Facts,
    ) -> bool {
        match self {
            Layout::Sets => value::shape(read, facts) == value::Shape::Empty,
            Layout::Items { .. } => read.is_none_or(|read| {
                !compact::decodes(read, self.sets_in(key, geometry), facts.ways.into())
            }),
        }
    }

    /// Whether `read`, what key `key` holds, is a value exactly as this store writes it, which
    /// [`Layout::decide_on`] then takes without checking it again: in the compact layout, a
    /// check of its bytes; a key per set is read as it is, and never is.
    pub(super) fn is_as_written(
        self,
        read: &[u8],
        key: u64,
        geometry: Geometry,
        facts: &Facts,
    ) -> bool {
        match self {
            Layout::Sets => false,
            Layout::Items { .. } => compact::is_as_written(
                read,
                self.sets_in(key, geometry),
                facts.ways.into(),
                compact::version(facts.max_age_ms.is_some()),
            ),
        }
    }

    /// Decides `ops` (each one's index in its run and its digest, all of key `key`) in order
    /// on `read`, what the key holds: their answers, as the set script gives them (a claim 0
    /// new, 1 in flight, 2 duplicate, plus 4 times its slot in format 2; the others 1 held, 0
    /// not), and the new value if any changed it.
    pub(super) fn decide(
        self,
        at: (u64, Geometry),
        read: Option<&[u8]>,
        op: Op,
        ops: impl Iterator<Item = (usize, Digest)>,
        facts: &Facts,
    ) -> Decided {
        self.decide_on(at, (read, false), op, ops, facts)
    }

    /// [`Layout::decide`] on `read`, taken without a check when `as_written` (this store
    /// wrote it, or [`Layout::is_as_written`] said so).
    pub(super) fn decide_on(
        self,
        (key, geometry): (u64, Geometry),
        (read, as_written): (Option<&[u8]>, bool),
        op: Op,
        ops: impl Iterator<Item = (usize, Digest)>,
        facts: &Facts,
    ) -> Decided {
        let mut staged = Vec::new();
        let mut changed = false;
        let value = match self {
            Layout::Sets => {
                let mut stored = Stored(read.map(<[u8]>::to_vec));
                for (i, digest) in ops {
                    let (answer, wrote) = value::apply(&mut stored, op, digest, facts);
                    staged.push((i, answer));
                    changed |= wrote;
                }
                stored.0
            }
            Layout::Items { sets_per_key } => {
                let (sets, ways) = (self.sets_in(key, geometry), usize::from(facts.ways));
                let version = compact::version(facts.max_age_ms.is_some());
                let mut item = match read {
                    Some(read) if as_written => Edit::written(recycle::copy_of(read), version),
                    Some(read) => Edit::read(recycle::copy_of(read), sets, ways, version)
                        .unwrap_or_else(|_| Edit::empty(sets, ways, version)),
                    None => Edit::empty(sets, ways, version),
                };
                let lease = lease_facts(facts);
                for (i, digest) in ops {
                    // Below `sets_per_key`.
                    let within = (geometry.set_of(digest) % sets_per_key) as usize;
                    let (outcome, wrote) = item.apply(within, op.compact(), digest, lease);
                    staged.push((i, code(outcome)));
                    changed |= wrote;
                }
                changed.then(|| item.into_value())
            }
        };
        Decided {
            staged,
            value: value.filter(|_| changed),
        }
    }
}

/// A decision's facts as the compact layout takes them.
fn lease_facts(facts: &Facts) -> LeaseFacts {
    LeaseFacts {
        now_ms: facts.now_ms,
        lease_until_ms: facts.lease_until_ms,
        owner: facts.owner,
        max_age_ms: facts.max_age_ms,
    }
}

/// An outcome as the set script answers it (the compact layout has no hint of a slot).
fn code(outcome: Outcome) -> i64 {
    match outcome {
        Outcome::Claim(Claim::New) => 0,
        Outcome::Claim(Claim::InFlight) => 1,
        Outcome::Claim(Claim::Duplicate) => 2,
        Outcome::Held(held) => i64::from(held),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u64 = 1;
    const OTHER: u64 = 2;

    fn facts(now_ms: u64, owner: u64) -> Facts {
        Facts {
            now_ms,
            lease_until_ms: now_ms + 100,
            owner,
            max_age_ms: None,
            ways: 8,
            version: 1,
        }
    }

    /// Decides `op` on `digest` alone on `value`: its answer, and `value` as it leaves it.
    fn one(
        layout: Layout,
        value: &mut Option<Vec<u8>>,
        op: Op,
        digest: Digest,
        facts: &Facts,
    ) -> i64 {
        let geometry = Geometry::new(1 << 10, 8).unwrap();
        let key = layout.key_of(geometry.set_of(digest));
        let decided = layout.decide(
            (key, geometry),
            value.as_deref(),
            op,
            std::iter::once((0, digest)),
            facts,
        );
        if let Some(new) = decided.value {
            *value = Some(new);
        }
        decided.staged[0].1
    }

    #[test]
    fn a_key_of_the_compact_layout_keeps_the_rules_of_a_set() {
        let layout = Layout::of(ITEMS_FORMAT, 8).unwrap();
        assert_eq!(layout, Layout::Items { sets_per_key: 8 });
        let d = Digest::from_u128(0x1234 << 64 | 0x77);
        let mut value = None;
        assert_eq!(one(layout, &mut value, Op::Claim, d, &facts(0, ME)), 0);
        // The short form of one set of one entry, in flight: header, cursors, lengths, the
        // fingerprint, one record.
        assert_eq!(value.as_ref().unwrap().len(), 4 + 8 + 8 + 8 + 17);
        assert_eq!(one(layout, &mut value, Op::Claim, d, &facts(50, OTHER)), 1);
        assert_eq!(one(layout, &mut value, Op::Commit, d, &facts(50, OTHER)), 0);
        assert_eq!(one(layout, &mut value, Op::Commit, d, &facts(60, ME)), 1);
        // Committed, the record is gone: 8 bytes an entry.
        assert_eq!(value.as_ref().unwrap().len(), 4 + 8 + 8 + 8);
        assert_eq!(one(layout, &mut value, Op::Claim, d, &facts(70, OTHER)), 2);
        assert_eq!(
            one(layout, &mut value, Op::Erase, d, &facts(70, ME)),
            0,
            "a committed entry is final"
        );
        let before = value.clone();
        assert_eq!(one(layout, &mut value, Op::Renew, d, &facts(70, ME)), 0);
        assert_eq!(
            value, before,
            "an answer that changes nothing writes nothing"
        );
    }

    #[test]
    fn a_value_that_is_not_a_key_of_its_layout_reads_as_nothing() {
        let geometry = Geometry::new(1 << 10, 8).unwrap();
        let items = Layout::of(ITEMS_FORMAT, 8).unwrap();
        let facts = facts(0, ME);
        assert!(items.holds_nothing(None, 0, geometry, &facts));
        assert!(items.holds_nothing(Some(b"not a table"), 0, geometry, &facts));
        let mut value = Some(b"not a table".to_vec());
        let d = Digest::from_u128(5);
        assert_eq!(one(items, &mut value, Op::Claim, d, &facts), 0);
        assert!(!items.holds_nothing(value.as_deref(), 0, geometry, &facts));
        // A key per set reads the compact layout's value as nothing, and the reverse.
        assert!(Layout::Sets.holds_nothing(value.as_deref(), 0, geometry, &facts));
        let mut set = None;
        assert_eq!(one(Layout::Sets, &mut set, Op::Claim, d, &facts), 0);
        assert!(items.holds_nothing(set.as_deref(), 0, geometry, &facts));
        assert_eq!(Layout::of(4, 8), None);
    }
}
