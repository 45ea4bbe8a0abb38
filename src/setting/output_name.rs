//! Output file names that promise a format. A name ending in `.gz`, `.zst`, ... tells its
//! readers (`zcat`, logrotate, a log shipper) how to decode the file, so we refuse a name
//! asking for a compression the file will not have, rather than write it in another format:
//! the file sink writes plain lines, or gzip with `sink.gzip`; the dead-letter file and the
//! table file are never compressed.

use super::{invalid, quote, ConfigError};
use crate::wording::Wording;

/// The endings of compressed files, with the compression each asks for; compared without
/// regard to case.
const COMPRESSED: [(&str, &str); 14] = [
    (".gz", "gzip"),
    (".tgz", "gzip"),
    (".zst", "zstd"),
    (".zstd", "zstd"),
    (".bz2", "bzip2"),
    (".xz", "xz"),
    (".lzma", "lzma"),
    (".lz", "lzip"),
    (".lz4", "lz4"),
    (".sz", "snappy"),
    (".br", "brotli"),
    (".zip", "zip"),
    (".7z", "7-Zip"),
    (".z", "compress"),
];

/// The ending of `name` (as written) and the compression it asks for, if it asks for one.
fn compression(name: &str) -> Option<(&str, &'static str)> {
    COMPRESSED.iter().find_map(|(ending, compression)| {
        let start = name.len().checked_sub(ending.len())?;
        let written = name.get(start..)?;
        written
            .eq_ignore_ascii_case(ending)
            .then_some((written, *compression))
    })
}

/// Refuses `name`, the value of `key`, when it asks for a compression: `what` (such as "the
/// dead-letter file") is `written` (such as "plain JSON lines").
pub(crate) fn check_uncompressed(
    key: &'static str,
    name: &str,
    what: &str,
    written: &str,
) -> Result<(), ConfigError> {
    match compression(name) {
        Some((ending, compression)) => Err(invalid(
            key,
            quote(Some(name)),
            format!("a name ending in {ending} asks for {compression}, which {what} is not (it is {written})"),
        )),
        None => Ok(()),
    }
}

/// Refuses a file sink's `filename_format` that asks for a compression other than the one
/// configured: `.gz` only with gzip, no other compression ever. The placeholders are left out,
/// so that `<REV>` after the ending does not hide it.
pub(crate) fn check_file_sink(format: &str, gzip: bool) -> Result<(), ConfigError> {
    let mut name = format.to_owned();
    for placeholder in ["<TOPIC>", "<HOST>", "<REV>", "<DATETIME>", "<PID>"] {
        name = name.replace(placeholder, "");
    }
    let refuse = |reason: Wording| invalid("sink.filename_format", quote(Some(format)), reason);
    match compression(&name) {
        None => Ok(()),
        Some((_, "gzip")) if gzip => Ok(()),
        Some((ending, "gzip")) => Err(refuse(
            Wording::from(format!(
                "a name ending in {ending} asks for gzip, which is off: set "
            ))
            .key("sink.gzip")
            .text(", or end the name otherwise"),
        )),
        Some((ending, compression)) => Err(refuse(
            Wording::from(format!(
                "a name ending in {ending} asks for {compression}, which the file sink does not \
                 write (it writes plain lines, or gzip with "
            ))
            .key("sink.gzip")
            .text(")"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::compression;

    #[test]
    fn endings_are_read_as_written_in_any_case() {
        assert_eq!(compression("a.log.gz"), Some((".gz", "gzip")));
        assert_eq!(compression("a.LOG.ZST"), Some((".ZST", "zstd")));
        assert_eq!(compression("a.tar.Z"), Some((".Z", "compress")));
        assert_eq!(compression("a.lz4"), Some((".lz4", "lz4")));
        assert_eq!(compression("a.log"), None);
        assert_eq!(compression("a.ndjson"), None);
        assert_eq!(compression("gz"), None);
        assert_eq!(compression("é"), None);
    }
}
