//! The `file` sink: archives each unique body as one line of a file, as `nsq_to_file` does,
//! with its flags and their meanings.
//!
//! Files are written in the work directory and moved to the output directory once closed;
//! they are named by `filename_format` (`<TOPIC>`, `<HOST>`, `<REV>`, `<DATETIME>`, `<PID>`;
//! `.gz` is appended with gzip when the format does not end so), and a file is closed (rotated)
//! when its `<DATETIME>` text would change, when it reaches `rotate_size` bytes, and after
//! `rotate_interval`. `<REV>` is empty, or `-1`, `-2`, ... when a file of that name exists.
//! Datetimes are UTC.
//!
//! Never acknowledged early: one writer thread, behind the sink's [`Batcher`], takes every
//! record queued, writes them, and fsyncs the file (`sync_data`) before it answers any of them,
//! so a message is FINished only once its record is on disk. One fsync covers every record
//! queued meanwhile (group commit).
//! `sync_interval` makes the thread wait that long after a batch's first record before writing
//! it, gathering more records per fsync: fewer fsyncs, each record waiting longer. With gzip,
//! each batch is one gzip member (RFC 1952 allows a file of several; `gunzip` and `zcat` read
//! them all), so after a kill -9 the file is readable up to its last sync, and a closed file is
//! a complete gzip stream. A write or sync error fails every record of its batch (their
//! messages are requeued), cuts the file back to the end of its last synced batch (so no file
//! ends in part of a record, and a gzip file is whole members), closes it, and the next batch
//! opens a new one; a file whose first batch failed is removed, not left empty (an empty
//! file is not a gzip stream). So after a full disk every file in the output directory reads
//! cleanly to its end.

pub(super) mod settings;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::batcher::{Batcher, Flush, Results, Settings};
use super::{BuiltIn, Handler, HandlerError};
pub(crate) use settings::sink_keys;

/// `nsq_to_file`'s default file name.
pub const DEFAULT_FILENAME_FORMAT: &str = "<TOPIC>.<HOST><REV>.<DATETIME>.log";
/// `nsq_to_file`'s default datetime format: one file per hour.
pub const DEFAULT_DATETIME_FORMAT: &str = "%Y-%m-%d_%H";
/// The gzip level when none is given.
pub const DEFAULT_GZIP_LEVEL: u32 = 6;
/// How long records gather before each write when none is given: none, each write goes as
/// soon as the disk is free.
pub(crate) const DEFAULT_SYNC_INTERVAL: Duration = Duration::ZERO;

/// The most records one batch carries (a request of more is written alone): a bound on the
/// buffer, not a wait.
const MAX_BATCH_RECORDS: usize = 4096;

/// How often the writer wakes while idle, so that an idle file still rotates on time.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// Settings of a [`FileSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSinkConfig {
    /// Where closed files go.
    pub output_dir: PathBuf,
    /// Where files are written while open. Defaults to: the output directory.
    pub work_dir: Option<PathBuf>,
    /// The topic, for `<TOPIC>`.
    pub topic: String,
    /// File name with placeholders. Defaults to: [`DEFAULT_FILENAME_FORMAT`].
    pub filename_format: String,
    /// strftime-like format of `<DATETIME>` (`%Y %m %d %H %M %S %%`). Defaults to:
    /// [`DEFAULT_DATETIME_FORMAT`].
    pub datetime_format: String,
    /// Close a file this long after it was opened. Defaults to: never.
    pub rotate_interval: Option<Duration>,
    /// Close a file once it holds this many bytes. Defaults to: never.
    pub rotate_size: Option<u64>,
    /// Compress with gzip at this level (1-9). Defaults to: off.
    pub gzip_level: Option<u32>,
    /// Wait this long after a batch's first record before writing and syncing it. Defaults
    /// to: zero (sync as soon as the writer is free).
    pub sync_interval: Duration,
    /// `<HOST>`. Defaults to: the short host name.
    pub host_identifier: String,
    /// Remove a file that got no record instead of moving it to the output directory.
    pub skip_empty_files: bool,
}

impl FileSinkConfig {
    /// `nsq_to_file`'s defaults for `topic`, writing to `output_dir`.
    pub fn new(output_dir: PathBuf, topic: String) -> Self {
        FileSinkConfig {
            output_dir,
            work_dir: None,
            topic,
            filename_format: DEFAULT_FILENAME_FORMAT.to_owned(),
            datetime_format: DEFAULT_DATETIME_FORMAT.to_owned(),
            rotate_interval: None,
            rotate_size: None,
            gzip_level: None,
            sync_interval: DEFAULT_SYNC_INTERVAL,
            host_identifier: crate::nsq::short_hostname(),
            skip_empty_files: false,
        }
    }

    /// Checks what can be checked before anything is written.
    ///
    /// # Errors
    ///
    /// The setting's key (`sink.output_dir`) and what is wrong with it.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, dir) in [
            ("sink.output_dir", Some(&self.output_dir)),
            ("sink.work_dir", self.work_dir.as_ref()),
        ] {
            if let Some(dir) = dir {
                if !dir.is_dir() {
                    return Err((key, "no such directory".into()));
                }
            }
        }
        // Names never leave their directory: whatever the placeholders become, the file is
        // written in the work directory and moved to the output directory, nowhere else.
        for (key, text) in [
            ("sink.filename_format", &self.filename_format),
            ("sink.datetime_format", &self.datetime_format),
            ("sink.host_identifier", &self.host_identifier),
        ] {
            if text.contains(['/', '\0']) {
                return Err((
                    key,
                    "must make a file name, not a path: no `/` (files are written only in the \
                     output directory)"
                        .into(),
                ));
            }
        }
        if !self.filename_format.contains("<REV>") {
            return Err((
                "sink.filename_format",
                "must contain <REV>, so that a second file of the same name gets a revision".into(),
            ));
        }
        if let Err(bad) = check_datetime_format(&self.datetime_format) {
            return Err((
                "sink.datetime_format",
                format!("{bad} is not supported; use %Y %m %d %H %M %S or %%"),
            ));
        }
        if let Some(level) = self.gzip_level {
            if !(1..=9).contains(&level) {
                return Err((
                    "sink.gzip_level",
                    "must be 1 (fastest) to 9 (smallest)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Appends each body and a newline to the current file, fsynced before success is reported.
pub struct FileSink {
    /// The writer thread's queue. The thread ends when this is closed or dropped.
    batcher: Batcher,
}

impl std::fmt::Debug for FileSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSink").finish_non_exhaustive()
    }
}

impl FileSink {
    /// Starts the writer thread. No file is opened before the first record.
    ///
    /// # Errors
    ///
    /// An invalid configuration: the setting's key and what is wrong.
    pub fn new(config: FileSinkConfig) -> Result<Self, (&'static str, String)> {
        config.validate()?;
        let settings = Settings::new(MAX_BATCH_RECORDS)
            .timeout(config.sync_interval)
            .idle(IDLE_WAKE);
        let batcher = Batcher::spawn_thread(
            "nsq-dedupe-file",
            "the file writer",
            settings,
            Writer::new(config),
        );
        Ok(FileSink { batcher })
    }
}

impl Handler for FileSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.batcher.submit_one(body).await
    }

    fn handles_batches(&self) -> bool {
        true
    }

    /// One request for the whole batch: its records are synced together, and a failed write
    /// or sync of any of them fails every one (they are requeued; those already on disk
    /// are written again, never lost).
    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        let results = self.batcher.submit(bodies).await;
        match results.iter().find_map(|result| result.as_ref().err()) {
            Some(error) => vec![Err(error.clone()); results.len()],
            None => results,
        }
    }

    /// Closes the current file (moving it to the output directory) once every queued record
    /// is written.
    async fn flush(&self) -> Result<(), HandlerError> {
        self.batcher.close().await
    }
}

impl BuiltIn for FileSink {}

/// The file being written.
struct Open {
    file: File,
    /// Where it is written.
    work_path: PathBuf,
    /// Where it goes when closed.
    output_path: PathBuf,
    /// The `<DATETIME>` text it was named with.
    datetime: String,
    opened: Instant,
    bytes: u64,
    records: u64,
}

/// The writer thread's state.
struct Writer {
    config: FileSinkConfig,
    open: Option<Open>,
    /// A batch's records, as written.
    buffer: Vec<u8>,
}

impl Flush for Writer {
    fn flush(&mut self, records: Vec<Bytes>) -> impl Future<Output = Results> + Send + 'static {
        std::future::ready(self.write_batch(&records))
    }

    fn idle(&mut self) {
        self.rotate_if_due(SystemTime::now());
    }

    fn close(&mut self) {
        if let Some(open) = self.open.take() {
            self.close_file(open);
        }
    }
}

impl Writer {
    fn new(config: FileSinkConfig) -> Self {
        Writer {
            config,
            open: None,
            buffer: Vec::with_capacity(64 * 1024),
        }
    }

    /// Writes a batch, in as many files as rotation asks (each file gets whole records up to
    /// `rotate_size`); answers each record with the outcome of the write and sync that
    /// carried it.
    fn write_batch(&mut self, records: &[Bytes]) -> Results {
        let mut results = Vec::with_capacity(records.len());
        let mut rest = records;
        while !rest.is_empty() {
            self.rotate_if_due(SystemTime::now());
            let room = match (&self.open, self.config.rotate_size) {
                (Some(open), Some(max)) => max.saturating_sub(open.bytes),
                (None, Some(max)) => max,
                (_, None) => u64::MAX,
            };
            let mut count = 0;
            let mut size = 0u64;
            let mut buffer = std::mem::take(&mut self.buffer);
            buffer.clear();
            for body in rest {
                let len = body.len() as u64 + 1;
                if count > 0 && size + len > room {
                    break;
                }
                buffer.extend_from_slice(body);
                buffer.push(b'\n');
                size += len;
                count += 1;
            }
            let written = self.write(&buffer);
            self.buffer = buffer;
            let result = written.map_err(|error| {
                tracing::warn!(%error, records = count, "Writing the archive file failed; its records are requeued.");
                self.discard_failed_batch();
                HandlerError::Retry(format!("writing the archive file failed: {error}"))
            });
            results.extend(std::iter::repeat_n(result, count));
            rest = &rest[count..];
        }
        if self.buffer.capacity() > 16 * 1024 * 1024 {
            // One huge batch must not pin its buffer for the rest of the run.
            self.buffer = Vec::with_capacity(64 * 1024);
        }
        results
    }

    /// Writes records to the open file (opening one if needed) and syncs it.
    fn write(&mut self, records: &[u8]) -> io::Result<()> {
        let now = SystemTime::now();
        if self.open.is_none() {
            self.open = Some(self.open_file(now)?);
        }
        let open = self.open.as_mut().expect("opened above");
        let bytes = match self.config.gzip_level {
            None => {
                open.file.write_all(records)?;
                records.len()
            }
            Some(level) => {
                let mut member =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                member.write_all(records)?;
                let member = member.finish()?;
                open.file.write_all(&member)?;
                member.len()
            }
        };
        open.file.sync_data()?;
        // Rotation by size counts what was written: compressed bytes with gzip.
        open.bytes += bytes as u64;
        open.records += 1;
        Ok(())
    }

    /// After a failed write or sync: cuts the open file back to the end of its last synced
    /// batch (what the failed one left is part of a record, or of a gzip member, or records
    /// that are requeued and will be written again), closes it, and leaves the next batch to
    /// open a new one. A file that held no synced batch is removed: it would be empty, which
    /// is not a gzip stream (`zcat` stops at it) and holds no record anyway.
    fn discard_failed_batch(&mut self) {
        let Some(open) = self.open.take() else { return };
        if open.records == 0 {
            drop(open.file);
            if let Err(error) = std::fs::remove_file(&open.work_path) {
                tracing::warn!(file = %open.work_path.display(), %error, "Removing the archive file whose first write failed failed; it holds no record.");
            }
            return;
        }
        if let Err(error) = open.file.set_len(open.bytes) {
            tracing::warn!(file = %open.work_path.display(), %error, "Cutting the failed batch off the archive file failed; its end may hold part of a record.");
        }
        self.close_file(open);
    }

    /// Closes the open file when its datetime, size or age says so.
    fn rotate_if_due(&mut self, now: SystemTime) {
        let Some(open) = &self.open else { return };
        let datetime = format_datetime(&self.config.datetime_format, now);
        let due = datetime != open.datetime
            || self.config.rotate_size.is_some_and(|max| open.bytes >= max)
            || self
                .config
                .rotate_interval
                .is_some_and(|every| open.opened.elapsed() >= every);
        if due {
            let open = self.open.take().expect("checked above");
            self.close_file(open);
        }
    }

    fn open_file(&self, now: SystemTime) -> io::Result<Open> {
        let datetime = format_datetime(&self.config.datetime_format, now);
        let work_dir = self
            .config
            .work_dir
            .as_deref()
            .unwrap_or(&self.config.output_dir);
        for rev in 0..10_000u32 {
            let name = self.file_name(&datetime, rev);
            if !is_plain_name(&name) {
                return Err(io::Error::other(format!(
                    "the file name {name:?} would leave the output directory; change \
                     `filename_format` or the topic"
                )));
            }
            let (work_path, output_path) =
                (work_dir.join(&name), self.config.output_dir.join(&name));
            // Anything at either name (a file, a device, a dangling link) keeps its place.
            if output_path.symlink_metadata().is_ok() || work_path.symlink_metadata().is_ok() {
                continue;
            }
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&work_path)?;
            return Ok(Open {
                file,
                work_path,
                output_path,
                datetime,
                opened: Instant::now(),
                bytes: 0,
                records: 0,
            });
        }
        Err(io::Error::other(format!(
            "10,000 files named like {} exist already",
            self.file_name(&datetime, 0)
        )))
    }

    fn file_name(&self, datetime: &str, rev: u32) -> String {
        let rev = if rev == 0 {
            String::new()
        } else {
            format!("-{rev}")
        };
        let mut name = self
            .config
            .filename_format
            .replace("<TOPIC>", &self.config.topic)
            .replace("<HOST>", &self.config.host_identifier)
            .replace("<REV>", &rev)
            .replace("<DATETIME>", datetime)
            .replace("<PID>", &std::process::id().to_string());
        if self.config.gzip_level.is_some() && !name.ends_with(".gz") {
            name.push_str(".gz");
        }
        name
    }

    /// Closes `open` and moves it to the output directory (or removes it when empty and
    /// `skip_empty_files`).
    fn close_file(&self, open: Open) {
        let Open {
            file,
            work_path,
            output_path,
            records,
            ..
        } = open;
        let synced = file.sync_all();
        drop(file);
        if records == 0 && self.config.skip_empty_files {
            let _ = std::fs::remove_file(&work_path);
            return;
        }
        if let Err(error) = synced {
            tracing::warn!(file = %work_path.display(), %error, "Syncing the archive file at close failed.");
        }
        if work_path != output_path {
            if let Err(error) = move_file(&work_path, &output_path) {
                tracing::error!(from = %work_path.display(), to = %output_path.display(), %error, "Moving the closed archive file to the output directory failed; it stays in the work directory.");
            }
        }
    }
}

/// One name in a directory: not empty, not `.` or `..`, no `/`.
fn is_plain_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(
        (components.next(), components.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains('/')
}

/// Renames, or copies and removes across file systems; never replaces what is at `to` (a
/// file that appeared there since the name was chosen, or anything that is not a file).
fn move_file(from: &Path, to: &Path) -> io::Result<()> {
    if to.symlink_metadata().is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "something else now has that name",
        ));
    }
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(_) => {
            let mut source = File::open(from)?;
            let mut target = OpenOptions::new().write(true).create_new(true).open(to)?;
            io::copy(&mut source, &mut target)?;
            target.sync_all()?;
            std::fs::remove_file(from)
        }
    }
}

/// Checks that `format` uses only the supported conversions; the unsupported one otherwise.
fn check_datetime_format(format: &str) -> Result<(), String> {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('Y' | 'm' | 'd' | 'H' | 'M' | 'S' | '%') => {}
                Some(other) => return Err(format!("%{other}")),
                None => return Err("a lone %".into()),
            }
        }
    }
    Ok(())
}

/// `format` with `%Y %m %d %H %M %S %%` replaced by `time`'s UTC fields.
fn format_datetime(format: &str, time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{year:04}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", rest / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rest / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rest % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_names_are_file_names() {
        for good in ["a.log", "..a", "a..", ".hidden"] {
            assert!(super::is_plain_name(good), "{good}");
        }
        for bad in ["", ".", "..", "../a", "a/b", "/a", "a/"] {
            assert!(!super::is_plain_name(bad), "{bad}");
        }
    }

    use super::*;

    #[test]
    fn datetimes_are_utc_fields() {
        // 2026-11-23T08:05:09Z
        let t = UNIX_EPOCH + Duration::from_secs(1_795_421_109);
        assert_eq!(format_datetime("%Y-%m-%d_%H", t), "2026-11-23_08");
        assert_eq!(format_datetime("%H:%M:%S %% x", t), "08:05:09 % x");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(check_datetime_format("%Y%j"), Err("%j".into()));
    }

    /// A file whose first batch failed (a full disk) is removed, not left empty: an empty
    /// file is not a gzip stream, and `zcat` stops at it.
    #[test]
    fn a_file_whose_first_batch_failed_is_removed() {
        for gzip_level in [None, Some(6)] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = FileSinkConfig::new(dir.path().to_owned(), "t".into());
            config.gzip_level = gzip_level;
            let mut writer = Writer::new(config);
            writer.open = Some(writer.open_file(SystemTime::now()).unwrap());
            // What a failed `write_all` leaves: the start of a record, never synced.
            writer.open.as_mut().unwrap().file.write_all(b"on").unwrap();
            writer.discard_failed_batch();
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "{gzip_level:?}: {left:?}");
        }
    }

    /// A write that fails half way leaves part of its batch at the end of the file; the file
    /// that is closed must end with the last batch that was written and synced, in plain and
    /// gzip files alike.
    #[test]
    fn a_failed_batch_is_cut_off_the_file() {
        for gzip_level in [None, Some(6)] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = FileSinkConfig::new(dir.path().to_owned(), "t".into());
            config.gzip_level = gzip_level;
            let mut writer = Writer::new(config);
            writer.write(b"one\ntwo\n").unwrap();
            // What a failed `write_all` leaves: the start of a record, never synced.
            writer
                .open
                .as_mut()
                .unwrap()
                .file
                .write_all(b"thr")
                .unwrap();
            writer.discard_failed_batch();
            assert!(writer.open.is_none(), "the next batch opens a new file");
            writer.write(b"three\n").unwrap();
            writer.discard_failed_batch();

            let files: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
                .collect();
            let mut text: Vec<Vec<u8>> = files
                .iter()
                .map(|bytes| match gzip_level {
                    None => bytes.clone(),
                    Some(_) => {
                        let mut out = Vec::new();
                        std::io::Read::read_to_end(
                            &mut flate2::read::MultiGzDecoder::new(&bytes[..]),
                            &mut out,
                        )
                        .unwrap();
                        out
                    }
                })
                .collect();
            text.sort();
            assert_eq!(
                text,
                [b"one\ntwo\n".to_vec(), b"three\n".to_vec()],
                "{gzip_level:?}"
            );
        }
    }
}
