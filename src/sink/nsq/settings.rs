//! The nsq sink's keys of `[sink]` (`sink.kind = "nsq"`): the nsqd to publish to and the
//! topic, validated into [`NsqSinkConfig`]; its start-up summary and its build.

use std::fmt;

use super::NsqSink;
use crate::nsq::{ProducerConfig, Transport};
use crate::setting::{check_host_port, check_name, ConfigError};
use crate::sink::room::{Build, Room};
use crate::sink::{BuildError, RawSink};

/// The nsq sink's keys: the rows of `[sink]`'s table, for `sinks!`.
macro_rules! sink_keys {
    ($kind:literal [$($rest:tt)*] [$($rows:tt)*]) => {
        $crate::sink::room::sink_section! { [$($rest)*] [$($rows)*
            /// nsqd TCP address to publish to (repeatable, or comma-separated; nsq sink).
            destination_nsqd_tcp_addresses: Vec<String>,
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("destination-nsqd-tcp-address", value_name: "ADDR",
                     value: $crate::setting::FlagValue::List { delimiter: Some(',') });
            /// Topic to publish to (nsq sink).
            destination_topic: String, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("destination-topic", value_name: "TOPIC");
        ] }
    };
}

pub(crate) use sink_keys;

/// Where the nsq sink publishes: a topic on these nsqd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsqSinkConfig {
    /// nsqd TCP addresses (`host:port`).
    pub nsqd_tcp_addresses: Vec<String>,
    /// The destination topic.
    pub topic: String,
}

impl Room for NsqSink {
    type Settings = NsqSinkConfig;

    fn validate(raw: &RawSink, _topic: &str, _channel: &str) -> Result<NsqSinkConfig, ConfigError> {
        validate(raw)
    }

    /// `nsq PUB events.unique to 10.0.0.1:4150`.
    fn summary(config: &NsqSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nsq PUB {} to {}",
            config.topic,
            config.nsqd_tcp_addresses.join(",")
        )
    }

    async fn build(config: &NsqSinkConfig, with: &Build<'_>) -> Result<NsqSink, BuildError> {
        NsqSink::new(
            producer_config(&config.nsqd_tcp_addresses, with.producer),
            config.topic.clone(),
        )
        .map_err(BuildError::Nsq)
    }
}

/// A producer's settings: the addresses, and the transport of `[producer_opt]` (the nsq
/// sink's, and the nsq dead-letter's).
pub(crate) fn producer_config(addresses: &[String], transport: &Transport) -> ProducerConfig {
    let mut config = ProducerConfig::new(addresses.to_vec());
    config.transport = transport.clone();
    config
}

/// The nsq sink: its nsqd addresses and topic, both named at once when both are missing.
///
/// # Errors
///
/// What is missing, an address that is not `host:port`, a topic nsqd refuses.
fn validate(raw: &RawSink) -> Result<NsqSinkConfig, ConfigError> {
    let addrs = raw
        .destination_nsqd_tcp_addresses
        .clone()
        .unwrap_or_default();
    let (Some(topic), false) = (raw.destination_topic.clone(), addrs.is_empty()) else {
        let mut missing = Vec::new();
        if addrs.is_empty() {
            missing.push(ConfigError::Missing {
                key: "sink.destination_nsqd_tcp_addresses",
                flags: &["--destination-nsqd-tcp-address"],
            });
        }
        if raw.destination_topic.is_none() {
            missing.push(ConfigError::Missing {
                key: "sink.destination_topic",
                flags: &["--destination-topic"],
            });
        }
        return Err(ConfigError::all_missing(missing));
    };
    for a in &addrs {
        check_host_port("sink.destination_nsqd_tcp_addresses", a)?;
    }
    check_name("sink.destination_topic", "topic", &topic)?;
    Ok(NsqSinkConfig {
        nsqd_tcp_addresses: addrs,
        topic,
    })
}
