//! Why a table file could not be used: [`TableFileError`], whose messages carry the settings
//! they name (the file, `store.table_file_on_mismatch = "recreate"`) as fields.

use std::io;
use std::path::{Path, PathBuf};

use crate::wording::{Named, Wording};

/// Why a table file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TableFileError {
    /// Reading or writing failed.
    #[error("table file {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error, in the message (said once).
        cause: io::Error,
    },
    /// The lock file beside the table file could not be created.
    #[error("table file {path}: cannot create its lock file {lock} beside it: {cause}; the table file's directory must be writable")]
    LockFile {
        /// The table file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The I/O error, in the message (said once).
        cause: io::Error,
    },
    /// The table file's directory does not exist (so neither the file nor its lock can be
    /// created there).
    #[error("table file {path}: its directory {dir} does not exist; create it, or give another {setting}")]
    NoDirectory {
        /// The table file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// The setting that gives the file: `store.table_file`.
        setting: Named,
    },
    /// Another process holds the file.
    #[error("table file {path} is in use by {holder} (its lock {lock} is held); stop it, or give this process another file")]
    Locked {
        /// The table file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// "process 1234", or "another process" when its ID is unknown.
        holder: String,
    },
    /// The file was written for other settings.
    #[error("{}", mismatch(.path, .differs, .recreate))]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs, the file's value first.
        differs: String,
        /// The setting that starts fresh instead: `store.table_file_on_mismatch = "recreate"`.
        recreate: Named,
    },
    /// The file is not a complete table file.
    #[error("{}", damaged(.path, .reason, .recreate))]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// The setting that starts fresh instead: `store.table_file_on_mismatch = "recreate"`.
        recreate: Named,
    },
    /// Something other than a regular file has the name: it is never opened, renamed or
    /// replaced (a FIFO would block the start, a device would be written to or moved).
    #[error("{path} is {kind}: a table file, its lock, its temporary file and its journal are regular files or do not exist yet; give another path")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What is there: "a directory", "a FIFO", "a character device", ...
        kind: &'static str,
    },
    /// The table's memory could not be had.
    #[error(transparent)]
    Table(#[from] crate::error::TableError),
}

impl TableFileError {
    /// The message of a file that `recreate` starts fresh over, with the setting as a field.
    pub(super) fn recreatable(&self) -> Option<Wording> {
        match self {
            TableFileError::Mismatch {
                path,
                differs,
                recreate,
            } => Some(mismatch(path, differs, recreate)),
            TableFileError::Corrupt {
                path,
                reason,
                recreate,
            } => Some(damaged(path, reason, recreate)),
            _ => None,
        }
    }
}

/// `store.table_file_on_mismatch = "recreate"`, which starts fresh over a file that does not
/// fit.
pub(super) fn recreate() -> Named {
    Named::set("store.table_file_on_mismatch", "\"recreate\"")
}

/// The message of [`TableFileError::Mismatch`].
fn mismatch(path: &Path, differs: &str, recreate: &Named) -> Wording {
    Wording::from(format!(
        "table file {} was written for {differs}; start fresh by moving the file away (the \
         table starts empty) or with ",
        path.display()
    ))
    .setting(recreate.clone())
}

/// The message of [`TableFileError::Corrupt`].
fn damaged(path: &Path, reason: &str, recreate: &Named) -> Wording {
    Wording::from(format!(
        "table file {} is damaged: {reason}; start fresh by moving the file away or with ",
        path.display()
    ))
    .setting(recreate.clone())
}
