//! `nsq-dedupe filter`: de-duplicates newline-delimited records from files or stdin to stdout.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};

use anyhow::{Context, Result};

use crate::cli::{Digest, FilterArgs, MissingKey};
use crate::cmd::std_streams::{require, Stream};
use std::sync::Arc;
use std::time::Duration;

use crate::dedup::clock::{Clock, CoarseClock};
use crate::dedup::table_file::{TableFile, TableFileError};
use crate::error::TableError;
use crate::filter::{filter_records, FilterStats};
use crate::sizing;
use crate::units::{format_bytes, format_count};
use crate::wording::FlagOrigins;
use crate::{DigestAlgorithm, Geometry, Keyer, Table};

/// Read and write buffers: large enough that system calls are not the cost per record.
const BUFFER_BYTES: usize = 256 * 1024;

pub(crate) fn run(args: &FilterArgs) -> Result<()> {
    require_streams(args)?;
    let (geometry, flag) = geometry(args)?;
    let keyer = Keyer::new(args.key.clone(), digest(args)?);
    let (table, table_file) = open_table(args, geometry, flag, &keyer)?;
    let mut stats = FilterStats::default();
    let stdout = io::stdout().lock();
    let mut output = BufWriter::with_capacity(BUFFER_BYTES, stdout);
    let result = filter_inputs(args, &table, &keyer, &mut output, &mut stats);
    let flushed = result.and_then(|()| output.flush().context("cannot write to stdout"));
    // Only a run whose every record was written may be remembered: a record the table holds
    // but the output never got would be dropped as a copy by the next run. Saved before the
    // statistics are printed, so that a closed stderr cannot cost the table.
    let saved = match (&flushed, &table_file) {
        (Ok(()), Some(file)) => file
            .save(&table)
            .map(drop)
            .map_err(|error| anyhow::anyhow!("{}", table_file_flags().show(error))),
        _ => Ok(()),
    };
    if args.stats {
        print_stats(&stats, &table);
    }
    saved?;
    flushed
}

/// Refuses to start when a standard stream the run needs is closed.
fn require_streams(args: &FilterArgs) -> Result<()> {
    require(Stream::Stdout, "`filter` writes the unique records")?;
    if args.files.is_empty() || args.files.iter().any(|path| path.as_os_str() == "-") {
        require(Stream::Stdin, "`filter` reads its records")?;
    }
    if args.stats {
        require(Stream::Stderr, "`filter --stats` writes the statistics")?;
    }
    Ok(())
}

/// The table's geometry, and the flag that sized it (`None` for the default size).
fn geometry(args: &FilterArgs) -> Result<(Geometry, Option<&'static str>)> {
    Ok(match args.table.geometry()? {
        Some(geometry) if args.table.buckets.is_some() => (geometry, Some("--buckets")),
        Some(geometry) => (geometry, Some("--memory")),
        None => (
            Geometry::new(Geometry::DEFAULT_SLOTS, args.table.ways)
                .expect("the default size is valid for every supported way count"),
            None,
        ),
    })
}

/// A table that cannot be had, said under the flag that sized it, with the fix.
fn refused(error: TableError, flag: Option<&str>) -> anyhow::Error {
    match flag {
        Some(flag) => anyhow::anyhow!("invalid `{flag}`: {error}; choose a smaller `{flag}`"),
        None => anyhow::anyhow!("the default table size: {error}; choose a smaller `--memory`"),
    }
}

/// The digest the flags select, refused when `--digest` and `--digest-key-file` disagree.
fn digest(args: &FilterArgs) -> Result<DigestAlgorithm> {
    Ok(match (args.digest, &args.digest_key_file) {
        (None | Some(Digest::Blake3), Some(path)) => DigestAlgorithm::Blake3Keyed(
            // Named by the flag: `filter` has no config file.
            crate::config::read_digest_key("--digest-key-file", path)?,
        ),
        (Some(Digest::Plain(digest)), Some(_)) => anyhow::bail!(
            "invalid `--digest` = \"{digest}\": a digest key file selects keyed BLAKE3; set \
             `--digest` to \"blake3\" or leave it out"
        ),
        (Some(Digest::Blake3), None) => anyhow::bail!(
            "`--digest blake3` needs its key: pass `--digest-key-file`, a file of 32 bytes such \
             as `head -c 32 /dev/urandom > FILE` makes"
        ),
        (Some(Digest::Plain(digest)), None) => digest,
        (None, None) => DigestAlgorithm::default(),
    })
}

/// The table: new, or restored from `--table-file`, with the file to save it to.
fn open_table(
    args: &FilterArgs,
    geometry: Geometry,
    flag: Option<&str>,
    keyer: &Keyer,
) -> Result<(Table, Option<TableFile>)> {
    let timing = args.max_age.map(|age| {
        let clock: Arc<dyn Clock> = Arc::new(CoarseClock);
        (age.max(Duration::from_secs(1)), clock)
    });
    Ok(match &args.table_file {
        None => (
            match &timing {
                None => Table::new(geometry),
                Some((age, clock)) => Table::with_max_age(geometry, *age, clock.clone()),
            }
            .map_err(|error| refused(error, flag))?,
            None,
        ),
        Some(path) => {
            let identity = format!("{} {}", keyer.key(), keyer.algorithm());
            let (file, table, report) = TableFile::open(
                path,
                geometry,
                &identity,
                args.table_file_on_mismatch,
                timing,
            )
            .map_err(|error| match error {
                TableFileError::Table(error) => refused(error, flag),
                error => anyhow::anyhow!("{}", table_file_flags().show(error)),
            })?;
            if let Some(reason) = report.recreated {
                let names = table_file_flags();
                let reason = names.show(reason);
                tracing::error!(table_file = %path.display(), %reason, "Starting with an empty table (`--table-file-on-mismatch recreate`).");
            }
            if let Some(from) = report.resized_from {
                crate::dedup::table_file::log_resize(path, from, geometry);
            }
            (table, Some(file))
        }
    })
}

/// Filters every input in turn (stdin when there are none) into `output`.
fn filter_inputs(
    args: &FilterArgs,
    table: &Table,
    keyer: &Keyer,
    output: &mut impl Write,
    stats: &mut FilterStats,
) -> Result<()> {
    let keyless_is_error = args.on_missing_key == MissingKey::Error;
    let stdin_only = [std::path::PathBuf::from("-")];
    let files = if args.files.is_empty() {
        &stdin_only[..]
    } else {
        &args.files[..]
    };
    let last = files.len() - 1;
    files
        .iter()
        .enumerate()
        .try_for_each(|(i, path)| -> Result<()> {
            // filter_records reads in large blocks of its own, so the inputs are not buffered.
            let (input, name): (Box<dyn Read>, String) = if path.as_os_str() == "-" {
                (Box::new(io::stdin().lock()), "stdin".into())
            } else {
                let file = File::open(path)
                    .with_context(|| format!("cannot open input file `{}`", path.display()))?;
                (Box::new(file), format!("`{}`", path.display()))
            };
            filter_records(
                input,
                &mut *output,
                table,
                keyer,
                keyless_is_error,
                i < last,
                stats,
            )
            .with_context(|| format!("while filtering {name}"))
        })
}

/// How `filter`, which reads no config file, names the table file's settings: by its flags.
fn table_file_flags() -> FlagOrigins {
    let mut names = FlagOrigins::default();
    names.record("store.table_file", "--table-file", false);
    names.record(
        "store.table_file_on_mismatch",
        "--table-file-on-mismatch",
        false,
    );
    names
}

/// Prints the counts on stderr; when stderr is closed they are lost, nothing else.
fn print_stats(stats: &FilterStats, table: &Table) {
    let geometry = table.geometry();
    // Every record written with a key is one distinct key the table has seen.
    let distinct = stats.records_out - stats.keyless;
    let text = format!(
        "records in:          {}\n\
         records out:         {}\n\
         duplicates dropped:  {}\n\
         keyless (passed):    {}\n\
         table:               {} buckets in sets of {} ({}), {} occupied\n\
         catch probability:   {} for a copy arriving after all {} distinct records\n",
        format_count(stats.records_in),
        format_count(stats.records_out),
        format_count(stats.duplicates),
        format_count(stats.keyless),
        format_count(geometry.slots()),
        geometry.ways(),
        format_bytes(geometry.memory_bytes()),
        format_count(table.occupied()),
        super::format_probability(sizing::catch_probability(geometry, distinct as f64)),
        format_count(distinct)
    );
    let _ = io::stderr().lock().write_all(text.as_bytes());
}
