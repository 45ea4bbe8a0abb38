//! Opening only regular files: a table file, its lock, journal or temporary file that is a
//! directory, a FIFO, a device or a socket is an error naming what it is, never waited on,
//! written to or moved aside.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::TableFileError;

/// Why a file could not be opened as a regular file.
pub(crate) enum OpenError {
    Io(io::Error),
    NotAFile(&'static str),
}

impl OpenError {
    pub(crate) fn at(self, path: &Path) -> TableFileError {
        match self {
            OpenError::Io(cause) => TableFileError::Io {
                path: path.to_owned(),
                cause,
            },
            OpenError::NotAFile(kind) => TableFileError::NotAFile {
                path: path.to_owned(),
                kind,
            },
        }
    }
}

/// Opens `path` with `options` only if it is a regular file (following symbolic links).
///
/// The open itself does not wait (`O_NONBLOCK`: a FIFO with no writer would block it for
/// ever), and the check is made on the opened file, so nothing can swap the name in between.
pub(crate) fn open_regular(path: &Path, options: &mut OpenOptions) -> Result<File, OpenError> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(OpenError::Io)?;
    let file_type = file.metadata().map_err(OpenError::Io)?.file_type();
    if !file_type.is_file() {
        return Err(OpenError::NotAFile(kind_of(&file_type)));
    }
    Ok(file)
}

/// What is at `path` when it exists and is not a regular file (following symbolic links).
pub(super) fn not_a_file(path: &Path) -> Option<&'static str> {
    let meta = std::fs::metadata(path).ok()?;
    (!meta.file_type().is_file()).then(|| kind_of(&meta.file_type()))
}

/// A file type as the error message says it.
pub(super) fn kind_of(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "not a file"
    }
}
