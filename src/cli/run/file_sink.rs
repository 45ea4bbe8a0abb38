//! `run` flags of the file sink (`--sink file`): `nsq_to_file`'s, with its names and meanings.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{Dur, RawConfig};

use super::Overlay;
use crate::cli::parse::parse_duration;

/// The file sink's flags.
#[derive(Debug, Args)]
#[command(next_help_heading = "File sink (as nsq_to_file)")]
pub(crate) struct FileSinkFlags {
    /// Directory closed files go to. `sink.output_dir`.
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
    /// Directory files are written in until closed (default: the output dir). `sink.work_dir`.
    #[arg(long, value_name = "DIR")]
    pub(crate) work_dir: Option<PathBuf>,
    /// File name with <TOPIC>, <HOST>, <REV>, <DATETIME>, <PID> (default
    /// <TOPIC>.<HOST><REV>.<DATETIME>.log). `sink.filename_format`.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) filename_format: Option<String>,
    /// <DATETIME> as strftime, UTC (default %Y-%m-%d_%H: a file per hour). `sink.datetime_format`.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) datetime_format: Option<String>,
    /// Close a file after this long. `sink.rotate_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) rotate_interval: Option<Duration>,
    /// Close a file at this size, such as 100MiB. `sink.rotate_size`.
    #[arg(long, value_name = "SIZE")]
    pub(crate) rotate_size: Option<String>,
    /// Gzip the files (a member per sync). `sink.gzip`.
    #[arg(long)]
    pub(crate) gzip: bool,
    /// Gzip level 1-9 (default 6; implies --gzip). `sink.gzip_level`.
    #[arg(long, value_name = "N")]
    pub(crate) gzip_level: Option<u32>,
    /// Gather records this long before each write and fsync (default 0: as soon as the disk is
    /// free); longer means fewer fsyncs and later FINs. `sink.sync_interval`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) sync_interval: Option<Duration>,
    /// <HOST> in file names (default: the short host name). `sink.host_identifier`.
    #[arg(long, value_name = "NAME")]
    pub(crate) host_identifier: Option<String>,
    /// Remove files that got no record instead of keeping them. `sink.skip_empty_files`.
    #[arg(long)]
    pub(crate) skip_empty_files: bool,
}

impl FileSinkFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        let sink = &mut raw.sink;
        overlay.value(
            &mut sink.output_dir,
            self.output_dir.as_ref(),
            "sink.output_dir",
            "--output-dir",
        );
        overlay.value(
            &mut sink.work_dir,
            self.work_dir.as_ref(),
            "sink.work_dir",
            "--work-dir",
        );
        overlay.value(
            &mut sink.filename_format,
            self.filename_format.as_ref(),
            "sink.filename_format",
            "--filename-format",
        );
        overlay.value(
            &mut sink.datetime_format,
            self.datetime_format.as_ref(),
            "sink.datetime_format",
            "--datetime-format",
        );
        overlay.value(
            &mut sink.rotate_interval,
            self.rotate_interval.map(Dur).as_ref(),
            "sink.rotate_interval",
            "--rotate-interval",
        );
        overlay.value(
            &mut sink.rotate_size,
            self.rotate_size.as_ref(),
            "sink.rotate_size",
            "--rotate-size",
        );
        overlay.value(
            &mut sink.gzip,
            self.gzip.then_some(true).as_ref(),
            "sink.gzip",
            "--gzip",
        );
        overlay.value(
            &mut sink.gzip_level,
            self.gzip_level.as_ref(),
            "sink.gzip_level",
            "--gzip-level",
        );
        overlay.value(
            &mut sink.sync_interval,
            self.sync_interval.map(Dur).as_ref(),
            "sink.sync_interval",
            "--sync-interval",
        );
        overlay.value(
            &mut sink.host_identifier,
            self.host_identifier.as_ref(),
            "sink.host_identifier",
            "--host-identifier",
        );
        overlay.value(
            &mut sink.skip_empty_files,
            self.skip_empty_files.then_some(true).as_ref(),
            "sink.skip_empty_files",
            "--skip-empty-files",
        );
    }
}
