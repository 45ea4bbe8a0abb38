//! `[dead_letter]`: where undeliverable messages go, validated into [`DeadLetterSettings`].
//!
//! Each setting is defined once, in [`RawDeadLetter`]'s table, flags included. A flag that
//! names a dead-letter of one kind (`--dead-letter-file`, `--dead-letter-topic`) sets the kind
//! too and replaces the file's dead-letter; `--dead-letter-nsqd-tcp-address` adds to the
//! file's, and alone makes an nsq dead-letter, whose topic the validation then asks for rather
//! than keeping an address that silently does nothing.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::source::RawSource;
use super::{check_host_port, check_name, output_name, ConfigError};
use crate::setting::{section, FlagValue, Only};

/// Where undeliverable messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterKind {
    /// An NSQ topic.
    Nsq,
    /// A file of JSON lines.
    File,
}

impl crate::setting::Overlay for DeadLetterKind {}

impl DeadLetterKind {
    /// Each kind by its name in the config file.
    pub const NAMES: [(&'static str, DeadLetterKind); 2] =
        [("nsq", DeadLetterKind::Nsq), ("file", DeadLetterKind::File)];

    /// The kind's name in the config file.
    pub fn name(self) -> &'static str {
        crate::setting::name_of(&Self::NAMES, self)
    }
}

/// The settings of the file dead-letter only.
const FILE: Only = Only::one("dead_letter.kind", &["file"]);

/// The settings of the nsq dead-letter only.
const NSQ: Only = Only::one("dead_letter.kind", &["nsq"]);

section! {
    /// `[dead_letter]`. The file must name the kind; flags set it.
    pub struct RawDeadLetter in "dead_letter", heading "Service" {
        /// Where undeliverable messages go.
        #[serde(deserialize_with = "crate::setting::required")]
        kind: DeadLetterKind;
        /// Append undeliverable messages to this file (JSON lines).
        path: PathBuf, only(&FILE),
            flag("dead-letter-file", rank: 1, value_name: "FILE", value: FlagValue::Path,
                 conflicts: &["topic"], replaces: &["topic", "nsqd_tcp_addresses"],
                 sets: Some(("kind", "file")));
        /// nsqd TCP address of the dead-letter topic (repeatable, or comma-separated).
        nsqd_tcp_addresses: Vec<String>, only(&NSQ),
            flag("dead-letter-nsqd-tcp-address", rank: 3, value_name: "ADDR",
                 value: FlagValue::List { delimiter: Some(',') });
        /// Publish undeliverable messages to this topic (on the source nsqd unless
        /// --dead-letter-nsqd-tcp-address).
        topic: String, only(&NSQ),
            flag("dead-letter-topic", rank: 2, value_name: "TOPIC",
                 replaces: &["path", "nsqd_tcp_addresses"], sets: Some(("kind", "nsq")));
    }
}

impl RawDeadLetter {
    /// The kind, which the file always names; a dead-letter made by flags without one
    /// (`--dead-letter-nsqd-tcp-address` alone) is an nsq one.
    pub fn kind_or_nsq(&self) -> DeadLetterKind {
        self.kind.unwrap_or(DeadLetterKind::Nsq)
    }
}

/// `[dead_letter]` as the file gives it; one without its `kind` is refused with the kinds and
/// the setting each needs, from the flags that set them (`--dead-letter-file` sets
/// `kind = "file"` with `path`).
///
/// # Errors
///
/// The section does not fit [`RawDeadLetter`].
pub(super) fn with_kinds<'de, D>(deserializer: D) -> Result<Option<RawDeadLetter>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    Option::<RawDeadLetter>::deserialize(deserializer).map_err(|error| {
        let missing = D::Error::missing_field("kind").to_string();
        let missing = missing.trim_end();
        if error.to_string().trim_end() != missing {
            return error;
        }
        let kinds: Vec<String> = <RawDeadLetter as crate::setting::Section>::SETTINGS
            .iter()
            .filter_map(|setting| {
                let (key, kind) = setting.sets?;
                Some(format!("`{key} = \"{kind}\"` (with `{}`)", setting.name))
            })
            .collect();
        D::Error::custom(format!("{missing}: set {}", kinds.join(" or ")))
    })
}

/// The validated dead-letter; `Display` is the startup line's summary.
#[derive(Debug, Clone, PartialEq)]
pub enum DeadLetterSettings {
    /// Append JSON lines to this file.
    File(PathBuf),
    /// Publish to `topic` on these nsqd.
    Nsq {
        /// nsqd TCP addresses.
        nsqd_tcp_addresses: Vec<String>,
        /// Topic.
        topic: String,
    },
}

impl fmt::Display for DeadLetterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadLetterSettings::File(path) => write!(f, "file {}", path.display()),
            DeadLetterSettings::Nsq {
                nsqd_tcp_addresses,
                topic,
            } => write!(f, "nsq PUB {topic} to {}", nsqd_tcp_addresses.join(",")),
        }
    }
}

/// Validates `[dead_letter]`; an nsq dead-letter publishes to the source's nsqd unless it
/// names its own.
pub(super) fn validate_dead_letter(
    dead_letter: Option<&RawDeadLetter>,
    source: &RawSource,
) -> Result<Option<DeadLetterSettings>, ConfigError> {
    let Some(dl) = dead_letter else {
        return Ok(None);
    };
    Ok(Some(match dl.kind_or_nsq() {
        DeadLetterKind::File => {
            let path = dl
                .path
                .clone()
                .ok_or(ConfigError::required("dead_letter.path", FILE.needs()))?;
            output_name::check_uncompressed(
                "dead_letter.path",
                &path.to_string_lossy(),
                "the dead-letter file",
                "plain JSON lines",
            )?;
            DeadLetterSettings::File(path)
        }
        DeadLetterKind::Nsq => {
            let topic = dl
                .topic
                .clone()
                .ok_or(ConfigError::required("dead_letter.topic", NSQ.needs()))?;
            check_name("dead_letter.topic", "topic", &topic)?;
            let addrs = dl
                .nsqd_tcp_addresses
                .clone()
                .or_else(|| source.nsqd_tcp_addresses.clone())
                .unwrap_or_default();
            if addrs.is_empty() {
                return Err(ConfigError::required(
                    "dead_letter.nsqd_tcp_addresses",
                    NSQ.needs()
                        .text(" when ")
                        .key("source.nsqd_tcp_addresses")
                        .text(" is empty"),
                ));
            }
            for a in &addrs {
                check_host_port("dead_letter.nsqd_tcp_addresses", a)?;
            }
            DeadLetterSettings::Nsq {
                nsqd_tcp_addresses: addrs,
                topic,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_must_name_the_kind() {
        let error = crate::config::Settings::from_toml("[dead_letter]\npath = \"/var/lib/p\"\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "invalid config file <string>: TOML parse error at line 1, column 1: missing field \
             `kind`: set `kind = \"file\"` (with `path`) or `kind = \"nsq\"` (with `topic`)"
        );
    }

    #[test]
    fn dead_letters_print_as_summaries() {
        assert_eq!(
            DeadLetterSettings::File("/var/lib/dead.ndjson".into()).to_string(),
            "file /var/lib/dead.ndjson"
        );
    }
}
