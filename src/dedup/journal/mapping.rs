//! The journal's shared memory map of its file, seen as atomic words, and the thread that
//! syncs it for `store.journal_fsync` (one sync for every commit waiting).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A shared, writable memory map of a whole file, seen as 64-bit words.
pub(super) struct Mapping {
    inner: Arc<MappingInner>,
}

struct MappingInner {
    ptr: std::ptr::NonNull<AtomicU64>,
    words: usize,
}

// SAFETY: the mapping is only ever accessed through `&[AtomicU64]`, whose every access is
// atomic, so sharing it between threads is as safe as sharing a `Box<[AtomicU64]>`; the
// pointer is unmapped only when the last `Arc` goes away.
unsafe impl Send for MappingInner {}
// SAFETY: as for `Send`.
unsafe impl Sync for MappingInner {}

impl Mapping {
    #[cfg(target_os = "linux")]
    pub(super) fn new(file: &File, words: usize) -> io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping chosen by the kernel (no address given), of a file we hold
        // open read-write and that is at least `words * 8` bytes long (the caller extends
        // it), so every mapped page is backed by the file. The result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("the kernel mapped the journal at address 0"))?;
        Ok(Mapping {
            inner: Arc::new(MappingInner { ptr, words }),
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn new(_file: &File, _words: usize) -> io::Result<Mapping> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the journal needs a Unix memory map",
        ))
    }

    pub(super) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a page-aligned mapping of `words * 8` readable and writable bytes
        // that lives as long as `inner` (unmapped in its `Drop`). Any bytes are a valid
        // `AtomicU64`, and every access through the slice is atomic, so other threads (and
        // the kernel writing the pages back) never see a data race.
        unsafe { std::slice::from_raw_parts(self.inner.ptr.as_ptr(), self.inner.words) }
    }

    pub(super) fn clone_handle(&self) -> Mapping {
        Mapping {
            inner: self.inner.clone(),
        }
    }

    /// Writes the mapping's dirty pages to the file and waits for the disk.
    #[cfg(target_os = "linux")]
    pub(super) fn sync(&self) -> io::Result<()> {
        // SAFETY: `msync` on exactly the range `mmap` returned, which is still mapped (we
        // hold `inner`); it reads the pages and changes nothing in memory.
        let result = unsafe {
            libc::msync(
                self.inner.ptr.as_ptr().cast(),
                self.inner.words * 8,
                libc::MS_SYNC,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for MappingInner {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the range `mmap` returned; no slice of it outlives the last `Arc`, which is
        // being dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.words * 8);
        }
    }
}

/// Group commit for `store.journal_fsync`: one thread syncs the journal whenever someone
/// waits, and every waiter whose record was written before a sync started is released by it.
pub(super) struct Syncer {
    /// Syncs started so far; a waiter needs one numbered above what it read.
    started: Arc<AtomicU64>,
    /// Syncs finished so far.
    pub(super) finished: tokio::sync::watch::Receiver<u64>,
    /// Wakes the thread; dropping it (with the journal) ends the thread.
    wake: std::sync::mpsc::SyncSender<()>,
}

impl Syncer {
    pub(super) fn start(map: Mapping) -> io::Result<Syncer> {
        let started = Arc::new(AtomicU64::new(0));
        let (done, finished) = tokio::sync::watch::channel(0u64);
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let counter = started.clone();
        std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    let number = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    if let Err(error) = map.sync() {
                        tracing::error!(%error, "Syncing the table journal failed; retrying.");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        let _ = map.sync();
                    }
                    done.send_replace(number);
                }
            })?;
        Ok(Syncer {
            started,
            finished,
            wake,
        })
    }

    pub(super) async fn wait(&self) {
        // Our record is written; any sync numbered above `seen` started after it.
        let seen = self.started.load(Ordering::SeqCst);
        let mut finished = self.finished.clone();
        loop {
            let _ = self.wake.try_send(());
            if *finished.borrow_and_update() > seen {
                return;
            }
            if finished.changed().await.is_err() {
                return;
            }
        }
    }
}
