//! The in-process table kept in a file, so that a restarted process keeps its memory.
//!
//! The table itself stays in anonymous memory (huge pages, the hot path untouched); a
//! [`TableFile`] writes snapshots of it: at a graceful stop and every `snapshot_interval`, to a
//! temporary file beside the table file, fsynced, then renamed over it (and the directory
//! fsynced), so the file is always one complete snapshot. After a kill -9 what was claimed
//! since the last snapshot is forgotten: at most one interval plus the time a snapshot takes.
//!
//! # File format (versions 1 and 2)
//!
//! ```text
//! offset  size  field
//!      0     8  magic "NSQDDTBL"
//!      8     4  format version, little-endian like every number here: 2 while a resize
//!               keeps previous generations (see `table`'s `generations`), else 1, which
//!               earlier versions of nsq-dedupe read
//!     12     4  slot layout (1: 58-bit fingerprint, cursor, lock, state; see `table`;
//!               2: the same slots followed by a time per slot, for `max_age`)
//!     16     8  sets (of the current generation)
//!     24     4  ways
//!     28     4  reserved (0)
//!     32     8  xxh3-64 of the slot bytes
//!     40     8  when the snapshot was taken, seconds since the Unix epoch
//!     48     2  length of the digest identity, then the identity (UTF-8, at most 1024 bytes):
//!               the key rule and digest, e.g. "json:/id xxh3" or "body blake3-keyed:1a2b3c4d"
//!   2048     4  (version 2) previous generations, at most 32
//!   2056     8  (version 2) when the resize happened, seconds since the Unix epoch
//!   2064     8  (version 2) new entries the current generation has taken since
//!   2072    16  (version 2) per previous generation, newest first: sets (8), ways (4), 0 (4)
//!   3072     8  the journal this snapshot goes with (see `journal`): its life, 0 for none
//!   3080     4  the journal generation whose records follow this snapshot
//!   4088     8  xxh3-64 of bytes 0..4088
//!   4096        per generation, current first:
//!               the slots, 8 bytes each, little-endian
//!               (layout 2) the slots' times, 8 bytes each (see `table::timed`)
//! ```
//!
//! A file whose current generation has another shape than the settings ask for is resized
//! ([`OnMismatch::Resize`], the default): its generations become the previous ones behind a
//! new, empty table of the shape asked for.
//!
//! A layout-1 file loads into a table with `max_age` (its entries have no time and never
//! expire), and a layout-2 file into one without (the times are dropped): `max_age` can be
//! turned on, off or changed across a restart.
//!
//! A file whose header does not match the settings otherwise (its key rule, digest or slot
//! layout; its shape too with [`OnMismatch::Error`]) is an error that says what differs (never
//! silently overwritten); so is a truncated or corrupt one, unless the policy is
//! [`OnMismatch::Recreate`], which moves the old file aside and starts empty, logged as an
//! error. Two processes never use one file: the first holds an exclusive lock (`flock`) on
//! `PATH.lock`, which also records its process ID for the other's error message, and removes
//! it when it lets the file go (also after a failed start).
//!
//! Only regular files are opened, renamed or replaced: a table file, lock or temporary file
//! that is a directory, a FIFO, a device or a socket is an error naming it (never waited on,
//! written to or moved aside). A snapshot that fails leaves no temporary file behind.
//!
//! A table loaded from a file releases every entry that was in flight: the process that claimed
//! them never finished those messages, so nsqd delivers them again and they must pass.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::Xxh3;

use std::sync::Arc;

mod error;
mod header;
mod lock;
mod regular;

use error::recreate;
pub use error::TableFileError;
use header::Header;
use lock::{lock, lock_path};
use regular::{kind_of, not_a_file};
pub(crate) use regular::{open_regular, OpenError};

use crate::dedup::clock::Clock;
use crate::dedup::table::{ResizeState, Restored, Table};
use crate::dedup::Geometry;
use crate::wording::Wording;

/// The slot layout of `table`: 58-bit fingerprint, cursor, lock, state; no time.
const SLOT_LAYOUT: u32 = 1;
/// The same slots followed by their times (`max_age`).
const SLOT_LAYOUT_TIMED: u32 = 2;
const HEADER_BYTES: usize = 4096;

/// What to do with a table file that does not match the settings or is damaged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMismatch {
    /// The default. A file of another table size is resized: its table is kept read-only as
    /// the previous generation behind a new one of the size asked for (see `table`'s
    /// `generations`), so nothing it remembers is forgotten. Any other difference (key rule,
    /// digest, slot layout) and damage stop with an error, as with [`OnMismatch::Error`]: a
    /// memory is never dropped without someone deciding so.
    #[default]
    Resize,
    /// Stop with an error that says what differs, the table size included.
    Error,
    /// Move the old file aside (`PATH.bad-<unix time>`), start with an empty table, and log it
    /// as an error.
    Recreate,
}

impl OnMismatch {
    /// The names accepted in the config file and on the command line.
    pub const NAMES: [(&'static str, OnMismatch); 3] = [
        ("resize", OnMismatch::Resize),
        ("error", OnMismatch::Error),
        ("recreate", OnMismatch::Recreate),
    ];
}

/// What opening a table file found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Entries loaded (done ones; in-flight ones are released).
    pub entries: u64,
    /// In-flight entries of the previous process, released.
    pub released_in_flight: u64,
    /// When the loaded snapshot was taken; `None` when the table started empty.
    pub snapshot_at: Option<SystemTime>,
    /// The file was damaged or did not match and was moved aside (`Recreate`): why, and
    /// where to.
    pub recreated: Option<Wording>,
    /// The journal the snapshot goes with, when it was saved with one.
    pub journal: Option<JournalTag>,
    /// The file's table had another shape, this one: it was resized, and is now the previous
    /// generation.
    pub resized_from: Option<Geometry>,
}

/// Which journal records follow a snapshot: those of generation `generation` of the journal
/// whose life is `life` (see `journal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalTag {
    /// The journal's life: a random number chosen when its file was made.
    pub life: u64,
    /// The first generation whose records are not (all) in the snapshot.
    pub generation: u32,
}

/// What one snapshot cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveReport {
    /// Bytes written.
    pub bytes: u64,
    /// How long writing, syncing and renaming took.
    pub took: Duration,
}

/// A table file, locked by this process for as long as the value lives.
#[derive(Debug)]
pub struct TableFile {
    path: PathBuf,
    identity: String,
    /// Holds the `flock`; closing it releases the lock.
    _lock: File,
    /// One snapshot at a time: they share the temporary file.
    saving: std::sync::Mutex<()>,
}

/// Logs that the table file at `path`, whose table had shape `from`, was resized to `to` (see
/// [`LoadReport::resized_from`]).
#[cfg(feature = "sidecar")]
pub(crate) fn log_resize(path: &Path, from: Geometry, to: Geometry) {
    tracing::info!(
        table_file = %path.display(),
        from_slots = from.slots(),
        to_slots = to.slots(),
        "Table file resized from {} to {} slots: its entries stay, read-only, as the previous \
         generation until the new table has turned over (or max_age has passed).",
        from.slots(),
        to.slots(),
    );
}

impl TableFile {
    /// Locks `path` and loads the table it holds, or a new empty table when there is no file.
    ///
    /// `identity` names how digests are made (the key rule and the digest algorithm): a file
    /// written with another identity holds digests of other things.
    ///
    /// # Errors
    ///
    /// [`TableFileError`] when the file is held by another process, cannot be read, was
    /// written for another geometry or identity, or is damaged (the last two only with
    /// [`OnMismatch::Error`]).
    pub fn open(
        path: &Path,
        geometry: Geometry,
        identity: &str,
        on_mismatch: OnMismatch,
        max_age: Option<(Duration, Arc<dyn Clock>)>,
    ) -> Result<(TableFile, Table, LoadReport), TableFileError> {
        Self::open_sized(path, geometry, identity, on_mismatch, max_age, false)
    }

    /// [`TableFile::open`] for a table that sizes itself (`keep_shape`): a file's table of
    /// another size but the same ways is taken at its own size (it grew to it), not resized
    /// to `geometry`, which is only the size such a table starts at without a file.
    ///
    /// # Errors
    ///
    /// As [`TableFile::open`].
    pub(crate) fn open_sized(
        path: &Path,
        geometry: Geometry,
        identity: &str,
        on_mismatch: OnMismatch,
        max_age: Option<(Duration, Arc<dyn Clock>)>,
        keep_shape: bool,
    ) -> Result<(TableFile, Table, LoadReport), TableFileError> {
        let make = |geometry: Geometry| match &max_age {
            None => Table::new(geometry),
            Some((age, clock)) => Table::with_max_age(geometry, *age, clock.clone()),
        };
        let lock = lock(path)?;
        let file = TableFile {
            path: path.to_owned(),
            identity: identity.to_owned(),
            _lock: lock,
            saving: std::sync::Mutex::new(()),
        };
        match file.load(
            geometry,
            on_mismatch == OnMismatch::Resize,
            keep_shape,
            &make,
        ) {
            Ok(loaded) => Ok((file, loaded.0, loaded.1)),
            Err(error @ (TableFileError::Mismatch { .. } | TableFileError::Corrupt { .. }))
                if on_mismatch == OnMismatch::Recreate =>
            {
                let stamp = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                let aside = path.with_file_name(format!(
                    "{}.bad-{stamp}",
                    path.file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
                ));
                std::fs::rename(path, &aside).map_err(|cause| TableFileError::Io {
                    path: path.to_owned(),
                    cause,
                })?;
                let reason = error
                    .recreatable()
                    .unwrap_or_default()
                    .text(format!("; moved to {}", aside.display()));
                let report = LoadReport {
                    recreated: Some(reason),
                    ..LoadReport::default()
                };
                Ok((file, make(geometry)?, report))
            }
            Err(error) => Err(error),
        }
    }

    /// The table file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the file into tables made by `make`: a table of `requested` shape when there is
    /// no file; otherwise the file's generations at their own shapes, resized to `requested`
    /// when the file's current generation has another shape and `resize` allows it (with
    /// `keep_shape`, only when it has other ways).
    fn load(
        &self,
        requested: Geometry,
        resize: bool,
        keep_shape: bool,
        make: &dyn Fn(Geometry) -> Result<Table, crate::error::TableError>,
    ) -> Result<(Table, LoadReport), TableFileError> {
        let io = |cause| TableFileError::Io {
            path: self.path.clone(),
            cause,
        };
        let corrupt = |reason: String| TableFileError::Corrupt {
            path: self.path.clone(),
            reason,
            recreate: recreate(),
        };
        let mut file = match open_regular(&self.path, OpenOptions::new().read(true)) {
            Ok(file) => file,
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                return Ok((make(requested)?, LoadReport::default()))
            }
            Err(error) => return Err(error.at(&self.path)),
        };
        let mut header = vec![0u8; HEADER_BYTES];
        let len = file.metadata().map_err(io)?.len();
        if len < HEADER_BYTES as u64 {
            return Err(corrupt(format!(
                "{len} bytes, shorter than its {HEADER_BYTES}-byte header"
            )));
        }
        file.read_exact(&mut header).map_err(io)?;
        let header = Header::parse(&header).map_err(corrupt)?;
        let keep_shape = keep_shape && header.ways == requested.ways();
        let differs = self.differences(&header, requested, resize || keep_shape);
        if !differs.is_empty() {
            return Err(TableFileError::Mismatch {
                path: self.path.clone(),
                differs: differs.join(", and "),
                recreate: recreate(),
            });
        }
        // The file's generations, current first, at the shapes they were written with.
        let shapes = std::iter::once((header.sets, header.ways))
            .chain(header.previous.iter().copied())
            .map(|(sets, ways)| {
                sets.checked_mul(u64::from(ways))
                    .and_then(|slots| Geometry::new(slots, ways).ok())
                    .filter(|geometry| geometry.sets() == sets)
                    .ok_or_else(|| {
                        corrupt(format!(
                            "its header names a table of {sets} sets of {ways} ways"
                        ))
                    })
            })
            .collect::<Result<Vec<Geometry>, TableFileError>>()?;
        let copies = if header.layout == SLOT_LAYOUT_TIMED {
            2
        } else {
            1
        };
        let expected = HEADER_BYTES as u64
            + copies * shapes.iter().map(|shape| shape.memory_bytes()).sum::<u64>();
        if len != expected {
            return Err(corrupt(format!(
                "{len} bytes where its header promises {expected} (truncated?)"
            )));
        }
        let mut hasher = Xxh3::new();
        let mut report = LoadReport {
            snapshot_at: Some(UNIX_EPOCH + Duration::from_secs(header.written_at)),
            journal: header.journal,
            ..LoadReport::default()
        };
        let mut buf = vec![0u8; 8 << 20];
        file.seek(io::SeekFrom::Start(HEADER_BYTES as u64))
            .map_err(io)?;
        let mut generations = Vec::with_capacity(shapes.len());
        for shape in &shapes {
            let table = make(*shape)?;
            let timed = header.layout == SLOT_LAYOUT_TIMED;
            read_generation(&mut file, &table, timed, &mut buf, &mut hasher, &mut report)
                .map_err(io)?;
            generations.push(table);
        }
        if hasher.digest() != header.slot_checksum {
            return Err(corrupt("its slots do not match their checksum".into()));
        }
        let current = generations.remove(0);
        let state = ResizeState {
            resized_at_s: header.resized_at_s,
            inserts: header.inserts,
        };
        let mut table = Table::with_previous(current, generations, state);
        if shapes[0] != requested && !keep_shape {
            report.resized_from = Some(shapes[0]);
            table = table.resize(requested)?;
        }
        Ok((table, report))
    }

    /// What makes the file described by `header` another table than this one of shape
    /// `geometry`: its slot layout, its digests, and its shape unless it may be resized.
    fn differences(&self, header: &Header, geometry: Geometry, resize: bool) -> Vec<String> {
        let mut differs = Vec::new();
        if header.layout != SLOT_LAYOUT && header.layout != SLOT_LAYOUT_TIMED {
            differs.push(format!(
                "slot layout {} (this version reads {SLOT_LAYOUT} and {SLOT_LAYOUT_TIMED})",
                header.layout
            ));
        }
        if !resize && (header.sets, header.ways) != (geometry.sets(), geometry.ways()) {
            differs.push(format!(
                "{} slots in sets of {} ways, not {} in sets of {}",
                header.sets * u64::from(header.ways),
                header.ways,
                geometry.slots(),
                geometry.ways()
            ));
        }
        if header.identity != self.identity {
            differs.push(format!(
                "digests of {:?}, not {:?}",
                header.identity, self.identity
            ));
        }
        differs
    }

    /// Writes a snapshot of `table`: a temporary file beside the table file, fsynced, renamed
    /// over it, and the directory fsynced.
    ///
    /// # Errors
    ///
    /// [`TableFileError::Io`]; the previous snapshot is then still in place.
    pub fn save(&self, table: &Table) -> Result<SaveReport, TableFileError> {
        self.save_tagged(table, None)
    }

    /// [`save`](TableFile::save), recording which journal records follow the snapshot.
    ///
    /// # Errors
    ///
    /// As for [`save`](TableFile::save).
    pub fn save_tagged(
        &self,
        table: &Table,
        journal: Option<JournalTag>,
    ) -> Result<SaveReport, TableFileError> {
        let _one_at_a_time = self
            .saving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let started = Instant::now();
        let io = |cause| TableFileError::Io {
            path: self.path.clone(),
            cause,
        };
        let temporary = self.path.with_file_name(format!(
            ".{}.tmp",
            self.path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        // A leftover temporary file (a crash mid-snapshot) is replaced only if it is a
        // regular file; the new one is created, never opened through a name that exists.
        match std::fs::symlink_metadata(&temporary) {
            Ok(meta) if meta.file_type().is_file() => {
                std::fs::remove_file(&temporary).map_err(io)?;
            }
            Ok(meta) => {
                return Err(TableFileError::NotAFile {
                    path: temporary,
                    kind: kind_of(&meta.file_type()),
                })
            }
            Err(_) => {}
        }
        if let Some(kind) = not_a_file(&self.path) {
            return Err(TableFileError::NotAFile {
                path: self.path.clone(),
                kind,
            });
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)
            .map_err(io)?;
        let written = self.write_snapshot(table, journal, file, &temporary);
        if written.is_err() {
            // Nothing of a failed snapshot stays: the previous one is still in place.
            let _ = std::fs::remove_file(&temporary);
        }
        let bytes = written?;
        Ok(SaveReport {
            bytes,
            took: started.elapsed(),
        })
    }

    /// Writes a snapshot of `table` (each of its generations, current first) to `file` (the
    /// temporary file `temporary`), syncs it and renames it over the table file; the bytes
    /// written.
    fn write_snapshot(
        &self,
        table: &Table,
        journal: Option<JournalTag>,
        mut file: File,
        temporary: &Path,
    ) -> Result<u64, TableFileError> {
        let io = |cause| TableFileError::Io {
            path: self.path.clone(),
            cause,
        };
        // The header goes last, once the checksum is known: write a placeholder first. The
        // words go out in chunks as large as a buffered writer's buffer would be, so the file
        // is written directly.
        file.write_all(&[0u8; HEADER_BYTES]).map_err(io)?;
        let mut hasher = Xxh3::new();
        let mut chunk = Vec::with_capacity(8 << 20);
        let timed = table.max_age().is_some();
        let (previous, resize) = table.previous_generations();
        let mut bytes = HEADER_BYTES as u64;
        for generation in std::iter::once(table).chain(previous.iter()) {
            write_words(
                generation.snapshot_words(),
                &mut chunk,
                &mut hasher,
                &mut file,
            )
            .map_err(io)?;
            if timed {
                let times =
                    (0..generation.slots() as usize).map(|i| generation.time_word(i).unwrap_or(0));
                write_words(times, &mut chunk, &mut hasher, &mut file).map_err(io)?;
            }
            bytes += generation.memory_bytes() * if timed { 2 } else { 1 };
        }
        let header = Header {
            layout: if timed {
                SLOT_LAYOUT_TIMED
            } else {
                SLOT_LAYOUT
            },
            sets: table.geometry().sets(),
            ways: table.geometry().ways(),
            slot_checksum: hasher.digest(),
            written_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
            identity: self.identity.clone(),
            journal,
            previous: previous
                .iter()
                .map(|t| (t.geometry().sets(), t.geometry().ways()))
                .collect(),
            resized_at_s: resize.map_or(0, |state| state.resized_at_s),
            inserts: resize.map_or(0, |state| state.inserts),
        };
        file.seek(io::SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header.encode()).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(temporary, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(bytes)
    }
}

impl Drop for TableFile {
    /// Removes the lock file while still holding its lock: a process waiting for it finds it
    /// gone (see `lock`), and no `.lock` stays beside a table file nobody uses.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(lock_path(&self.path));
    }
}

/// Reads one generation's slots (and, in a `timed` file, their times) into `table`, adding
/// the bytes to `hasher` and the entries to `report`.
fn read_generation(
    file: &mut File,
    table: &Table,
    timed: bool,
    buf: &mut [u8],
    hasher: &mut Xxh3,
    report: &mut LoadReport,
) -> io::Result<()> {
    let slots = table.slots() as usize;
    let mut index = 0usize;
    while index < slots {
        let n = ((slots - index) * 8).min(buf.len());
        file.read_exact(&mut buf[..n])?;
        hasher.update(&buf[..n]);
        for chunk in buf[..n].chunks_exact(8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            match table.restore_slot(index, word) {
                Restored::Empty => {}
                Restored::Done => report.entries += 1,
                Restored::Released => report.released_in_flight += 1,
            }
            index += 1;
        }
    }
    if timed {
        let mut index = 0usize;
        while index < slots {
            let n = ((slots - index) * 8).min(buf.len());
            file.read_exact(&mut buf[..n])?;
            hasher.update(&buf[..n]);
            for chunk in buf[..n].chunks_exact(8) {
                table.restore_time(
                    index,
                    u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                );
                index += 1;
            }
        }
    }
    Ok(())
}

/// Writes `words` little-endian to `out` in chunks of `chunk`'s capacity, adding each chunk to
/// `hasher`; `chunk` is left empty.
fn write_words(
    words: impl Iterator<Item = u64>,
    chunk: &mut Vec<u8>,
    hasher: &mut Xxh3,
    out: &mut impl Write,
) -> std::io::Result<()> {
    for word in words {
        chunk.extend_from_slice(&word.to_le_bytes());
        if chunk.len() == chunk.capacity() {
            hasher.update(chunk);
            out.write_all(chunk)?;
            chunk.clear();
        }
    }
    hasher.update(chunk);
    out.write_all(chunk)?;
    chunk.clear();
    Ok(())
}

#[cfg(test)]
mod tests;
