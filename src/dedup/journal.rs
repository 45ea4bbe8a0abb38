//! The table file's journal: every commit and erase since the last snapshot, so that a kill -9
//! forgets nothing that was committed.
//!
//! A snapshot ([`TableFile`]) is written every `snapshot_interval`; what is committed between
//! two of them lives only in memory. The journal, `PATH.journal` beside the table file, holds
//! those commits (and erases) as 24-byte records in a shared memory map of the file: an
//! append is three stores into the page cache, made before the message's FIN, with no system
//! call. The kernel owns the page cache, so the records survive the process being killed in
//! any way; a start loads the snapshot, then replays the journal records that follow it.
//! Many tasks append at once, each to its own place (one atomic add hands the places out):
//! that is the group commit, without a writer to wait for.
//!
//! What a machine crash (power, kernel) can lose: without `store.journal_fsync`, records the
//! kernel had not yet written back, which is up to its dirty-page expiry
//! (`vm.dirty_expire_centisecs`, 30 s by default) plus its writeback period; snapshots are
//! fsynced, so never more than what followed the last one. With `store.journal_fsync = true`,
//! a commit waits until a sync of the journal that started after its record was written has
//! finished (one `msync` serves every commit waiting for it), so nothing FINished is lost; the
//! price is a disk flush in every message's path.
//!
//! # Generations
//!
//! The file has two halves. Each snapshot starts a new generation, whose records go to the
//! other half from its start: the snapshot is read after the switch, so every record of the
//! old generation is in it, and the header of the snapshot names the new generation (and the
//! journal's life, a random number chosen when the journal file was made, so a journal is never
//! replayed onto a table file it does not belong to). While that snapshot is being written, the
//! previous one is still the file, and the old generation's half is still intact beside it. A
//! failed snapshot keeps the generation, so the half the file on disk needs is never reused.
//! A start replays the snapshot's generation, then the next one; if anything was replayed, it
//! writes a snapshot before taking messages and starts a new journal.
//!
//! # Record and file format (version 1)
//!
//! ```text
//! header, 4096 bytes: magic "NSQDDJNL", format version (u32, 1), record bytes (u32, 24),
//!                     life (u64), records per half (u64), ..., xxh3-64 of bytes 0..4088
//! half 0, half 1:     records of 24 bytes, little-endian:
//!                     digest high 64 bits, digest low 64 bits,
//!                     generation (32 bits) | erase (1 bit) | check (31 bits, xxh3 of the rest)
//! ```
//!
//! A record whose check or generation does not match (never written, torn, an older
//! generation's, or cut off by a truncated file) is skipped: a damaged tail is not an error.
//!
//! When a half fills up (more commits in one interval than it holds), a snapshot is asked for
//! early at half of it; if one is still full, further commits go unjournalled (counted, and a
//! kill -9 before the next snapshot forgets them: copies may pass, nothing is lost).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::dedup::table::Table;
use crate::dedup::table_file::{
    open_regular, JournalTag, OpenError, SaveReport, TableFile, TableFileError,
};
use crate::dedup::Digest;

const MAGIC: &[u8; 8] = b"NSQDDJNL";
const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 4096;
const RECORD_WORDS: usize = 3;
const RECORD_BYTES: usize = RECORD_WORDS * 8;
/// Records per half: the table's slots, within these bounds. A half as large as the table
/// holds, in records, about three times the bytes of a snapshot.
const MIN_CAPACITY: u64 = 1 << 16;
const MAX_CAPACITY: u64 = 1 << 24;

/// What a record says happened to its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Commit = 0,
    Erase = 1,
}

/// What opening the journal found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalReport {
    /// Commits replayed onto the loaded snapshot.
    pub commits: u64,
    /// Erases replayed.
    pub erases: u64,
    /// A snapshot was written at start (something was replayed, or the journal was new).
    pub saved_at_start: bool,
    /// Why an existing journal file was not replayed, when it was not.
    pub ignored: Option<String>,
}

/// The journal of one table file; appends come from every task, snapshots from one.
pub struct Journal {
    path: PathBuf,
    map: Mapping,
    /// Records per half.
    capacity: u64,
    life: u64,
    /// The current generation (high 32 bits) and the next free place in its half (low 32).
    state: AtomicU64,
    /// The generation named by the snapshot on disk.
    saved: AtomicU32,
    /// Commits and erases that found their half full.
    unjournalled: AtomicU64,
    /// Told when a half is half full: the snapshot loop writes one early.
    early: tokio::sync::Notify,
    /// One snapshot at a time.
    saving: std::sync::Mutex<()>,
    sync: Option<Syncer>,
    _file: File,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .field("life", &self.life)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// The journal of `file`, whose snapshot was just loaded into `table` (`loaded` is what
    /// loading found): replays the records that follow the snapshot, and when anything was
    /// replayed (or there was no journal for this snapshot) writes a snapshot and starts a
    /// new journal. With `fsync`, commits wait for their record to be on disk.
    ///
    /// # Errors
    ///
    /// [`TableFileError::Io`] naming the journal when it cannot be read, made or mapped, or the
    /// snapshot at start cannot be written.
    pub fn open(
        file: &TableFile,
        loaded: Option<JournalTag>,
        table: &Table,
        fsync: bool,
    ) -> Result<(Journal, JournalReport), TableFileError> {
        let path = journal_path(file.path());
        let io = |cause| TableFileError::Io {
            path: path.clone(),
            cause,
        };
        let capacity = table.slots().clamp(MIN_CAPACITY, MAX_CAPACITY);
        let mut report = JournalReport::default();
        let existing = match open_regular(&path, OpenOptions::new().read(true)) {
            Ok(mut f) => Some(read_header(&mut f).map_err(io)?),
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.at(&path)),
        };
        let mut resume = None;
        match (existing, loaded) {
            (Some(Ok(header)), Some(tag)) if header.life == tag.life => {
                let mut f =
                    open_regular(&path, OpenOptions::new().read(true)).map_err(|e| e.at(&path))?;
                let replayed = replay(&mut f, &header, tag.generation, table).map_err(io)?;
                report.commits = replayed.commits;
                report.erases = replayed.erases;
                if replayed.commits + replayed.erases == 0 && header.capacity == capacity {
                    resume = Some((header.life, tag.generation));
                }
            }
            (Some(Ok(_)), _) => {
                report.ignored = Some(
                    "it belongs to another snapshot than the table file's (the table file was \
                     replaced, recreated or written without a journal)"
                        .into(),
                );
            }
            (Some(Err(reason)), _) => report.ignored = Some(reason),
            (None, _) => {}
        }
        let journal = match resume {
            // Nothing follows the snapshot: go on in this file, in the snapshot's generation.
            Some((life, saved)) => {
                let handle = open_regular(&path, OpenOptions::new().read(true).write(true))
                    .map_err(|e| e.at(&path))?;
                Journal::new(path.clone(), handle, capacity, life, saved, fsync).map_err(io)?
            }
            None => {
                // The table now holds what the journal held (or there was none): save it under a
                // new life first, then make the new journal. Killed in between, the new snapshot
                // does not match the old journal, which is then ignored; it held nothing more.
                let life = new_life();
                file.save_tagged(
                    table,
                    Some(JournalTag {
                        life,
                        generation: 1,
                    }),
                )?;
                report.saved_at_start = true;
                let handle = create(&path, life, capacity)?;
                Journal::new(path.clone(), handle, capacity, life, 1, fsync).map_err(io)?
            }
        };
        Ok((journal, report))
    }

    fn new(
        path: PathBuf,
        file: File,
        capacity: u64,
        life: u64,
        saved: u32,
        fsync: bool,
    ) -> io::Result<Journal> {
        let words = (HEADER_BYTES + 2 * capacity as usize * RECORD_BYTES) / 8;
        if file.metadata()?.len() < (words * 8) as u64 {
            // A truncated file: mapped pages past its end would fault.
            file.set_len((words * 8) as u64)?;
        }
        let map = Mapping::new(&file, words)?;
        let sync = if fsync {
            Some(Syncer::start(map.clone_handle())?)
        } else {
            None
        };
        Ok(Journal {
            path,
            map,
            capacity,
            life,
            // The snapshot on disk names `saved`, and no record of it was found (or the journal is
            // new): its half is free from its start.
            state: AtomicU64::new(pack(saved, 0)),
            saved: AtomicU32::new(saved),
            unjournalled: AtomicU64::new(0),
            early: tokio::sync::Notify::new(),
            saving: std::sync::Mutex::new(()),
            sync,
            _file: file,
        })
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that `digest` was committed.
    #[inline]
    pub fn commit(&self, digest: Digest) {
        self.append(Kind::Commit, digest);
    }

    /// Records that `digest` was erased.
    #[inline]
    pub fn erase(&self, digest: Digest) {
        self.append(Kind::Erase, digest);
    }

    #[inline]
    fn append(&self, kind: Kind, digest: Digest) {
        // SeqCst: the table's update came before this add, and a snapshot switches the
        // generation (a SeqCst swap) before it reads the table. A record that got the old
        // generation was therefore made by an update the snapshot sees.
        let state = self.state.fetch_add(1, Ordering::SeqCst);
        let (generation, place) = unpack(state);
        let place = u64::from(place);
        if place >= self.capacity {
            self.full(state);
            return;
        }
        if place == self.capacity / 2 {
            self.early.notify_one();
        }
        // A place of generation `g` lies in half `g % 2`, which generation `g + 2` reuses one
        // snapshot later: a task stalled for a whole snapshot interval between the add above
        // and the stores below would overwrite a newer record (and its own would be skipped as
        // stale). We accept that: the interval is at least 100 ms and the gap is a few
        // instructions.
        let half = u64::from(generation % 2);
        let first = HEADER_BYTES / 8 + ((half * self.capacity + place) as usize) * RECORD_WORDS;
        let words = self.map.words();
        let (hi, lo) = (digest.hi(), digest.lo());
        words[first].store(hi.to_le(), Ordering::Relaxed);
        words[first + 1].store(lo.to_le(), Ordering::Relaxed);
        // The tag goes last: a record cut short by a kill keeps an older tag, whose check
        // does not match the new digest.
        words[first + 2].store(tag(hi, lo, generation, kind).to_le(), Ordering::Release);
    }

    #[cold]
    fn full(&self, state: u64) {
        self.unjournalled.fetch_add(1, Ordering::Relaxed);
        let (generation, place) = unpack(state);
        if place > 1 << 31 {
            // Keep the place from carrying into the generation.
            let _ = self.state.compare_exchange(
                state.wrapping_add(1),
                pack(generation, self.capacity as u32),
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
        }
        self.early.notify_one();
    }

    /// Whether commits wait for their record to be on disk (`store.journal_fsync`).
    pub fn syncs(&self) -> bool {
        self.sync.is_some()
    }

    /// With `store.journal_fsync`, waits until every record appended before this call is on
    /// disk; otherwise returns at once.
    pub async fn synced(&self) {
        if let Some(sync) = &self.sync {
            sync.wait().await;
        }
    }

    /// Commits and erases that found the journal full since the start.
    pub fn unjournalled(&self) -> u64 {
        self.unjournalled.load(Ordering::Relaxed)
    }

    /// Completes when the journal asks for a snapshot before the interval is up.
    pub async fn wants_snapshot(&self) {
        self.early.notified().await;
    }

    /// Writes a snapshot of `table` to `file` and starts a new generation of the journal.
    ///
    /// # Errors
    ///
    /// As [`TableFile::save_tagged`]; the journal then keeps every record the file on disk
    /// needs.
    pub fn save(&self, file: &TableFile, table: &Table) -> Result<SaveReport, TableFileError> {
        let _one_at_a_time = self
            .saving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let saved = self.saved.load(Ordering::Relaxed);
        let (mut generation, _) = unpack(self.state.load(Ordering::SeqCst));
        if generation == saved {
            // The other half holds generation `saved - 1`, which the file on disk no longer
            // needs: start the new generation there.
            generation = next(generation);
            self.state.swap(pack(generation, 0), Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        let report = file.save_tagged(
            table,
            Some(JournalTag {
                life: self.life,
                generation,
            }),
        )?;
        self.saved.store(generation, Ordering::Relaxed);
        Ok(report)
    }
}

/// The journal beside table file `path`: `PATH.journal`.
pub fn journal_path(path: &Path) -> PathBuf {
    path.with_file_name(format!(
        "{}.journal",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ))
}

fn pack(generation: u32, place: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(place)
}

fn unpack(state: u64) -> (u32, u32) {
    ((state >> 32) as u32, state as u32)
}

/// The generation after `generation`; 0 is never one, so an all-zero record never matches.
fn next(generation: u32) -> u32 {
    generation.wrapping_add(1).max(1)
}

fn tag(hi: u64, lo: u64, generation: u32, kind: Kind) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_le_bytes());
    bytes[8..].copy_from_slice(&lo.to_le_bytes());
    let seed = (u64::from(generation) << 1) | kind as u64;
    let check = xxh3_64_with_seed(&bytes, seed) & 0x7fff_ffff;
    (u64::from(generation) << 32) | ((kind as u64) << 31) | check
}

struct Header {
    life: u64,
    capacity: u64,
}

/// The header of an existing journal, or why it is not one this version can use.
fn read_header(file: &mut File) -> io::Result<Result<Header, String>> {
    let mut bytes = vec![0u8; HEADER_BYTES];
    let mut read = 0;
    while read < HEADER_BYTES {
        match file.read(&mut bytes[read..])? {
            0 => return Ok(Err(format!("it is {read} bytes, shorter than its header"))),
            n => read += n,
        }
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
    if &bytes[..8] != MAGIC || xxh3_64(&bytes[..HEADER_BYTES - 8]) != u64_at(HEADER_BYTES - 8) {
        return Ok(Err("its header is damaged".into()));
    }
    if u32_at(8) != FORMAT_VERSION || u32_at(12) as usize != RECORD_BYTES {
        return Ok(Err(format!(
            "it is format version {} (this version reads {FORMAT_VERSION})",
            u32_at(8)
        )));
    }
    let capacity = u64_at(24);
    if !(1..=MAX_CAPACITY).contains(&capacity) {
        return Ok(Err(format!("its header names {capacity} records per half")));
    }
    Ok(Ok(Header {
        life: u64_at(16),
        capacity,
    }))
}

/// A new journal file for `life` (any old one is replaced), synced with its directory.
fn create(path: &Path, life: u64, capacity: u64) -> Result<File, TableFileError> {
    let io = |cause| TableFileError::Io {
        path: path.to_owned(),
        cause,
    };
    let mut file = open_regular(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true),
    )
    .map_err(|e| e.at(path))?;
    write_header(&mut file, path, life, capacity).map_err(io)?;
    Ok(file)
}

fn write_header(file: &mut File, path: &Path, life: u64, capacity: u64) -> io::Result<()> {
    let mut header = vec![0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
    header[16..24].copy_from_slice(&life.to_le_bytes());
    header[24..32].copy_from_slice(&capacity.to_le_bytes());
    let checksum = xxh3_64(&header[..HEADER_BYTES - 8]);
    header[HEADER_BYTES - 8..].copy_from_slice(&checksum.to_le_bytes());
    file.write_all(&header)?;
    // The records are a hole until written: the file takes disk space as it is used.
    file.set_len((HEADER_BYTES + 2 * capacity as usize * RECORD_BYTES) as u64)?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A life no other journal has had: the clock, the process and an address, hashed.
fn new_life() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let local = 0u8;
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&now.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    bytes.extend_from_slice(&(std::ptr::addr_of!(local) as usize).to_le_bytes());
    xxh3_64(&bytes).max(1)
}

#[derive(Default)]
struct Replayed {
    commits: u64,
    erases: u64,
}

/// Applies the records of generation `first` (its half), then of the next generation (the
/// other half), each half in order, onto `table`.
fn replay(file: &mut File, header: &Header, first: u32, table: &Table) -> io::Result<Replayed> {
    let mut replayed = Replayed::default();
    let half_bytes = header.capacity as usize * RECORD_BYTES;
    let mut buf = vec![0u8; (1 << 20) * RECORD_BYTES];
    for generation in [first, next(first)] {
        let start = HEADER_BYTES + (generation % 2) as usize * half_bytes;
        let mut file = &*file;
        std::io::Seek::seek(&mut file, io::SeekFrom::Start(start as u64))?;
        let mut left = half_bytes;
        while left > 0 {
            let want = left.min(buf.len());
            // A short file (truncated) ends the half: what is missing was never there.
            let got = read_full(&mut file, &mut buf[..want])?;
            for record in buf[..got - got % RECORD_BYTES].chunks_exact(RECORD_BYTES) {
                let word = |i: usize| {
                    u64::from_le_bytes(record[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                };
                let (hi, lo, stored) = (word(0), word(1), word(2));
                if (stored >> 32) as u32 != generation {
                    continue;
                }
                let kind = if (stored >> 31) & 1 == 1 {
                    Kind::Erase
                } else {
                    Kind::Commit
                };
                if tag(hi, lo, generation, kind) != stored {
                    continue;
                }
                let digest = Digest::from_u128((u128::from(hi) << 64) | u128::from(lo));
                match kind {
                    Kind::Commit => {
                        table.contains_and_add(digest);
                        replayed.commits += 1;
                    }
                    Kind::Erase => {
                        table.erase(digest);
                        replayed.erases += 1;
                    }
                }
            }
            if got < want {
                break;
            }
            left -= want;
        }
    }
    Ok(replayed)
}

fn read_full(file: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// A shared, writable memory map of a whole file, seen as 64-bit words.
struct Mapping {
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
    fn new(file: &File, words: usize) -> io::Result<Mapping> {
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
    fn new(_file: &File, _words: usize) -> io::Result<Mapping> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the journal needs a Unix memory map",
        ))
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a page-aligned mapping of `words * 8` readable and writable bytes
        // that lives as long as `inner` (unmapped in its `Drop`). Any bytes are a valid
        // `AtomicU64`, and every access through the slice is atomic, so other threads (and
        // the kernel writing the pages back) never see a data race.
        unsafe { std::slice::from_raw_parts(self.inner.ptr.as_ptr(), self.inner.words) }
    }

    fn clone_handle(&self) -> Mapping {
        Mapping {
            inner: self.inner.clone(),
        }
    }

    /// Writes the mapping's dirty pages to the file and waits for the disk.
    #[cfg(target_os = "linux")]
    fn sync(&self) -> io::Result<()> {
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
    fn sync(&self) -> io::Result<()> {
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
struct Syncer {
    /// Syncs started so far; a waiter needs one numbered above what it read.
    started: Arc<AtomicU64>,
    /// Syncs finished so far.
    finished: tokio::sync::watch::Receiver<u64>,
    /// Wakes the thread; dropping it (with the journal) ends the thread.
    wake: std::sync::mpsc::SyncSender<()>,
}

impl Syncer {
    fn start(map: Mapping) -> io::Result<Syncer> {
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

    async fn wait(&self) {
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

#[cfg(test)]
mod tests;
