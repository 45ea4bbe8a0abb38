//! The two layouts of a Memcached table, named by the key format in its namespace and in the
//! table's descriptor, and the value of one item in either ([`Unit`]):
//!
//! - **format 1** (`set.rs`): an item per set, each entry 34 bytes (the whole digest, state,
//!   time and owner). Read and written as the previous generation of a table that moves to
//!   format 2, never made anew.
//! - **format 2** (`dedup/compact.rs`, the default): an item holds `sets_per_item` consecutive sets
//!   (so that it has [`MemcachedConfig::slots_per_item`](super::MemcachedConfig::slots_per_item)
//!   slots), each entry 8 bytes (12 with `max_age`), an entry in flight 17 more.
//!
//! A set is the same in both (the digest's set by [`Geometry::set_of`], the in-process table's
//! replacement), so the layout is only how many sets share an item and how an entry is written.

use std::time::Duration;

use super::set::{self, LeaseFacts, Op, Outcome, SetState};
use crate::dedup::compact::{self as item, Edit};
use crate::dedup::shared::value_version;
use crate::dedup::{Digest, Geometry};

/// The key format of the layout of an item per set, with 34-byte entries.
pub(crate) const SETS_FORMAT: u8 = 1;

/// The key format of the compact layout: several sets an item, 8-byte entries.
pub(crate) const COMPACT_FORMAT: u8 = 2;

/// How a table's sets are kept in items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// Key format 1: an item per set.
    Sets,
    /// Key format 2: `sets_per_item` consecutive sets an item.
    Items { sets_per_item: u64 },
}

impl Layout {
    /// The layout of key format `format` for a table of `ways` ways, `slots_per_item` slots an
    /// item in format 2; `None` for a format this version does not read.
    pub(super) fn of(format: u8, ways: u32, slots_per_item: u32) -> Option<Layout> {
        match format {
            SETS_FORMAT => Some(Layout::Sets),
            COMPACT_FORMAT => Some(Layout::Items {
                sets_per_item: item::sets_per_item(slots_per_item, ways),
            }),
            _ => None,
        }
    }

    /// The key format, part of the namespace.
    pub(super) fn format(self) -> u8 {
        match self {
            Layout::Sets => SETS_FORMAT,
            Layout::Items { .. } => COMPACT_FORMAT,
        }
    }

    /// Sets an item holds (the last item of a table may hold fewer).
    pub(super) fn sets_per_item(self) -> u64 {
        match self {
            Layout::Sets => 1,
            Layout::Items { sets_per_item } => sets_per_item,
        }
    }

    /// The item of set `set`.
    pub(super) fn item_of(self, set: u64) -> u64 {
        set / self.sets_per_item()
    }

    /// How many sets item `item` of a table of `geometry` holds.
    fn sets_in(self, item: u64, geometry: Geometry) -> usize {
        item::sets_in(item, self.sets_per_item(), geometry)
    }

    /// Item `item` with nothing in it, to be written timed when done entries expire
    /// (`max_age`).
    pub(super) fn empty(self, item: u64, geometry: Geometry, max_age: Option<Duration>) -> Unit {
        let ways = geometry.ways() as usize;
        match self {
            Layout::Sets => Unit::Set(Box::new(SetState::empty(ways))),
            Layout::Items { .. } => Unit::Item(Edit::empty(
                self.sets_in(item, geometry),
                ways,
                item::version(max_age.is_some()),
            )),
        }
    }

    /// Item `item`'s value, to be changed and written timed when done entries expire
    /// (`max_age`); `None` when it cannot be decoded (truncated, foreign, of another shape).
    pub(super) fn decode(
        self,
        value: Vec<u8>,
        item: u64,
        geometry: Geometry,
        max_age: Option<Duration>,
    ) -> Option<Unit> {
        let ways = geometry.ways() as usize;
        match self {
            Layout::Sets => set::decode(&value, ways)
                .ok()
                .map(|set| Unit::Set(Box::new(set))),
            Layout::Items { .. } => Edit::read(
                value,
                self.sets_in(item, geometry),
                ways,
                item::version(max_age.is_some()),
            )
            .ok()
            .map(Unit::Item),
        }
    }

    /// Item `item`'s value as this version writes it with `max_age` (decoded in format 1,
    /// not checked in format 2); a value that is not one is read as empty.
    pub(super) fn written(
        self,
        value: Vec<u8>,
        item: u64,
        geometry: Geometry,
        max_age: Option<Duration>,
    ) -> Unit {
        match self {
            Layout::Sets => self.decode(value, item, geometry, max_age),
            Layout::Items { .. } => Some(Unit::Item(Edit::written(
                value,
                item::version(max_age.is_some()),
            ))),
        }
        .unwrap_or_else(|| self.empty(item, geometry, max_age))
    }

    /// Bytes of a full item's value in a table of `ways` ways, no entry in flight.
    pub(super) fn full_value_bytes(self, ways: u32, max_age: Option<Duration>) -> u64 {
        let ways = ways as usize;
        let bytes = match self {
            Layout::Sets => 3 + set::ENTRY_BYTES * ways,
            Layout::Items { sets_per_item } => {
                item::value_bytes(sets_per_item as usize, ways, 0, max_age.is_some())
            }
        };
        bytes as u64
    }
}

/// One item's value, to be changed by operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unit {
    /// Boxed: the earlier layout's set holds its slots in place (400 bytes), and is read only
    /// as a previous generation.
    Set(Box<SetState>),
    /// Changed in its value's bytes, as written in the format of the `max_age` it was read
    /// with.
    Item(Edit),
}

impl Unit {
    /// Applies `op` for `digest` of set `set` of the table (see `set::apply`, `item::apply`).
    pub(super) fn apply(
        &mut self,
        layout: Layout,
        set: u64,
        op: Op,
        digest: Digest,
        facts: LeaseFacts,
    ) -> (Outcome, bool) {
        match self {
            Unit::Set(state) => set::apply(state, op, digest, facts),
            Unit::Item(state) => {
                // Below `sets_per_item`.
                let within = (set % layout.sets_per_item()) as usize;
                state.apply(within, op, digest, facts)
            }
        }
    }

    /// The value to write, timed when done entries expire (`max_age`, as read).
    pub(super) fn into_value(self, max_age: Option<Duration>) -> Vec<u8> {
        match self {
            Unit::Set(state) => {
                let mut out = Vec::new();
                set::encode_into(&state, value_version(max_age), &mut out);
                out
            }
            Unit::Item(edit) => edit.into_value(),
        }
    }
}
