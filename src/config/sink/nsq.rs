//! `[sink]`'s nsq settings (`sink.kind = "nsq"`): the nsqd to publish to and the topic.

use super::{RawSink, SinkSettings};
use crate::config::{check_host_port, check_name, ConfigError};

/// The nsq sink: its nsqd addresses and topic, both named at once when both are missing.
///
/// # Errors
///
/// What is missing, an address that is not `host:port`, a topic nsqd refuses.
pub(super) fn validate(raw: &RawSink) -> Result<SinkSettings, ConfigError> {
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
    Ok(SinkSettings::Nsq {
        nsqd_tcp_addresses: addrs,
        topic,
    })
}
