//! [`ConfigError`]: a configuration that cannot be used, each message naming the setting as
//! the user gave it (the flag, or the key) once it is shown ([`crate::wording`]).

use std::path::PathBuf;

use crate::wording::Wording;

/// A configuration that cannot be used. Each message names what the user typed: the flag when
/// the value came from a flag, else the config key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path} (check `--config` / NSQ_DEDUPE_CONFIG)")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown key, wrong type, bad value).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file (or `<string>`).
        path: String,
        /// The place (line, column and key) and the TOML parser's reason: no line of the
        /// file, and no value where it may hold a secret.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid `{}` = {value}: {reason}", given_by(key).unwrap_or(key))]
    Invalid {
        /// The key, as `section.name`; shown in the user's words, the flag the value came
        /// from, if it came from one.
        key: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what is accepted.
        reason: Wording,
    },
    /// A required value is missing.
    #[error("`{key}` is required: set it in the config file or {}", or_pass(flags))]
    Missing {
        /// The key, as `section.name`.
        key: &'static str,
        /// The flags that set it (any one of them): named when the error is shown in the
        /// user's words, as the binary shows it.
        flags: &'static [&'static str],
    },
    /// Several required values are missing: each is named.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    MissingAll(Vec<ConfigError>),
    /// A value that another one needs is missing.
    #[error(
        "`{key}` is required with {with}: set it in the config file{}",
        flag_of(key).map_or_else(String::new, |flag| format!(" or pass `{flag}`"))
    )]
    Required {
        /// The missing key, as `section.name`; shown in the user's words, also the flag
        /// that sets it, if one does.
        key: &'static str,
        /// The setting that needs it.
        with: Wording,
    },
    /// A setting was given that the other settings leave unused.
    #[error(
        "`{}` is used only with {needs}: remove it, or {}",
        named(key).unwrap_or(key),
        instead.as_ref().map_or_else(|| "set that too".to_owned(), ToString::to_string)
    )]
    Unused {
        /// The key, as `section.name`; shown in the user's words, the flag that gave it (or,
        /// with no config file, that sets it).
        key: &'static str,
        /// What it needs.
        needs: Wording,
        /// What to give instead of the setting that chose another kind (`use --x instead of
        /// --y`), when setting what it needs too would not do.
        instead: Option<Wording>,
    },
    /// The NSQ consumer refused its settings for a reason no single key explains.
    #[error("the NSQ consumer cannot start with these `[source]` settings")]
    Consumer(#[source] crate::nsq::Error),
    /// The shared table's settings are unusable; the store's message names the key.
    #[error(transparent)]
    Store(#[from] crate::error::StoreError),
}

impl ConfigError {
    /// The one missing setting of `missing`, or all of them in one error.
    pub(crate) fn all_missing(mut missing: Vec<ConfigError>) -> Self {
        match missing.len() {
            1 => missing.remove(0),
            _ => ConfigError::MissingAll(missing),
        }
    }

    pub(crate) fn required(key: &'static str, with: Wording) -> Self {
        ConfigError::Required { key, with }
    }
}

/// The flag or variable that gave `key`, if a flag did and the error is shown in the user's
/// words ([`FlagOrigins::show`](crate::wording::FlagOrigins::show)).
fn given_by(key: &str) -> Option<&'static str> {
    crate::wording::in_effect(|names| names.flag_for(key))
}

/// How the user gave `key`, or with no config file the flag that sets it, if the error is
/// shown in the user's words.
fn named(key: &str) -> Option<&'static str> {
    crate::wording::in_effect(|names| names.naming(key))
}

/// The flag that sets `key`, if one does and the error is shown in the user's words.
fn flag_of(key: &str) -> Option<&'static str> {
    crate::wording::in_effect(|names| names.flag_of(key))
}

/// "pass" one of `flags`, if the error is shown in the user's words (the binary's); a library
/// user has no flags to pass, and sets the key with the settings builder instead.
fn or_pass(flags: &[&str]) -> String {
    let listed = flags
        .iter()
        .map(|flag| format!("`{flag}`"))
        .collect::<Vec<_>>()
        .join(" or ");
    crate::wording::in_effect(|_| Some(format!("pass {listed}")))
        .unwrap_or_else(|| "with `Settings::builder()`".to_owned())
}

/// A value of `key` that is refused, and why.
pub(crate) fn invalid(
    key: &'static str,
    value: impl Into<String>,
    reason: impl Into<Wording>,
) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.into(),
        reason: reason.into(),
    }
}

/// A value as the file writes a string, quotes included (`""` for none).
pub(crate) fn quote(text: Option<&str>) -> String {
    format!("{:?}", text.unwrap_or(""))
}
