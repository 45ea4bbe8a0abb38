//! De-duplication of newline-delimited records: the engine of `nsq-dedupe filter`, usable on
//! any reader and writer.
//!
//! Records are written byte for byte, in input order, including their newline. A last record
//! without one ends at the end of its input: it is written without one when it ends the
//! output, and with one when another input follows, so that it is never glued to the next
//! input's first record. Memory is the table plus one record: the reader's buffer holds the
//! current record only.

use std::io::{self, BufRead, Write};

use crate::dedup::digest::Keyer;
use crate::dedup::table::Table;
use crate::error::KeyError;

/// Counts of one filtering run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Records read.
    pub records_in: u64,
    /// Records written.
    pub records_out: u64,
    /// Records dropped because their key was seen before.
    pub duplicates: u64,
    /// Records without a key, written as unique.
    pub keyless: u64,
}

/// Why filtering stopped.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A record had no key and the policy says that is an error.
    #[error("record {record} has no key: {reason}; pass `--on-missing-key pass` to let such records through")]
    MissingKey {
        /// The 1-based number of the record over all inputs.
        record: u64,
        /// Why the key could not be read.
        reason: KeyError,
    },
}

/// Reads records from `input`, writes the ones not seen before to `output`, and counts into
/// `stats` (which may carry counts from earlier inputs).
///
/// With `keyless_is_error`, a record without a key stops the run; otherwise it is written.
/// With `more_input_follows`, a last record without a newline is written with one.
///
/// # Errors
///
/// [`FilterError::Io`] from the reader or the writer (a closed pipe is a `BrokenPipe` error),
/// and [`FilterError::MissingKey`] as described.
pub fn filter_records<R: BufRead, W: Write>(
    mut input: R,
    output: &mut W,
    table: &Table,
    keyer: &Keyer,
    keyless_is_error: bool,
    more_input_follows: bool,
    stats: &mut FilterStats,
) -> Result<(), FilterError> {
    let mut record = Vec::with_capacity(4096);
    loop {
        record.clear();
        if input.read_until(b'\n', &mut record)? == 0 {
            return Ok(());
        }
        stats.records_in += 1;
        let key = record.strip_suffix(b"\n").unwrap_or(&record);
        let unique = match keyer.digest(key) {
            Ok(digest) => !table.contains_and_add(digest),
            Err(reason) if keyless_is_error => {
                return Err(FilterError::MissingKey {
                    record: stats.records_in,
                    reason,
                })
            }
            Err(_) => {
                stats.keyless += 1;
                true
            }
        };
        if unique {
            output.write_all(&record)?;
            if more_input_follows && !record.ends_with(b"\n") {
                output.write_all(b"\n")?;
            }
            stats.records_out += 1;
        } else {
            stats.duplicates += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::digest::{DigestAlgorithm, KeySpec};

    fn run(input: &[u8], keyer: &Keyer) -> (Vec<u8>, FilterStats) {
        let table = Table::with_slots(1024, 8).unwrap();
        let mut out = Vec::new();
        let mut stats = FilterStats::default();
        filter_records(input, &mut out, &table, keyer, false, false, &mut stats).unwrap();
        (out, stats)
    }

    #[test]
    fn keeps_first_copies_byte_for_byte() {
        let (out, stats) = run(b"a\nb\na\n\xff\x00\nb\n\xff\x00\nc", &Keyer::default());
        assert_eq!(out, b"a\nb\n\xff\x00\nc");
        assert_eq!(
            stats,
            FilterStats {
                records_in: 7,
                records_out: 4,
                duplicates: 3,
                keyless: 0
            }
        );
        assert_eq!(run(b"", &Keyer::default()).1, FilterStats::default());
        // A last record without a newline equals the same record with one.
        assert_eq!(run(b"x\nx", &Keyer::default()).0, b"x\n");
    }

    #[test]
    fn keyless_records_pass_or_stop() {
        let keyer = Keyer::new(KeySpec::Json("/id".into()), DigestAlgorithm::default());
        let input = b"{\"id\":1,\"v\":1}\nnot json\n{\"id\":1,\"v\":2}\nnot json\n";
        let (out, stats) = run(input, &keyer);
        assert_eq!(out, b"{\"id\":1,\"v\":1}\nnot json\nnot json\n");
        assert_eq!((stats.keyless, stats.duplicates), (2, 1));

        let table = Table::with_slots(64, 8).unwrap();
        let mut stats = FilterStats::default();
        let err = filter_records(
            &input[..],
            &mut Vec::new(),
            &table,
            &keyer,
            true,
            false,
            &mut stats,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("record 2 has no key: body is not valid JSON"),
            "{err}"
        );
    }
}
