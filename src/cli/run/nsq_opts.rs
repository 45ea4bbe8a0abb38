//! `run` flags of `[consumer_opt]` and `[producer_opt]`: `--consumer-opt KEY,VALUE` and
//! `--producer-opt KEY,VALUE` with go-nsq's option names (as `nsq_to_nsq` takes them), and
//! named flags for the consumer's TLS, compression and AUTH.
//!
//! `--consumer-opt` also takes the go-nsq names of settings that have a `[source]` key
//! (`max_in_flight`, `msg_timeout`, `heartbeat_interval`, ...), and sets that key.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{Dur, RawConfig, RawNsqOpts, OPTION_NAMES};
use clap::Args;

use super::section::SectionFlags;
use super::FlagRecorder;

/// go-nsq option names `--consumer-opt` maps to `[source]` keys.
const SOURCE_OPTIONS: &[&str] = &[
    "max_in_flight",
    "msg_timeout",
    "heartbeat_interval",
    "max_attempts",
    "lookupd_poll_interval",
];

/// How nsqd is reached: TLS, compression, AUTH.
#[derive(Debug, Args)]
#[command(next_help_heading = "NSQ connection")]
pub(crate) struct NsqOptFlags {
    /// A go-nsq option of the consumer as KEY,VALUE (a bare KEY means true), as nsq_to_nsq's
    /// (repeatable). `consumer_opt.KEY`, or `source.KEY` for max_in_flight, msg_timeout,
    /// heartbeat_interval, max_attempts and lookupd_poll_interval.
    #[arg(long = "consumer-opt", value_name = "KEY,VALUE", value_parser = parse_consumer_opt)]
    pub(crate) consumer_opt: Vec<NsqOpt>,
    /// A go-nsq option of the producers (the nsq sink and the nsq dead-letter) as KEY,VALUE
    /// (repeatable). `producer_opt.KEY`.
    #[arg(long = "producer-opt", value_name = "KEY,VALUE", value_parser = parse_producer_opt)]
    pub(crate) producer_opt: Vec<NsqOpt>,
    /// The named flags of the consumer's options (`--tls`, `--snappy`, ...).
    #[command(flatten)]
    pub(crate) named: SectionFlags<RawNsqOpts>,
}

/// One `KEY,VALUE` of `--consumer-opt` or `--producer-opt`, its value parsed by its key's type.
#[derive(Debug, Clone)]
pub(crate) struct NsqOpt {
    key: &'static str,
    value: Value,
}

#[derive(Debug, Clone)]
enum Value {
    Bool(bool),
    Path(PathBuf),
    Text(String),
    Count(u64),
    Signed(i64),
    Duration(Duration),
}

fn parse_consumer_opt(text: &str) -> Result<NsqOpt, String> {
    parse_opt(text, true)
}

fn parse_producer_opt(text: &str) -> Result<NsqOpt, String> {
    parse_opt(text, false)
}

fn parse_opt(text: &str, consumer: bool) -> Result<NsqOpt, String> {
    let (name, value) = match text.split_once(',') {
        Some((name, value)) => (name, Some(value)),
        None => (text, None),
    };
    let known = OPTION_NAMES
        .iter()
        .chain(if consumer { SOURCE_OPTIONS } else { &[] })
        .find(|known| **known == name)
        .copied();
    let Some(key) = known else {
        let mut names: Vec<&str> = OPTION_NAMES.to_vec();
        if consumer {
            names.extend_from_slice(SOURCE_OPTIONS);
        }
        names.sort_unstable();
        return Err(format!(
            "unknown option {name:?}; known: {}",
            names.join(", ")
        ));
    };
    let bool_key = matches!(
        key,
        "tls_v1" | "tls_insecure_skip_verify" | "snappy" | "deflate"
    );
    let value = match (value, bool_key) {
        (None, true) => Value::Bool(true),
        (None, false) => return Err(format!("expected {key},VALUE")),
        (Some(v), true) => Value::Bool(
            v.parse()
                .map_err(|_| format!("{key}: expected true or false, got {v:?}"))?,
        ),
        (Some(v), false) => match key {
            "tls_root_ca_file" | "tls_cert" | "tls_key" | "auth_secret_file" => {
                Value::Path(v.into())
            }
            "tls_min_version" | "auth_secret" | "user_agent" => Value::Text(v.to_owned()),
            "output_buffer_size" => Value::Signed(
                v.parse()
                    .map_err(|_| format!("{key}: expected a number of bytes, got {v:?}"))?,
            ),
            "output_buffer_timeout"
            | "msg_timeout"
            | "heartbeat_interval"
            | "lookupd_poll_interval" => {
                // The file's rule for a duration, as for the named flags.
                Value::Duration(crate::units::parse_duration(v).map_err(|e| format!("{key}: {e}"))?)
            }
            _ => Value::Count(
                v.parse()
                    .map_err(|_| format!("{key}: expected a whole number, got {v:?}"))?,
            ),
        },
    };
    Ok(NsqOpt { key, value })
}

impl NsqOptFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, recorder: &mut FlagRecorder<'_>) {
        for opt in &self.consumer_opt {
            set(raw, true, opt, recorder);
        }
        for opt in &self.producer_opt {
            set(raw, false, opt, recorder);
        }
        // The named flags win over `--consumer-opt`.
        self.named.apply(&mut raw.consumer_opt, recorder);
    }
}

/// Sets one option: a `[source]` key, or a field of `[consumer_opt]` / `[producer_opt]`.
fn set(raw: &mut RawConfig, consumer: bool, opt: &NsqOpt, recorder: &mut FlagRecorder<'_>) {
    let source = &mut raw.source;
    let key = if consumer {
        consumer_key(opt.key)
    } else {
        producer_key(opt.key)
    };
    // Errors name the option as typed, `--producer-opt deflate_level`. Leaked: one short
    // string per option given, for the life of the process that parsed them.
    let flag: &'static str = Box::leak(
        format!(
            "--{}-opt {}",
            if consumer { "consumer" } else { "producer" },
            opt.key
        )
        .into_boxed_str(),
    );
    match (opt.key, &opt.value) {
        ("max_in_flight", Value::Count(n)) => {
            source.max_in_flight = Some(u32::try_from(*n).unwrap_or(u32::MAX));
            recorder.record("source.max_in_flight", flag, true);
        }
        ("max_attempts", Value::Count(n)) => {
            source.max_attempts = Some(u16::try_from(*n).unwrap_or(u16::MAX));
            recorder.record("source.max_attempts", flag, true);
        }
        ("msg_timeout", Value::Duration(d)) => {
            source.msg_timeout = Some(Dur(*d));
            recorder.record("source.msg_timeout", flag, true);
        }
        ("heartbeat_interval", Value::Duration(d)) => {
            source.heartbeat_interval = Some(Dur(*d));
            recorder.record("source.heartbeat_interval", flag, true);
        }
        ("lookupd_poll_interval", Value::Duration(d)) => {
            source.lookupd_poll_interval = Some(Dur(*d));
            recorder.record("source.lookupd_poll_interval", flag, true);
        }
        _ => {
            let target = if consumer {
                &mut raw.consumer_opt
            } else {
                &mut raw.producer_opt
            };
            set_opt(target, opt);
            recorder.record(key, flag, true);
        }
    }
}

fn set_opt(opts: &mut RawNsqOpts, opt: &NsqOpt) {
    // Out-of-range numbers saturate; validation names the key and the limits.
    let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    match (opt.key, opt.value.clone()) {
        ("tls_v1", Value::Bool(b)) => opts.tls_v1 = Some(b),
        ("tls_insecure_skip_verify", Value::Bool(b)) => opts.tls_insecure_skip_verify = Some(b),
        ("snappy", Value::Bool(b)) => opts.snappy = Some(b),
        ("deflate", Value::Bool(b)) => opts.deflate = Some(b),
        ("tls_root_ca_file", Value::Path(p)) => opts.tls_root_ca_file = Some(p),
        ("tls_cert", Value::Path(p)) => opts.tls_cert = Some(p),
        ("tls_key", Value::Path(p)) => opts.tls_key = Some(p),
        ("auth_secret_file", Value::Path(p)) => opts.auth_secret_file = Some(p),
        ("tls_min_version", Value::Text(t)) => opts.tls_min_version = Some(t),
        ("auth_secret", Value::Text(t)) => opts.auth_secret = Some(t),
        ("user_agent", Value::Text(t)) => opts.user_agent = Some(t),
        ("deflate_level", Value::Count(n)) => opts.deflate_level = Some(small(n)),
        ("sample_rate", Value::Count(n)) => {
            opts.sample_rate = Some(u8::try_from(n).unwrap_or(u8::MAX));
        }
        ("output_buffer_size", Value::Signed(n)) => opts.output_buffer_size = Some(n),
        ("output_buffer_timeout", Value::Duration(d)) => opts.output_buffer_timeout = Some(Dur(d)),
        // `parse_opt` pairs every key with its type; there is nothing else to set.
        _ => {}
    }
}

fn consumer_key(name: &str) -> &'static str {
    crate::config::option_key(true, name)
}

fn producer_key(name: &str) -> &'static str {
    crate::config::option_key(false, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_by_key_and_type() {
        assert!(parse_consumer_opt("tls_v1").is_ok());
        assert!(parse_consumer_opt("max_in_flight,10").is_ok());
        assert!(parse_producer_opt("snappy,true").is_ok());
        let error = parse_producer_opt("max_in_flight,10").unwrap_err();
        assert!(
            error.starts_with("unknown option \"max_in_flight\"; known: auth_secret, "),
            "{error}"
        );
        assert_eq!(
            parse_consumer_opt("deflate_level,high").unwrap_err(),
            "deflate_level: expected a whole number, got \"high\""
        );
        assert_eq!(
            parse_consumer_opt("snappy,yes").unwrap_err(),
            "snappy: expected true or false, got \"yes\""
        );
    }
}
