//! Buffers used again: the compact layout's hot path copies a key's value (0.5 to 1.6 KB) to
//! edit it (the value read stays where it was read, in its pipeline's replies), keeps the
//! value it wrote and drops the one it replaced, and gathers each pipeline (up to a few MB:
//! two values a write) and the bytes of its replies in buffers of their own. glibc serves
//! blocks over 1 KB from its bins, not its per-thread cache, and a block of megabytes from
//! fresh pages (above its `mmap` threshold) that fault when first written; freeing and
//! allocating these values was the largest part of `malloc` and `free`'s share of the
//! sidecar's CPU (`docs/benchmarks.md`, "Our own RESP client for the hot path"). Here each
//! thread keeps the buffers given back, up to a bound, for the next value or pipeline, and
//! never grows one kept that is too small (growing copies every byte it held).

use std::cell::RefCell;

/// Values a thread keeps: about what a burst's run reads and edits before it gives them back.
const VALUES_KEPT: usize = 1024;

/// Larger value buffers are freed, not kept: no value of ours is that large (an item of 64
/// sets of 8 ways, every slot with a record, is under 20 KB).
const MAX_VALUE_BYTES: usize = 32 * 1024;

/// Pipeline buffers (a pipeline's commands, or the bytes of its replies) a thread keeps: a
/// run holds its reads' replies while it sends its writes and reads their replies, three at
/// once, and a thread runs several bursts' runs at once. Fewer, and buffers given back were
/// freed while others were allocated, their fresh pages faulting as they were first written.
const PIPELINES_KEPT: usize = 8;

/// The most bytes of pipeline buffers a thread keeps: each kept one is memory the sidecar
/// holds (a burst of 1,000 keys of 1.6 KB writes 3 MB).
const PIPELINE_BYTES_KEPT: usize = 8 * 1024 * 1024;

/// Larger pipeline buffers are freed, not kept.
const MAX_PIPELINE_BYTES: usize = 4 * 1024 * 1024;

thread_local! {
    static VALUES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static PIPELINES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A copy of `bytes`, in a buffer given back if the thread has one that holds it. A new
/// buffer has room for an eighth more (an edit adds an entry or an in-flight record).
pub(super) fn copy_of(bytes: &[u8]) -> Vec<u8> {
    let mut buffer = match take(&VALUES) {
        Some(buffer) if buffer.capacity() >= bytes.len() => buffer,
        // One too small is freed, not grown: growing it would copy what it held.
        _ => Vec::with_capacity(bytes.len() + bytes.len() / 8),
    };
    buffer.extend_from_slice(bytes);
    buffer
}

/// Gives the value buffer `buffer` back, to hold a later copy.
pub(super) fn give(buffer: Vec<u8>) {
    put(&VALUES, buffer, VALUES_KEPT, MAX_VALUE_BYTES, None);
}

/// An empty pipeline buffer of at least `capacity` bytes: the smallest given back that holds
/// it if the thread has one, else a new one (a buffer too small is freed, not grown: growing
/// it would copy all it held).
pub(super) fn pipeline(capacity: usize) -> Vec<u8> {
    let fitting = PIPELINES.try_with(|shelf| {
        let mut shelf = shelf.borrow_mut();
        let at = (0..shelf.len())
            .filter(|&i| shelf[i].capacity() >= capacity)
            .min_by_key(|&i| shelf[i].capacity());
        match at {
            Some(at) => Some(shelf.swap_remove(at)),
            // None fits: the largest makes room for the new one.
            None => {
                let largest = (0..shelf.len()).max_by_key(|&i| shelf[i].capacity());
                drop(largest.map(|i| shelf.swap_remove(i)));
                None
            }
        }
    });
    match fitting.ok().flatten() {
        Some(mut buffer) => {
            buffer.clear();
            buffer
        }
        None => Vec::with_capacity(capacity),
    }
}

/// Gives the pipeline buffer `buffer` back.
pub(super) fn give_pipeline(buffer: Vec<u8>) {
    put(
        &PIPELINES,
        buffer,
        PIPELINES_KEPT,
        MAX_PIPELINE_BYTES,
        Some(PIPELINE_BYTES_KEPT),
    );
}

type Shelf = std::thread::LocalKey<RefCell<Vec<Vec<u8>>>>;

/// A buffer of `shelf`, emptied.
fn take(shelf: &'static Shelf) -> Option<Vec<u8>> {
    let mut buffer = shelf.try_with(|kept| kept.borrow_mut().pop()).ok()??;
    buffer.clear();
    Some(buffer)
}

/// Keeps `buffer` on `shelf` if it holds fewer than `kept`, `buffer` is at most `max_bytes`,
/// and the buffers kept with it are at most `total_bytes` (`None`: no bound).
fn put(
    shelf: &'static Shelf,
    buffer: Vec<u8>,
    kept: usize,
    max_bytes: usize,
    total_bytes: Option<usize>,
) {
    if buffer.capacity() == 0 || buffer.capacity() > max_bytes {
        return;
    }
    // A thread being torn down has no shelf left: the buffer is freed.
    let _ = shelf.try_with(|shelf| {
        let mut shelf = shelf.borrow_mut();
        let total = || -> usize { shelf.iter().map(Vec::capacity).sum() };
        if shelf.len() < kept
            && total_bytes.is_none_or(|bound| total() + buffer.capacity() <= bound)
        {
            shelf.push(buffer);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{copy_of, give, give_pipeline, pipeline, MAX_VALUE_BYTES};

    #[test]
    fn a_buffer_given_back_holds_the_next_copy() {
        let first = copy_of(&[1; 1500]);
        let at = first.as_ptr();
        give(first);
        let second = copy_of(&[2; 600]);
        assert_eq!(second, vec![2; 600]);
        assert_eq!(second.as_ptr(), at);
        // Too large to keep.
        give(Vec::with_capacity(MAX_VALUE_BYTES + 1));
        assert_ne!(copy_of(&[3]).capacity(), MAX_VALUE_BYTES + 1);
    }

    #[test]
    fn a_pipeline_buffer_given_back_comes_back_empty() {
        let mut first = pipeline(4096);
        first.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let at = first.as_ptr();
        give_pipeline(first);
        let second = pipeline(100);
        assert!(second.is_empty());
        assert_eq!(second.as_ptr(), at);
    }

    /// The smallest buffer kept that holds a pipeline is taken; when none does, a new one of
    /// its size, not one kept and grown.
    #[test]
    fn a_pipeline_takes_the_smallest_buffer_that_holds_it() {
        let (small, large) = (pipeline(1000), pipeline(100_000));
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        give_pipeline(large);
        give_pipeline(small);
        let taken = pipeline(50_000);
        assert_eq!(taken.as_ptr(), large_at);
        let larger = pipeline(200_000);
        assert_ne!(larger.as_ptr(), small_at);
        assert!(larger.capacity() >= 200_000);
    }

    /// A value buffer kept that is too small for a copy is not grown: the copy gets a new
    /// buffer, with room to grow by an edit.
    #[test]
    fn a_value_buffer_too_small_is_not_grown() {
        give(Vec::with_capacity(16));
        let copy = copy_of(&[7; 800]);
        assert_eq!(copy, vec![7; 800]);
        assert!(copy.capacity() >= 900, "{}", copy.capacity());
    }
}
