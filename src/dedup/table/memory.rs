//! The table's memory: a table larger than the machine refused before it is allocated; one
//! zeroed allocation that is refused, not aborted on, when the system will not give it; the
//! machine's memory for the errors that say so; and the advice to back the table with huge
//! pages.

use std::sync::atomic::AtomicU64;

use crate::dedup::Geometry;
use crate::error::TableError;

/// `len` zeroed slots, or `None` when the allocator refuses: a size a user typed must not
/// abort the process, as a failed infallible allocation does.
///
/// An 8-byte-aligned request is served by `calloc`, which maps fresh, lazily zeroed pages for
/// large tables; asking for 64-byte alignment instead would make the allocator zero the whole
/// table eagerly. So the caller aligns by skipping up to 7 slots.
pub(super) fn zeroed_slots(len: usize) -> Option<Box<[AtomicU64]>> {
    let layout = std::alloc::Layout::array::<AtomicU64>(len).ok()?;
    if layout.size() == 0 {
        return Some(Box::new([]));
    }
    // SAFETY: the layout has a non-zero size, as `alloc_zeroed` requires.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU64>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[AtomicU64; len]`,
    // which is what a `Box<[AtomicU64]>` of `len` elements frees it with. All-zero bytes are a
    // valid `AtomicU64` (the same representation as `u64`), so every element is initialised;
    // zero is also the empty slot (state 0) and a cursor at slot 0.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
}

/// Refuses a table of `geometry` (with a time beside each slot when `timed`) larger than the
/// machine's memory: the system would hand it out lazily and kill the process (or its
/// neighbours) once it fills, so it is refused while that is still an error. Where the
/// machine's memory is unknown, nothing is refused here; the allocation may still be.
///
/// # Errors
///
/// [`TableError::Alloc`] naming the table's size and the machine's.
pub(crate) fn check_fits(geometry: Geometry, timed: bool) -> Result<(), TableError> {
    let bytes = geometry.memory_bytes() * if timed { 2 } else { 1 };
    match machine_memory_bytes() {
        Some(machine_bytes) if bytes > machine_bytes => Err(TableError::Alloc {
            bytes,
            timed,
            machine_bytes: Some(machine_bytes),
        }),
        _ => Ok(()),
    }
}

/// The machine's physical memory (`MemTotal` of `/proc/meminfo`), for error messages.
pub(crate) fn machine_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// Asks the kernel to back the table with 2 MiB pages where the allocation covers whole ones.
///
/// Lookups land on random slots, so with 4 KiB pages nearly every lookup of a large table also
/// misses the TLB. Transparent huge pages are often enabled in `madvise` mode only; this is
/// that advice. Where the kernel declines, nothing changes.
#[cfg(target_os = "linux")]
pub(super) fn advise_huge_pages(slots: &[AtomicU64]) {
    const HUGE_PAGE: usize = 2 << 20;
    let start = slots.as_ptr() as usize;
    let end = start + std::mem::size_of_val(slots);
    let (first, last) = (start.next_multiple_of(HUGE_PAGE), end & !(HUGE_PAGE - 1));
    if last > first {
        // SAFETY: `[first, last)` is page-aligned and lies inside `slots`, memory this table
        // owns. MADV_HUGEPAGE is advice about how to back the pages: it neither unmaps them nor
        // changes their contents (huge pages fault in zeroed, and collapsing small pages into
        // a huge one copies them), so the slots keep their values and stay valid.
        let _ = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_HUGEPAGE,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn advise_huge_pages(_slots: &[AtomicU64]) {}

/// Gives the memory of the whole pages inside `words` back to the system; they read as zeros
/// from then on (an empty slot, no time). For a table generation that retired while other
/// threads may still be reading it: the allocation stays, so every access stays valid.
#[cfg(target_os = "linux")]
pub(super) fn release_pages(words: &[AtomicU64]) {
    const PAGE: usize = 4096;
    let start = words.as_ptr() as usize;
    let end = start + std::mem::size_of_val(words);
    let (first, last) = (start.next_multiple_of(PAGE), end & !(PAGE - 1));
    if last > first {
        // SAFETY: `[first, last)` is page-aligned and lies inside `words`, memory the table
        // owns and keeps owning (it is freed with the table, not here). MADV_DONTNEED on this
        // private anonymous memory (`calloc`'s) leaves the mapping in place; its pages read
        // as zeros afterwards. Other threads may be reading or compare-and-swapping these
        // atomics meanwhile: each access still lands on valid, mapped memory and sees either
        // the value it had or zero, as if another thread had stored zero, which atomics allow
        // and the table reads as an empty slot.
        let _ = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_DONTNEED,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn release_pages(_words: &[AtomicU64]) {}
