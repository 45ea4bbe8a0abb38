//! The in-process table as the store holds it: fixed in size, or behind a lock so that it can
//! take a new generation while claims go on (a table that sizes itself).
//!
//! [`Table::resize`] consumes the table, and claims hold it by reference. A table that grows
//! while running is therefore kept in a [`RwLock`]: every operation holds the read side for
//! the length of one call on the table (tens of nanoseconds, never across an `await`), and a
//! new generation is pushed under the write side. So no claim ever runs across the change:
//! before it, claims see the old table; after it, the new one with the old one behind it,
//! read-only, holding everything that was committed. No digest claimed or committed is ever
//! missing from the table a claim sees.
//!
//! The write side is only ever *tried* ([`RwLock::try_write`]): a writer waiting on the lock
//! would make every claim wait behind it, and a snapshot holds the read side for as long as
//! it takes to write the table file. The caller tries again a moment later.
//!
//! A table of fixed size pays one predictable branch per call and takes no lock.

use std::sync::RwLock;

use crate::dedup::table::Table;

/// The in-process table: fixed, or growable (see the module docs).
#[derive(Debug)]
pub struct LocalTable(Inner);

#[derive(Debug)]
enum Inner {
    Fixed(Table),
    Growable(RwLock<Table>),
}

impl From<Table> for LocalTable {
    fn from(table: Table) -> Self {
        LocalTable::fixed(table)
    }
}

impl LocalTable {
    /// A table that keeps its size (or is resized only by a restart on its table file).
    pub fn fixed(table: Table) -> Self {
        LocalTable(Inner::Fixed(table))
    }

    /// A table that can take new generations while it serves claims
    /// (`push_generation`).
    pub fn growable(table: Table) -> Self {
        LocalTable(Inner::Growable(RwLock::new(table)))
    }

    /// Whether the table can take new generations while it runs.
    pub fn is_growable(&self) -> bool {
        matches!(self.0, Inner::Growable(_))
    }

    /// Calls `op` on the table as it is now.
    #[inline]
    pub fn with<R>(&self, op: impl FnOnce(&Table) -> R) -> R {
        match &self.0 {
            Inner::Fixed(table) => op(table),
            // A panic in another call cannot leave the table half-changed: its writes are
            // single atomic steps, and a push is a swap of two whole tables.
            Inner::Growable(lock) => op(&lock.read().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Makes `current` (from [`Table::next_generation`] of this table) the current
    /// generation, this table's generations its previous ones, if the lock is free now.
    ///
    /// # Errors
    ///
    /// `current` back when the table is fixed, or the lock is held (a snapshot is being
    /// written, or claims are running at this instant): try again later.
    #[cfg(any(feature = "sidecar", test))]
    pub(crate) fn push_generation(&self, current: Table) -> Result<(), Table> {
        let Inner::Growable(lock) = &self.0 else {
            return Err(current);
        };
        let mut table = match lock.try_write() {
            Ok(table) => table,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(current),
        };
        table.push_generation(current);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::{Claim, Geometry};

    #[test]
    fn a_pushed_generation_keeps_what_was_claimed_and_committed() {
        let local = LocalTable::growable(Table::with_slots(64, 8).unwrap());
        let digest = |text: &[u8]| crate::DigestAlgorithm::default().digest(text);
        let (done, pending) = (digest(b"committed"), digest(b"in flight"));
        assert_eq!(local.with(|t| t.claim(done)), Claim::New);
        assert!(local.with(|t| t.commit(done)));
        assert_eq!(local.with(|t| t.claim(pending)), Claim::New);
        let next = local
            .with(|t| t.next_generation(Geometry::new(1024, 8).unwrap()))
            .unwrap();
        local.push_generation(next).unwrap();
        assert_eq!(local.with(|t| t.slots()), 1024);
        assert_eq!(local.with(|t| t.claim(done)), Claim::Duplicate);
        assert_eq!(local.with(|t| t.claim(pending)), Claim::InFlight);
        assert!(local.with(|t| t.commit(pending)));
        assert_eq!(local.with(|t| t.claim(pending)), Claim::Duplicate);
        assert_eq!(local.with(|t| t.held_bytes()), (1024 + 64) * 8);
    }

    #[test]
    fn a_fixed_table_or_a_busy_lock_gives_the_generation_back() {
        let fixed = LocalTable::fixed(Table::with_slots(64, 8).unwrap());
        let next = Table::with_slots(128, 8).unwrap();
        assert!(fixed.push_generation(next).is_err());
        assert_eq!(fixed.with(|t| t.slots()), 64);

        let growable = LocalTable::growable(Table::with_slots(64, 8).unwrap());
        let next = Table::with_slots(128, 8).unwrap();
        let refused = growable.with(|_| growable.push_generation(next));
        assert!(refused.is_err(), "pushed while a call held the table");
        assert_eq!(growable.with(|t| t.slots()), 64);
    }
}
