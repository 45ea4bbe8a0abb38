//! The table file's lock: an exclusive `flock` on `PATH.lock`, which records the holder's
//! process ID for another process's error message and is removed when the holder lets go.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::regular::{not_a_file, open_regular, OpenError};
use super::TableFileError;

/// `PATH.lock`, the lock file of the table file `path`.
pub(super) fn lock_path(path: &Path) -> PathBuf {
    path.with_file_name(format!(
        "{}.lock",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ))
}

/// Takes the exclusive lock of `path` (on `PATH.lock`) and writes our process ID into it.
///
/// The holder removes the lock file when it lets go, so the lock we took may be on a file
/// that is no longer at its name; then another process may have created and locked a new one,
/// and we try again with it.
pub(super) fn lock(path: &Path) -> Result<File, TableFileError> {
    if let Some(kind) = not_a_file(path) {
        return Err(TableFileError::NotAFile {
            path: path.to_owned(),
            kind,
        });
    }
    let lock_path = lock_path(path);
    let io = |cause| TableFileError::Io {
        path: lock_path.clone(),
        cause,
    };
    let mut attempts = 0;
    let mut file = loop {
        attempts += 1;
        let file = open_regular(
            &lock_path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
        .map_err(|error| match error {
            OpenError::Io(cause)
                if cause.kind() == std::io::ErrorKind::NotFound && !directory_of(path).is_dir() =>
            {
                TableFileError::NoDirectory {
                    path: path.to_owned(),
                    dir: directory_of(path),
                    setting: crate::wording::Named::key("store.table_file"),
                }
            }
            OpenError::Io(cause) => TableFileError::LockFile {
                path: path.to_owned(),
                lock: lock_path.clone(),
                cause,
            },
            other => other.at(&lock_path),
        })?;
        match file.try_lock() {
            Ok(()) if attempts < 10 && !same_file(&file, &lock_path) => continue,
            Ok(()) => break file,
            Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
            Err(std::fs::TryLockError::WouldBlock) => return Err(held(path, &lock_path, file)),
        }
    };
    let written = file
        .set_len(0)
        .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&lock_path);
        return Err(io(error));
    }
    Ok(file)
}

/// The directory of the file `path`: `.` for a bare name.
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Whether `file` is the file now at `path`.
fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

/// The error for a lock held by another process, naming it from the ID in the lock file.
fn held(path: &Path, lock_path: &Path, mut file: File) -> TableFileError {
    let mut pid = String::new();
    let _ = file.read_to_string(&mut pid);
    let holder = match pid.trim().parse::<u32>() {
        Ok(pid) => format!("process {pid}"),
        Err(_) => "another process".into(),
    };
    TableFileError::Locked {
        path: path.to_owned(),
        lock: lock_path.to_owned(),
        holder,
    }
}
