//! `[dedupe]`: how bodies are keyed and what the pipeline does with each outcome, validated
//! into a [`Keyer`] and the pipeline's [`Policy`].
//!
//! Defaults are [`Policy::default`]'s; this module only overrides what the file or flags set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::source::Source;
use super::{invalid, quote, ConfigError, Dur, Wording};
use crate::dedup::digest::{DigestAlgorithm, DigestKey, KeySpec, Keyer};
use crate::pipeline::{
    InFlightPolicy, Policy, StoreErrorPolicy, DEFAULT_IN_FLIGHT_REQUEUE_DELAY,
    DEFAULT_STORE_ERROR_REQUEUE_DELAY,
};
use crate::setting::{names, section, DefaultValue, FlagValue, Only};

impl crate::setting::Overlay for InFlightPolicy {}
impl crate::setting::Overlay for StoreErrorPolicy {}

const IN_FLIGHT_POLICIES: [&str; 2] = names(&InFlightPolicy::NAMES);
const STORE_ERROR_POLICIES: [&str; 2] = names(&StoreErrorPolicy::NAMES);

/// Settings of a copy that is requeued, not finished, when its original is in flight.
const REQUEUE_IN_FLIGHT: Only = Only::one("dedupe.on_in_flight", &["requeue"]);

/// Settings of a message that is requeued, not processed, when the store fails.
const REQUEUE_ON_STORE_ERROR: Only = Only::one("dedupe.on_store_error", &["requeue"]);

section! {
    /// `[dedupe]`: how bodies are keyed and what happens to each outcome.
    pub struct RawDedupe in "dedupe", heading "De-duplication" {
        /// Key of a body: `body` or `json:<pointer>`.
        key: String, flag("key", rank: 1, value_name: "KEY");
        /// Digest of the key: `xxh3`, `xxh3:<seed>`, `md5`, or `blake3` with --digest-key-file.
        digest: String, flag("digest", rank: 2, value_name: "DIGEST");
        /// File with a 32-byte key (raw or 64 hex digits): digests become keyed BLAKE3, which
        /// nobody without the key can predict. Every consumer sharing a Memcached table needs the
        /// same key.
        digest_key_file: PathBuf, flag("digest-key-file", rank: 4, value_name: "FILE", value: FlagValue::Path);
        /// A copy whose original is being handled: requeue it (default) or finish it.
        on_in_flight: InFlightPolicy, default(DefaultValue::Text("requeue")),
            flag("on-in-flight", rank: 5, value_name: "POLICY", value: FlagValue::Names(&IN_FLIGHT_POLICIES));
        /// Requeue delay of such a copy (default {default}).
        in_flight_requeue_delay: Dur, default(DefaultValue::Duration(DEFAULT_IN_FLIGHT_REQUEUE_DELAY)), only(&REQUEUE_IN_FLIGHT),
            flag("in-flight-requeue-delay", rank: 6, value_name: "DURATION", value: FlagValue::Duration);
        /// When the store fails: requeue the message (default) or process it without
        /// de-duplication.
        on_store_error: StoreErrorPolicy, default(DefaultValue::Text("requeue")),
            flag("on-store-error", rank: 7, value_name: "POLICY", value: FlagValue::Names(&STORE_ERROR_POLICIES));
        /// Requeue delay after a store error (default {default}).
        store_error_requeue_delay: Dur, default(DefaultValue::Duration(DEFAULT_STORE_ERROR_REQUEUE_DELAY)), only(&REQUEUE_ON_STORE_ERROR),
            flag("store-error-requeue-delay", rank: 8, value_name: "DURATION", value: FlagValue::Duration);
        /// Copies arriving longer after their original than this (such as 10m) pass again:
        /// for bodies that repeat on purpose. Off by default.
        max_age: Dur, only(&super::store::TABLE),
            flag("max-age", rank: 3, value_name: "DURATION", value: FlagValue::Duration);
    }
}

impl RawDedupe {
    /// The digest the settings name: keyed BLAKE3 with the key read from
    /// `dedupe.digest_key_file`, else `dedupe.digest` (xxh3 by default).
    pub(super) fn digest_algorithm(&self) -> Result<DigestAlgorithm, ConfigError> {
        Ok(match (&self.digest_key_file, self.digest.as_deref()) {
            (Some(path), None | Some("blake3")) => {
                DigestAlgorithm::Blake3Keyed(read_digest_key("dedupe.digest_key_file", path)?)
            }
            (Some(_), Some(other)) => {
                return Err(invalid(
                    "dedupe.digest",
                    quote(Some(other)),
                    Wording::from("a digest key file selects keyed BLAKE3; set ")
                        .key("dedupe.digest")
                        .text(" to \"blake3\" or leave it out"),
                ))
            }
            (None, Some("blake3")) => {
                return Err(ConfigError::Missing {
                    key: "dedupe.digest_key_file",
                    flags: &["--digest-key-file"],
                })
            }
            (None, digest) => {
                digest
                    .unwrap_or("xxh3")
                    .parse()
                    .map_err(|e: crate::error::SpecError| {
                        invalid("dedupe.digest", quote(digest), e.to_string())
                    })?
            }
        })
    }

    pub(super) fn validate(&self, source: &Source) -> Result<(Keyer, Policy), ConfigError> {
        let key: KeySpec = self.key.as_deref().unwrap_or("body").parse().map_err(
            |e: crate::error::SpecError| {
                invalid("dedupe.key", quote(self.key.as_deref()), e.to_string())
            },
        )?;
        let digest = self.digest_algorithm()?;
        let defaults = Policy::default();
        let policy = Policy {
            on_in_flight: self.on_in_flight.unwrap_or(defaults.on_in_flight),
            in_flight_requeue_delay: self
                .in_flight_requeue_delay
                .map_or(defaults.in_flight_requeue_delay, |d| d.0),
            on_store_error: self.on_store_error.unwrap_or(defaults.on_store_error),
            store_error_requeue_delay: self
                .store_error_requeue_delay
                .map_or(defaults.store_error_requeue_delay, |d| d.0),
            backoff: source.backoff,
            max_backoff: source.max_backoff,
            max_attempts: source.max_attempts,
            // Touch and renew twice per message timeout, so one late keepalive is not fatal.
            keepalive: (source.msg_timeout / 2).max(Duration::from_millis(100)),
            max_held_copies: defaults.max_held_copies,
        };
        Ok((Keyer::new(key, digest), policy))
    }
}

/// Reads a keyed digest's key from `path`; errors name the setting `key` (a config key, or a
/// flag where there is no config file).
///
/// # Errors
///
/// The file cannot be read or is not a key; the message names the file, never its contents.
pub(crate) fn read_digest_key(key: &'static str, path: &Path) -> Result<DigestKey, ConfigError> {
    let contents = std::fs::read(path).map_err(|error| {
        invalid(
            key,
            quote(Some(&path.display().to_string())),
            format!("cannot read it: {error}"),
        )
    })?;
    DigestKey::from_file_contents(&contents)
        .map_err(|reason| invalid(key, quote(Some(&path.display().to_string())), reason))
}

impl RawDedupe {
    /// `dedupe.max_age`: done entries older than this count as not seen.
    pub(super) fn max_age_duration(&self) -> Result<Option<Duration>, ConfigError> {
        match self.max_age {
            None => Ok(None),
            Some(Dur(age)) if age < Duration::from_secs(1) => Err(invalid(
                "dedupe.max_age",
                format!("{age:?}"),
                "must be at least 1s (entries carry their time in whole seconds)",
            )),
            Some(Dur(age)) => Ok(Some(age)),
        }
    }
}
