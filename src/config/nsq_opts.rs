//! `[consumer_opt]` and `[producer_opt]`: how the consumer and the producers (the `nsq` sink
//! and the `nsq` dead-letter) talk to nsqd, with go-nsq's option names as `nsq_to_nsq`'s
//! `--consumer-opt` / `--producer-opt` take them: TLS, compression, AUTH and IDENTIFY's
//! details.
//!
//! Rules, each checked here before anything connects:
//! - any `tls_*` option turns TLS on; `tls_v1 = false` with one of them is an error;
//! - `snappy` and `deflate` are exclusive; `deflate_level` (1-9) turns deflate on;
//! - the AUTH secret comes from `auth_secret` or `auth_secret_file` (one of them), and a file
//!   is read now, so a missing file fails the start, not the first connection;
//! - TLS files are read now too.

use std::path::PathBuf;
use std::time::Duration;

use super::{invalid, ConfigError, Dur, Wording};
use crate::nsq::{AuthSecret, Compression, Transport};
use crate::setting::{section, DefaultValue, FlagValue, Section as _};
use crate::tls::{TlsSettings, TlsVersion};

section! {
    /// The options as written, go-nsq's names. The flags are the consumer's, `consumer_opt.*`;
    /// `--producer-opt KEY,VALUE` sets the producers'.
    pub struct RawNsqOpts in "consumer_opt", heading "NSQ connection" {
        /// Consume over TLS; nsqd must have a certificate.
        tls_v1: bool, flag("tls", rank: 1, value: FlagValue::Switch);
        /// PEM file of CAs trusted for nsqd's certificate, besides the system's.
        tls_root_ca_file: PathBuf,
            flag("tls-root-ca-file", rank: 2, value_name: "FILE", value: FlagValue::Path);
        /// Accept any certificate of nsqd (tests only: anyone on the path can read the traffic).
        tls_insecure_skip_verify: bool,
            flag("tls-insecure-skip-verify", rank: 5, value: FlagValue::Switch);
        /// PEM client certificate, for nsqd's --tls-client-auth-policy.
        tls_cert: PathBuf, flag("tls-cert", rank: 3, value_name: "FILE", value: FlagValue::Path);
        /// PEM key of --tls-cert.
        tls_key: PathBuf, flag("tls-key", rank: 4, value_name: "FILE", value: FlagValue::Path);
        /// Lowest TLS version: tls1.2 (default) or tls1.3.
        tls_min_version: String, default(DefaultValue::Text("tls1.2")), flag("tls-min-version", rank: 6, value_name: "VERSION");
        /// Compress with snappy (exclusive with --deflate).
        snappy: bool, flag("snappy", rank: 7, value: FlagValue::Switch);
        /// Compress with deflate.
        deflate: bool, flag("deflate", rank: 8, value: FlagValue::Switch);
        /// Deflate level 1-9 (default {default}; implies --deflate).
        deflate_level: u32, default(DefaultValue::Number(crate::nsq::DEFAULT_DEFLATE_LEVEL as u64)), flag("deflate-level", rank: 9, value_name: "N", value: FlagValue::Small);
        /// AUTH secret for an nsqd with --auth-http-address; prefer the environment variable or
        /// --auth-secret-file, which stay out of process listings.
        auth_secret: String, flag("auth-secret", rank: 10, value_name: "SECRET");
        /// File holding the AUTH secret.
        auth_secret_file: PathBuf,
            flag("auth-secret-file", rank: 11, value_name: "FILE", value: FlagValue::Path);
        /// The user agent IDENTIFY sends.
        user_agent: String;
        /// nsqd's output buffer size for this consumer, in bytes (-1: off).
        output_buffer_size: i64;
        /// nsqd's output buffer timeout for this consumer.
        output_buffer_timeout: Dur;
        /// The percentage of messages nsqd sends this consumer, 1 to 99 (0: all of them).
        sample_rate: u8;
    }
}

/// Whose options: the consumer's or the producers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Consumer,
    Producer,
}

macro_rules! option_keys {
    ($($name:literal),* $(,)?) => {
        /// Every option's name, as `KEY` of `--consumer-opt KEY,VALUE`.
        #[cfg(feature = "cli")]
        pub(crate) const OPTION_NAMES: &[&str] = &[$($name),*];

        /// The config key of option `name` on `side`.
        pub(super) fn key(side: Side, name: &str) -> &'static str {
            match (side, name) {
                $(
                    (Side::Consumer, $name) => concat!("consumer_opt.", $name),
                    (Side::Producer, $name) => concat!("producer_opt.", $name),
                )*
                (Side::Consumer, _) => "consumer_opt",
                (Side::Producer, _) => "producer_opt",
            }
        }
    };
}

option_keys!(
    "tls_v1",
    "tls_root_ca_file",
    "tls_insecure_skip_verify",
    "tls_cert",
    "tls_key",
    "tls_min_version",
    "snappy",
    "deflate",
    "deflate_level",
    "auth_secret",
    "auth_secret_file",
    "user_agent",
    "output_buffer_size",
    "output_buffer_timeout",
    "sample_rate",
);

/// The config key of go-nsq option `name` of the consumer (`consumer_opt.name`) or of the
/// producers (`producer_opt.name`).
#[cfg(feature = "cli")]
pub(crate) fn option_key(consumer: bool, name: &str) -> &'static str {
    key(
        if consumer {
            Side::Consumer
        } else {
            Side::Producer
        },
        name,
    )
}

/// The IDENTIFY details only a consumer sends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) user_agent: Option<String>,
    pub(super) output_buffer_size: Option<i64>,
    pub(super) output_buffer_timeout: Option<Duration>,
    pub(super) sample_rate: Option<u8>,
}

impl RawNsqOpts {
    /// Each option's key on `side`, with whether it was given.
    pub(super) fn given_keys(&self, side: Side) -> Vec<(&'static str, bool)> {
        Self::SETTINGS
            .iter()
            .map(|setting| (key(side, setting.name), self.given(setting.name)))
            .collect()
    }

    /// Checks the options and builds the transport and IDENTIFY details for `side`.
    pub(super) fn validate(&self, side: Side) -> Result<(Transport, Identity), ConfigError> {
        let tls = self.validate_tls(side)?;
        let compression = self.validate_compression(side)?;
        let auth_secret = self.validate_auth_secret(side)?;
        self.validate_identity(side)?;
        Ok((
            Transport {
                tls,
                compression,
                auth_secret,
            },
            Identity {
                user_agent: self.user_agent.clone(),
                output_buffer_size: self.output_buffer_size,
                output_buffer_timeout: self.output_buffer_timeout.map(|d| d.0),
                sample_rate: self.sample_rate,
            },
        ))
    }

    /// TLS, when `tls_v1` or any other `tls_*` option asks for it, with its files read now: a
    /// typo fails the start, not every connection.
    fn validate_tls(&self, side: Side) -> Result<Option<TlsSettings>, ConfigError> {
        let key = |name| key(side, name);
        let tls_options = [
            self.tls_root_ca_file.is_some(),
            self.tls_insecure_skip_verify.is_some(),
            self.tls_cert.is_some(),
            self.tls_key.is_some(),
            self.tls_min_version.is_some(),
        ];
        let wanted = match self.tls_v1 {
            Some(false) if tls_options.iter().any(|&given| given) => {
                return Err(invalid(
                    key("tls_v1"),
                    "false",
                    "other tls_* options are set; remove them or turn TLS on",
                ))
            }
            Some(on) => on,
            None => tls_options.iter().any(|&given| given),
        };
        if !wanted {
            return Ok(None);
        }
        let min_version = match &self.tls_min_version {
            None => TlsVersion::default(),
            Some(text) => text
                .parse()
                .map_err(|reason| invalid(key("tls_min_version"), format!("{text:?}"), reason))?,
        };
        let settings = TlsSettings {
            root_ca_file: self.tls_root_ca_file.clone(),
            cert_file: self.tls_cert.clone(),
            key_file: self.tls_key.clone(),
            insecure_skip_verify: self.tls_insecure_skip_verify.unwrap_or(false),
            min_version,
        };
        crate::tls::client_config(&settings).map_err(|error| {
            let name = match error.what {
                "client certificate" => "tls_cert",
                "client key" => "tls_key",
                _ => "tls_root_ca_file",
            };
            invalid(key(name), path_text(&error.path), error.cause)
        })?;
        Ok(Some(settings))
    }

    /// Snappy, deflate at its level, or none; never both.
    fn validate_compression(&self, side: Side) -> Result<Compression, ConfigError> {
        let key = |name| key(side, name);
        let deflate = self.deflate.unwrap_or(false) || self.deflate_level.is_some();
        if self.deflate == Some(false) && self.deflate_level.is_some() {
            return Err(invalid(
                key("deflate_level"),
                self.deflate_level.unwrap_or_default().to_string(),
                "deflate is off; remove deflate_level or turn deflate on",
            ));
        }
        match (self.snappy.unwrap_or(false), deflate) {
            (true, true) => Err(invalid(
                key("snappy"),
                "true",
                "snappy and deflate are exclusive; choose one",
            )),
            (true, false) => Ok(Compression::Snappy),
            (false, true) => {
                let level = self
                    .deflate_level
                    .unwrap_or(crate::nsq::DEFAULT_DEFLATE_LEVEL);
                if !(1..=9).contains(&level) {
                    return Err(invalid(
                        key("deflate_level"),
                        level.to_string(),
                        "expected 1 (fastest) to 9 (smallest); nsqd caps it at its --max-deflate-level",
                    ));
                }
                Ok(Compression::Deflate { level })
            }
            (false, false) => Ok(Compression::None),
        }
    }

    /// The auth secret, given once: as itself or in a file. The secret itself is never shown,
    /// not even in an error.
    fn validate_auth_secret(&self, side: Side) -> Result<Option<AuthSecret>, ConfigError> {
        let key = |name| key(side, name);
        match (&self.auth_secret, &self.auth_secret_file) {
            (Some(_), Some(file)) => Err(invalid(
                key("auth_secret_file"),
                path_text(file),
                Wording::default()
                    .key(key("auth_secret"))
                    .text(" is set too; give the secret once"),
            )),
            (Some(text), None) => AuthSecret::new(text)
                .map(Some)
                .map_err(|reason| invalid(key("auth_secret"), "<redacted>", reason)),
            (None, Some(file)) => {
                let text = std::fs::read_to_string(file).map_err(|error| {
                    invalid(
                        key("auth_secret_file"),
                        path_text(file),
                        format!("cannot read it: {error}"),
                    )
                })?;
                AuthSecret::new(&text)
                    .map(Some)
                    .map_err(|reason| invalid(key("auth_secret_file"), path_text(file), reason))
            }
            (None, None) => Ok(None),
        }
    }

    /// The IDENTIFY options: those only a consumer sends are refused for a producer, and the
    /// sample rate is a percentage.
    fn validate_identity(&self, side: Side) -> Result<(), ConfigError> {
        let key = |name| key(side, name);
        if side == Side::Producer {
            let consumer_only = [
                (
                    "output_buffer_size",
                    self.output_buffer_size.map(|n| n.to_string()),
                ),
                (
                    "output_buffer_timeout",
                    self.output_buffer_timeout.map(|d| format!("{:?}", d.0)),
                ),
                ("sample_rate", self.sample_rate.map(|n| n.to_string())),
            ];
            if let Some((name, Some(value))) = consumer_only.into_iter().find(|(_, v)| v.is_some())
            {
                return Err(invalid(
                    key(name),
                    value,
                    "only a consumer sends it; set it in `consumer_opt`",
                ));
            }
        }
        match self.sample_rate {
            Some(rate) if rate > 99 => Err(invalid(
                key("sample_rate"),
                rate.to_string(),
                "expected 0 (all messages) to 99 percent",
            )),
            _ => Ok(()),
        }
    }
}

/// A path as an error quotes it.
fn path_text(path: &std::path::Path) -> String {
    format!("{:?}", path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(toml_text: &str) -> RawNsqOpts {
        toml::from_str(toml_text).unwrap()
    }

    fn error(toml_text: &str, side: Side) -> String {
        opts(toml_text).validate(side).unwrap_err().to_string()
    }

    #[test]
    fn options_build_the_transport() {
        let (transport, _) = opts("deflate_level = 3\nauth_secret = \" tok \"\n")
            .validate(Side::Consumer)
            .unwrap();
        assert_eq!(transport.compression, Compression::Deflate { level: 3 });
        assert_eq!(transport.auth_secret, Some(AuthSecret::new("tok").unwrap()));
        assert!(transport.tls.is_none());
        let (transport, _) = opts("tls_insecure_skip_verify = true\nsnappy = true\n")
            .validate(Side::Producer)
            .unwrap();
        assert!(transport.tls.unwrap().insecure_skip_verify);
        assert_eq!(transport.compression, Compression::Snappy);
    }

    #[test]
    fn bad_options_name_their_key_and_never_the_secret() {
        assert_eq!(
            error("snappy = true\ndeflate = true\n", Side::Consumer),
            "invalid `consumer_opt.snappy` = true: snappy and deflate are exclusive; choose one"
        );
        assert_eq!(
            error("deflate_level = 10\n", Side::Producer),
            "invalid `producer_opt.deflate_level` = 10: expected 1 (fastest) to 9 (smallest); \
             nsqd caps it at its --max-deflate-level"
        );
        assert_eq!(
            error("tls_min_version = \"tls9\"\n", Side::Consumer),
            "invalid `consumer_opt.tls_min_version` = \"tls9\": expected ssl3.0, tls1.0, \
             tls1.1, tls1.2 or tls1.3"
        );
        assert!(error(
            "tls_root_ca_file = \"/nonexistent/ca.pem\"\n",
            Side::Consumer
        )
        .starts_with("invalid `consumer_opt.tls_root_ca_file` = \"/nonexistent/ca.pem\": "));
        assert!(error(
            "auth_secret_file = \"/nonexistent/secret\"\n",
            Side::Consumer
        )
        .starts_with(
            "invalid `consumer_opt.auth_secret_file` = \"/nonexistent/secret\": cannot read it: "
        ));
        let e = error("auth_secret = \"  \"\n", Side::Consumer);
        assert_eq!(
            e,
            "invalid `consumer_opt.auth_secret` = <redacted>: the secret is empty"
        );
        assert_eq!(
            error("sample_rate = 5\n", Side::Producer),
            "invalid `producer_opt.sample_rate` = 5: only a consumer sends it; set it in `consumer_opt`"
        );
        assert!(OPTION_NAMES.contains(&"tls_v1") && OPTION_NAMES.len() == 15);
    }
}
