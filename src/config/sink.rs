//! `[sink]` and `[dead_letter]`: where unique messages go and where undeliverable ones go,
//! validated into [`SinkSettings`] and [`DeadLetterSettings`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::source::RawSource;
use super::{check_host_port, check_name, invalid, quote, ConfigError, Dur};
use crate::http::HttpUrl;

/// How long one POST of the http sink may take when `sink.timeout` is not given.
pub(crate) const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where unique messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// One line per message on standard output.
    Stdout,
    /// Publish to a topic on nsqd.
    Nsq,
    /// POST to a URL.
    Http,
    /// Discard (benchmarks).
    Null,
}

impl SinkKind {
    /// Every kind with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, SinkKind); 4] = [
        ("stdout", SinkKind::Stdout),
        ("nsq", SinkKind::Nsq),
        ("http", SinkKind::Http),
        ("null", SinkKind::Null),
    ];
}

/// Where undeliverable messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterKind {
    /// An NSQ topic.
    Nsq,
    /// A file of JSON lines.
    File,
}

/// `[sink]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
    pub kind: Option<SinkKind>,
    pub destination_nsqd_tcp_addresses: Option<Vec<String>>,
    pub destination_topic: Option<String>,
    pub post: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub timeout: Option<Dur>,
}

/// `[dead_letter]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    pub kind: DeadLetterKind,
    pub path: Option<PathBuf>,
    pub nsqd_tcp_addresses: Option<Vec<String>>,
    pub topic: Option<String>,
}

/// The validated sink.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkSettings {
    /// Standard output.
    Stdout,
    /// Publish to `topic` on these nsqd.
    Nsq {
        /// nsqd TCP addresses.
        nsqd_tcp_addresses: Vec<String>,
        /// Destination topic.
        topic: String,
    },
    /// POST to a URL.
    Http {
        /// The URL.
        url: HttpUrl,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// Per-request timeout.
        timeout: Duration,
    },
    /// Discard.
    Null,
}

/// The validated dead-letter.
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

impl RawSink {
    pub(super) fn validate(&self) -> Result<SinkSettings, ConfigError> {
        Ok(match self.kind.unwrap_or(SinkKind::Stdout) {
            SinkKind::Stdout => SinkSettings::Stdout,
            SinkKind::Null => SinkSettings::Null,
            SinkKind::Nsq => {
                let addrs = self
                    .destination_nsqd_tcp_addresses
                    .clone()
                    .unwrap_or_default();
                if addrs.is_empty() {
                    return Err(ConfigError::Missing {
                        key: "sink.destination_nsqd_tcp_addresses",
                        flags: &["--destination-nsqd-tcp-address"],
                    });
                }
                for a in &addrs {
                    check_host_port("sink.destination_nsqd_tcp_addresses", a)?;
                }
                let topic = self.destination_topic.clone().ok_or(ConfigError::Missing {
                    key: "sink.destination_topic",
                    flags: &["--destination-topic"],
                })?;
                check_name("sink.destination_topic", "topic", &topic)?;
                SinkSettings::Nsq {
                    nsqd_tcp_addresses: addrs,
                    topic,
                }
            }
            SinkKind::Http => {
                let post = self.post.as_deref().ok_or(ConfigError::Missing {
                    key: "sink.post",
                    flags: &["--post"],
                })?;
                let url: HttpUrl = post
                    .parse()
                    .map_err(|reason: String| invalid("sink.post", quote(Some(post)), reason))?;
                let headers = self.headers.clone().unwrap_or_default();
                for (name, value) in &headers {
                    if name.is_empty()
                        || !name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
                        || value.contains(['\r', '\n'])
                    {
                        return Err(invalid(
                            "sink.headers",
                            format!("{name:?} = {value:?}"),
                            "header names are letters, digits, '-' and '_'; values have no line breaks",
                        ));
                    }
                }
                SinkSettings::Http {
                    url,
                    headers: headers.into_iter().collect(),
                    timeout: self.timeout.map_or(DEFAULT_HTTP_TIMEOUT, |d| d.0),
                }
            }
        })
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
    Ok(Some(match dl.kind {
        DeadLetterKind::File => {
            DeadLetterSettings::File(dl.path.clone().ok_or(ConfigError::Required {
                key: "dead_letter.path",
                with: "`dead_letter.kind = \"file\"`",
            })?)
        }
        DeadLetterKind::Nsq => {
            let topic = dl.topic.clone().ok_or(ConfigError::Required {
                key: "dead_letter.topic",
                with: "`dead_letter.kind = \"nsq\"`",
            })?;
            check_name("dead_letter.topic", "topic", &topic)?;
            let addrs = dl
                .nsqd_tcp_addresses
                .clone()
                .or_else(|| source.nsqd_tcp_addresses.clone())
                .unwrap_or_default();
            if addrs.is_empty() {
                return Err(ConfigError::Required {
                    key: "dead_letter.nsqd_tcp_addresses",
                    with: "`dead_letter.kind = \"nsq\"` when `source.nsqd_tcp_addresses` is empty",
                });
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
