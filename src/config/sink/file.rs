//! `[sink]`'s file settings (`sink.kind = "file"`, `nsq_to_file`'s) validated into the file
//! sink's [`FileSinkConfig`]. A setting not given keeps the file sink's own default
//! ([`FileSinkConfig::new`]); its rules are the file sink's ([`FileSinkConfig::validate`]),
//! named here by the key the user typed.

use std::fmt;

use super::RawSink;
use crate::config::{invalid, output_name, quote, ConfigError, Dur};
use crate::sink::{FileSinkConfig, DEFAULT_GZIP_LEVEL};

/// The file sink's settings: `nsq_to_file`'s, for the consumed `topic`.
///
/// # Errors
///
/// The first setting that is wrong, by its key: a missing output directory, a size, a
/// directory, format or host name the file sink refuses.
pub(super) fn validate(raw: &RawSink, topic: &str) -> Result<FileSinkConfig, ConfigError> {
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
pub(super) fn summary(config: &FileSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
