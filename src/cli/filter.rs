//! Flags of `nsq-dedupe filter`.

use std::path::PathBuf;

use crate::dedup::table_file::OnMismatch;
use crate::{DigestAlgorithm, KeySpec};
use clap::{Args, ValueEnum};

/// `--digest`: an algorithm, or keyed BLAKE3, whose key comes from `--digest-key-file`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Digest {
    /// An unkeyed algorithm.
    Plain(DigestAlgorithm),
    /// Keyed BLAKE3.
    Blake3,
}

fn parse_digest(text: &str) -> Result<Digest, String> {
    match text {
        "blake3" => Ok(Digest::Blake3),
        _ => text
            .parse()
            .map(Digest::Plain)
            .map_err(|e: crate::error::SpecError| e.to_string()),
    }
}

use super::table::TableFlags;

/// Flags of `nsq-dedupe filter`.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// The table; without `--buckets` or `--memory`, 8,388,608 buckets (64 MiB).
    #[command(flatten)]
    pub(crate) table: TableFlags,
    /// The key of a record: `body` (the whole line) or `json:<pointer>`, such as `json:/id`.
    #[arg(long, value_name = "KEY", default_value = "body")]
    pub(crate) key: KeySpec,
    /// Digest of the key: `xxh3` (default), `xxh3:<seed>`, `md5`, or `blake3` with
    /// --digest-key-file.
    #[arg(long, value_name = "DIGEST", value_parser = parse_digest)]
    pub(crate) digest: Option<Digest>,
    /// File with a 32-byte key (raw or 64 hex digits): digests become keyed BLAKE3, which
    /// nobody without the key can predict.
    #[arg(long, value_name = "FILE")]
    pub(crate) digest_key_file: Option<PathBuf>,
    /// What to do with a record that has no key: pass it on (and count it) or stop with an error.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = MissingKey::Pass)]
    pub(crate) on_missing_key: MissingKey,
    /// Records whose key was seen longer ago than this (by the wall clock, such as 7d) pass
    /// again: with --table-file, across runs.
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::parse::parse_duration)]
    pub(crate) max_age: Option<std::time::Duration>,
    /// Keep the table in this file between runs: loaded at start (or created), written at the
    /// end of a run whose every record was written, so daily runs de-duplicate across days.
    /// The key must stay the same; a file of another size is resized (see
    /// --table-file-on-mismatch).
    #[arg(long, value_name = "FILE")]
    pub(crate) table_file: Option<PathBuf>,
    /// A table file of another size: `resize` (kept as the previous generation until the new
    /// table has turned over), `error`, or `recreate` (moved aside, start empty; also for
    /// other mismatches and damage).
    #[arg(long, value_name = "POLICY", default_value = "resize", value_parser = crate::cli::parse::named(&OnMismatch::NAMES))]
    pub(crate) table_file_on_mismatch: OnMismatch,
    /// Print counts and the table's catch probability to stderr at the end.
    #[arg(long)]
    pub(crate) stats: bool,
    /// Files to read in order; none or `-` reads stdin.
    #[arg(value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
}

/// What happens to a record whose key cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MissingKey {
    /// Treat it as unique: write it and count it.
    Pass,
    /// Stop with an error naming the record.
    Error,
}
