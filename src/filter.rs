//! De-duplication of newline-delimited records: the engine of `nsq-dedupe filter`, usable on
//! any reader and writer.
//!
//! Records are written byte for byte, in input order, including their newline. A last record
//! without one ends at the end of its input: it is written without one when it ends the
//! output, and with one when another input follows, so that it is never glued to the next
//! input's first record.
//!
//! Input is read in blocks of `BLOCK_BYTES`; record boundaries are found with `memchr`; the
//! records of a block are digested and decided in batches of `BATCH_RECORDS`, whose table
//! sets are requested from memory while earlier ones are decided
//! ([`Table::contains_and_add_many_into`]), so that the waits for memory overlap instead of
//! coming one record at a time. Memory is the table plus one block, or one record when a
//! record is longer than a block.
//!
//! A record is decided only once it is whole, so it is held whole: records are at most
//! [`MAX_RECORD_BYTES`] (64 MiB), their newline included. A longer one (or input that is not
//! newline-delimited, such as `/dev/zero`) stops the run with
//! [`FilterError::RecordTooLong`] after the records before it are written, instead of
//! growing without bound until the allocator aborts the process.

use std::io::{self, Read, Write};

use crate::dedup::digest::{Digest, Keyer};
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
    /// A record did not end within [`MAX_RECORD_BYTES`].
    #[error("record {record} has no newline within its first {}: records are at most that long, their newline included; split longer records, or check that the input is newline-delimited", crate::units::format_bytes(MAX_RECORD_BYTES as u64))]
    RecordTooLong {
        /// The 1-based number of the record over all inputs.
        record: u64,
    },
}

/// The longest record, its newline included: 64 MiB. A record is held whole until decided.
pub const MAX_RECORD_BYTES: usize = 64 << 20;

/// Bytes read from the input at a time.
pub(crate) const BLOCK_BYTES: usize = 1 << 20;

/// Records decided together: enough for the table's prefetching to overlap many waits.
pub(crate) const BATCH_RECORDS: usize = 256;

/// Reads records from `input`, writes the ones not seen before to `output`, and counts into
/// `stats` (which may carry counts from earlier inputs).
///
/// With `keyless_is_error`, a record without a key stops the run (the records before it are
/// decided and written first); otherwise it is written. With `more_input_follows`, a last
/// record without a newline is written with one.
///
/// # Errors
///
/// [`FilterError::Io`] from the reader or the writer (a closed pipe is a `BrokenPipe` error),
/// [`FilterError::MissingKey`] as described, and [`FilterError::RecordTooLong`] for a record
/// longer than [`MAX_RECORD_BYTES`].
pub fn filter_records<R: Read, W: Write>(
    mut input: R,
    output: &mut W,
    table: &Table,
    keyer: &Keyer,
    keyless_is_error: bool,
    more_input_follows: bool,
    stats: &mut FilterStats,
) -> Result<(), FilterError> {
    // `buffer[..filled]` holds read bytes not yet decided: at most one unfinished record
    // after each block. The buffer grows only for a record longer than itself.
    let mut buffer: Vec<u8> = vec![0; BLOCK_BYTES];
    let mut filled = 0;
    let mut batch = Batch::default();
    // Where the search for the next newline resumes: the unfinished record at the front of
    // `buffer` was searched already.
    let mut searched = 0;
    loop {
        if filled == buffer.len() {
            // The buffer holds one unfinished record and nothing else.
            if buffer.len() >= MAX_RECORD_BYTES {
                return Err(FilterError::RecordTooLong {
                    record: stats.records_in + 1,
                });
            }
            buffer.resize((buffer.len() * 2).min(MAX_RECORD_BYTES), 0);
        }
        let read = loop {
            match input.read(&mut buffer[filled..]) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        filled += read;
        let at_end = read == 0;
        let block = &buffer[..filled];
        let mut start = 0;
        for newline in memchr::memchr_iter(b'\n', &block[searched..]) {
            let end = searched + newline + 1;
            batch.records.push((start, end));
            start = end;
            if batch.records.len() == BATCH_RECORDS {
                batch.decide(block, output, table, keyer, keyless_is_error, false, stats)?;
            }
        }
        if at_end && start < filled {
            batch.records.push((start, filled));
            start = filled;
        }
        batch.decide(
            block,
            output,
            table,
            keyer,
            keyless_is_error,
            at_end && more_input_follows,
            stats,
        )?;
        if at_end {
            return Ok(());
        }
        // Keep the unfinished record at the front; the next read appends to it.
        buffer.copy_within(start..filled, 0);
        filled -= start;
        searched = filled;
    }
}

/// Records of one block waiting to be decided, and the decision's scratch space.
#[derive(Default)]
struct Batch {
    /// `(start, end)` of each record in the block, its newline included.
    records: Vec<(usize, usize)>,
    /// Digests of the keyed records, in order.
    digests: Vec<Digest>,
    /// For each record, whether it has a key (and so a digest).
    keyed: Vec<bool>,
    /// The table's answers for `digests`.
    seen: Vec<bool>,
}

impl Batch {
    /// Digests, decides and writes the waiting records in input order, then forgets them.
    /// With `terminate_last`, the last record gets a newline if it lacks one.
    #[allow(clippy::too_many_arguments)]
    fn decide<W: Write>(
        &mut self,
        block: &[u8],
        output: &mut W,
        table: &Table,
        keyer: &Keyer,
        keyless_is_error: bool,
        terminate_last: bool,
        stats: &mut FilterStats,
    ) -> Result<(), FilterError> {
        self.digests.clear();
        self.keyed.clear();
        self.seen.clear();
        let mut missing = None;
        for (i, &(start, end)) in self.records.iter().enumerate() {
            let record = &block[start..end];
            let key = record.strip_suffix(b"\n").unwrap_or(record);
            match keyer.digest(key) {
                Ok(digest) => {
                    self.digests.push(digest);
                    self.keyed.push(true);
                }
                Err(reason) if keyless_is_error => {
                    // Decide the records before it, then stop at it.
                    missing = Some((i, reason));
                    break;
                }
                Err(_) => self.keyed.push(false),
            }
        }
        table.contains_and_add_many_into(&self.digests, &mut self.seen);
        let mut answers = self.seen.iter();
        let last = self.records.len().saturating_sub(1);
        for (i, &keyed) in self.keyed.iter().enumerate() {
            stats.records_in += 1;
            let unique = if keyed {
                !answers.next().copied().unwrap_or(false)
            } else {
                stats.keyless += 1;
                true
            };
            if unique {
                let (start, end) = self.records[i];
                let record = &block[start..end];
                output.write_all(record)?;
                if terminate_last && i == last && !record.ends_with(b"\n") {
                    output.write_all(b"\n")?;
                }
                stats.records_out += 1;
            } else {
                stats.duplicates += 1;
            }
        }
        self.records.clear();
        if let Some((_, reason)) = missing {
            stats.records_in += 1;
            return Err(FilterError::MissingKey {
                record: stats.records_in,
                reason,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::digest::{DigestAlgorithm, KeySpec};
    use proptest::prelude::*;

    /// A reader that hands out at most `chunk` bytes per read, to move block boundaries
    /// through every record.
    struct Chunked<'a> {
        data: &'a [u8],
        chunk: usize,
    }

    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.chunk.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// The first copy of each record, in order, as a perfect de-duplicator writes them (a last
    /// record without a newline is written without one).
    fn exact(input: &[u8]) -> Vec<u8> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for record in input.split_inclusive(|&b| b == b'\n') {
            if seen.insert(record.strip_suffix(b"\n").unwrap_or(record)) {
                out.extend_from_slice(record);
            }
        }
        out
    }

    fn filtered(reader: impl Read) -> Vec<u8> {
        // Large enough that no set overflows: the output must be exactly the model's.
        let table = Table::with_slots(1 << 21, 8).unwrap();
        let mut out = Vec::new();
        let mut stats = FilterStats::default();
        filter_records(
            reader,
            &mut out,
            &table,
            &Keyer::default(),
            false,
            false,
            &mut stats,
        )
        .unwrap();
        out
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_exact_output(
            records in prop::collection::vec(prop::collection::vec(0u8..4, 0..6), 0..300),
            last_newline in any::<bool>(),
            chunk in 1usize..64,
        ) {
            let mut input = Vec::new();
            for record in &records {
                input.extend(record.iter().map(|b| b'a' + b));
                input.push(b'\n');
            }
            if !last_newline {
                input.pop();
            }
            prop_assert_eq!(filtered(Chunked { data: &input, chunk }), exact(&input));
        }
    }

    #[test]
    fn records_across_and_longer_than_blocks_are_kept_whole() {
        let long = vec![b'x'; BLOCK_BYTES + BLOCK_BYTES / 2];
        let mut input = Vec::new();
        for i in 0..50_000 {
            input.extend_from_slice(format!("record {}\n", i % 30_000).as_bytes());
        }
        input.extend_from_slice(&long);
        input.push(b'\n');
        input.extend_from_slice(b"after\n");
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nend");
        assert!(input.len() > 3 * BLOCK_BYTES);
        let (got, want) = (filtered(&input[..]), exact(&input));
        let first_difference = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(
            got.len() == want.len() && first_difference.is_none(),
            "{} bytes written, {} expected; first difference at {first_difference:?}",
            got.len(),
            want.len()
        );
    }

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
