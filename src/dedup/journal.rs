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

mod file;
mod mapping;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use file::{
    create, new_life, next, pack, read_header, replay, tag, unpack, Kind, HEADER_BYTES,
    MAX_CAPACITY, MIN_CAPACITY, RECORD_BYTES, RECORD_WORDS,
};
use mapping::{Mapping, Syncer};

use crate::dedup::table::Table;
use crate::dedup::table_file::{
    open_regular, JournalTag, OpenError, SaveReport, TableFile, TableFileError,
};
use crate::dedup::Digest;

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
pub(crate) fn journal_path(path: &Path) -> PathBuf {
    path.with_file_name(format!(
        "{}.journal",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ))
}

#[cfg(test)]
mod tests;
