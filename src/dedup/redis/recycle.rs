//! Buffers used again: the compact layout's hot path reads a key's value (0.5 to 1.6 KB),
//! copies it to edit it, keeps the value it wrote and drops the one it replaced, a few buffers
//! of that size an operation, and gathers each pipeline (up to a few MB: two values a write)
//! and the bytes of its replies in buffers of their own. glibc serves blocks over 1 KB from
//! its bins, not its per-thread cache, and a block of megabytes from fresh pages (above its
//! `mmap` threshold) that fault when first written; freeing and allocating these values was
//! the largest part of `malloc` and `free`'s share of the sidecar's CPU (`docs/benchmarks.md`,
//! "Our own RESP client for the hot path"). Here each thread keeps the buffers given back, up
//! to a bound, for the next value or pipeline.

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
    put(&VALUES, buffer, VALUES_KEPT, MAX_VALUE_BYTES, usize::MAX);
}

/// An empty pipeline buffer of at least `capacity` bytes: one given back if the thread has one.
pub(super) fn pipeline(capacity: usize) -> Vec<u8> {
    let mut buffer = take(&PIPELINES).unwrap_or_default();
    buffer.reserve(capacity);
    buffer
}

/// Gives the pipeline buffer `buffer` back.
pub(super) fn give_pipeline(buffer: Vec<u8>) {
    put(
        &PIPELINES,
        buffer,
        PIPELINES_KEPT,
        MAX_PIPELINE_BYTES,
        PIPELINE_BYTES_KEPT,
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
/// and the buffers kept with it are at most `total_bytes`.
fn put(shelf: &'static Shelf, buffer: Vec<u8>, kept: usize, max_bytes: usize, total_bytes: usize) {
    if buffer.capacity() == 0 || buffer.capacity() > max_bytes {
        return;
    }
    // A thread being torn down has no shelf left: the buffer is freed.
    let _ = shelf.try_with(|shelf| {
        let mut shelf = shelf.borrow_mut();
        let total = || -> usize { shelf.iter().map(Vec::capacity).sum() };
        if shelf.len() < kept
            && (total_bytes == usize::MAX || total() + buffer.capacity() <= total_bytes)
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
}
