//! The file sink's keys of `[sink]` (`sink.kind = "file"`, `nsq_to_file`'s) validated into
//! its [`FileSinkConfig`], its start-up summary and its build. A setting not given keeps the
//! file sink's own default ([`FileSinkConfig::new`]); its rules are the file sink's
//! ([`FileSinkConfig::validate`]), named here by the key the user typed.

use std::fmt;

use super::{FileSink, FileSinkConfig, DEFAULT_GZIP_LEVEL};
use crate::setting::{invalid, output_name, quote, ConfigError, Dur};
use crate::sink::room::{Build, Room};
use crate::sink::{BuildError, RawSink};

/// The file sink's flags are listed under their own heading.
pub(crate) const FILE_HEADING: &str = "File sink (as nsq_to_file)";

/// The file sink's keys: the rows of `[sink]`'s table, for `sinks!`.
macro_rules! sink_keys {
    ($kind:literal [$($rest:tt)*] [$($rows:tt)*]) => {
        $crate::sink::room::sink_section! { [$($rest)*] [$($rows)*
            /// Directory closed files go to.
            output_dir: std::path::PathBuf, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("output-dir", heading: $crate::sink::file::settings::FILE_HEADING, value_name: "DIR",
                     value: $crate::setting::FlagValue::Path);
            /// Directory files are written in until closed (default: the output dir).
            work_dir: std::path::PathBuf, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("work-dir", heading: $crate::sink::file::settings::FILE_HEADING, value_name: "DIR",
                     value: $crate::setting::FlagValue::Path);
            /// File name with `<TOPIC>`, `<HOST>`, `<REV>`, `<DATETIME>`, `<PID>` (default
            /// {default}).
            filename_format: String,
                default($crate::setting::DefaultValue::Text($crate::sink::DEFAULT_FILENAME_FORMAT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("filename-format", heading: $crate::sink::file::settings::FILE_HEADING,
                     value_name: "FORMAT");
            /// `<DATETIME>` as strftime, UTC (default {default}: a file per hour).
            datetime_format: String,
                default($crate::setting::DefaultValue::Text($crate::sink::DEFAULT_DATETIME_FORMAT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("datetime-format", heading: $crate::sink::file::settings::FILE_HEADING,
                     value_name: "FORMAT");
            /// Close a file after this long.
            rotate_interval: $crate::setting::Dur, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("rotate-interval", heading: $crate::sink::file::settings::FILE_HEADING,
                     value_name: "DURATION", value: $crate::setting::FlagValue::Duration);
            /// Close a file at this size, such as 100MiB.
            rotate_size: String, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("rotate-size", heading: $crate::sink::file::settings::FILE_HEADING, value_name: "SIZE");
            /// Gzip the files (a member per sync).
            gzip: bool, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("gzip", heading: $crate::sink::file::settings::FILE_HEADING,
                     value: $crate::setting::FlagValue::Switch);
            /// Gzip level 1-9 (default {default}; implies --gzip).
            gzip_level: u32,
                default($crate::setting::DefaultValue::Number($crate::sink::DEFAULT_GZIP_LEVEL as u64)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("gzip-level", heading: $crate::sink::file::settings::FILE_HEADING, value_name: "N",
                     value: $crate::setting::FlagValue::Small);
            /// Gather records this long before each write and fsync (default {default}: as soon as the disk is
            /// free); longer means fewer fsyncs and later FINs.
            sync_interval: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::sink::file::DEFAULT_SYNC_INTERVAL)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("sync-interval", heading: $crate::sink::file::settings::FILE_HEADING,
                     value_name: "DURATION", value: $crate::setting::FlagValue::Duration);
            /// `<HOST>` in file names (default: the short host name).
            host_identifier: String, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("host-identifier", heading: $crate::sink::file::settings::FILE_HEADING, value_name: "NAME");
            /// Remove files that got no record instead of keeping them.
            skip_empty_files: bool, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("skip-empty-files", heading: $crate::sink::file::settings::FILE_HEADING,
                     value: $crate::setting::FlagValue::Switch);
        ] }
    };
}

pub(crate) use sink_keys;

impl Room for FileSink {
    type Settings = FileSinkConfig;

    fn validate(raw: &RawSink, topic: &str, _channel: &str) -> Result<FileSinkConfig, ConfigError> {
        validate(raw, topic)
    }

    fn summary(config: &FileSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        summary(config, f)
    }

    async fn build(config: &FileSinkConfig, _with: &Build<'_>) -> Result<FileSink, BuildError> {
        FileSink::new(config.clone()).map_err(|(key, reason)| BuildError::FileSink { key, reason })
    }
}

/// The file sink's settings: `nsq_to_file`'s, for the consumed `topic`.
///
/// # Errors
///
/// The first setting that is wrong, by its key: a missing output directory, a size, a
/// directory, format or host name the file sink refuses.
fn validate(raw: &RawSink, topic: &str) -> Result<FileSinkConfig, ConfigError> {
    let output_dir = raw.output_dir.clone().ok_or(ConfigError::Missing {
        key: "sink.output_dir",
        flags: &["--output-dir"],
    })?;
    let mut config = FileSinkConfig::new(output_dir, topic.to_owned());
    config.work_dir = raw.work_dir.clone();
    if let Some(format) = &raw.filename_format {
        config.filename_format = format.clone();
    }
    if let Some(format) = &raw.datetime_format {
        config.datetime_format = format.clone();
    }
    config.rotate_interval = match raw.rotate_interval {
        Some(Dur(d)) if d.is_zero() => None,
        Some(Dur(d)) => Some(d),
        None => None,
    };
    if let Some(text) = &raw.rotate_size {
        let bytes = crate::units::parse_bytes(text)
            .map_err(|reason| invalid("sink.rotate_size", quote(Some(text)), reason))?;
        config.rotate_size = (bytes > 0).then_some(bytes);
    }
    if raw.gzip == Some(true) || raw.gzip_level.is_some() {
        config.gzip_level = Some(raw.gzip_level.unwrap_or(DEFAULT_GZIP_LEVEL));
    }
    if let Some(Dur(d)) = raw.sync_interval {
        config.sync_interval = d;
    }
    if let Some(host) = &raw.host_identifier {
        config.host_identifier = host.clone();
    }
    config.skip_empty_files = raw.skip_empty_files.unwrap_or(false);
    config.validate().map_err(|(key, reason)| {
        let value = match key {
            "sink.output_dir" => quote(Some(&config.output_dir.display().to_string())),
            "sink.work_dir" => quote(
                config
                    .work_dir
                    .as_ref()
                    .map(|d| d.display().to_string())
                    .as_deref(),
            ),
            "sink.filename_format" => quote(Some(&config.filename_format)),
            "sink.datetime_format" => quote(Some(&config.datetime_format)),
            "sink.host_identifier" => quote(Some(&config.host_identifier)),
            _ => config.gzip_level.unwrap_or_default().to_string(),
        };
        invalid(key, value, reason)
    })?;
    output_name::check_file_sink(&config.filename_format, config.gzip_level.is_some())?;
    Ok(config)
}

/// The startup line's summary: `file dir=/var/archive format=<TOPIC>.<HOST><REV>.<DATETIME>.log`.
fn summary(config: &FileSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "file dir={} format={}",
        config.output_dir.display(),
        config.filename_format
    )?;
    if let Some(work) = &config.work_dir {
        write!(f, " work_dir={}", work.display())?;
    }
    if let Some(level) = config.gzip_level {
        write!(f, " gzip={level}")?;
    }
    Ok(())
}
