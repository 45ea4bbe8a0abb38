//! The sidecar's configuration: a TOML file and flags, merged, then validated into [`Settings`].
//!
//! Two stages, as ripgrep's low-level and high-level arguments: [`RawConfig`] is what the file
//! says (every key optional, unknown keys rejected), flags overwrite its fields, and
//! [`RawConfig::validate`] turns it into [`Settings`], checking every value and naming the key
//! and the value when one is wrong.
//!
//! ```toml
//! [source]                          # what to consume (names as in NSQ's own tools)
//! nsqd_tcp_addresses = ["127.0.0.1:4150"]
//! lookupd_http_addresses = []       # host:port or http://host:port
//! topic = "events"
//! channel = "nsq-dedupe"            # default
//! max_in_flight = 200               # default
//! msg_timeout = "60s"               # default
//! max_attempts = 5                  # default; then the dead-letter
//! backoff = "1s"                    # handler-failure REQ delay and consumer pause, doubling
//! max_backoff = "2m"
//!
//! [dedupe]
//! key = "json:/id"                  # or "body" (default)
//! digest = "xxh3"                   # or "xxh3:<seed>", "md5"
//! on_in_flight = "requeue"          # or "finish"
//! in_flight_requeue_delay = "1s"
//! on_store_error = "requeue"        # or "process"
//! store_error_requeue_delay = "1s"
//!
//! [store]
//! kind = "memory"                   # or "memcached", "none"
//! ways = 8
//! buckets = 8388608                 # or: probability + rate + window
//! # probability = 0.99
//! # rate = 1000
//! # window = "1h"
//! memcached_addresses = ["127.0.0.1:11211"]
//! namespace = "nsq-dedupe"
//! lease = "65s"                     # default: msg_timeout + 5 s
//! timeout = "500ms"
//!
//! [sink]
//! kind = "stdout"                   # or "nsq", "http", "null"
//! destination_nsqd_tcp_addresses = ["127.0.0.1:4150"]
//! destination_topic = "events.unique"
//! post = "http://127.0.0.1:8080/ingest"
//! headers = { "Content-Type" = "application/json" }
//! timeout = "10s"
//!
//! [dead_letter]                     # optional
//! kind = "file"                     # or "nsq"
//! path = "/var/lib/nsq-dedupe/dead-letter.ndjson"
//! # nsqd_tcp_addresses = [...]; topic = "events.dead"
//!
//! [metrics]
//! address = "127.0.0.1:9150"        # or "off"
//! status_interval = "10s"
//!
//! [shutdown]
//! grace = "10s"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::dedup::digest::{DigestAlgorithm, KeySpec, Keyer};
use crate::dedup::Geometry;
use crate::http::HttpUrl;
use crate::nsq::ConsumerConfig;
use crate::pipeline::{InFlightPolicy, Policy, StoreErrorPolicy};
use crate::MemcachedConfig;

/// Slots of the in-process table when no size is given: 64 MiB.
pub const DEFAULT_BUCKETS: u64 = 8 * 1024 * 1024;

/// The window the catch probability is reported for when none is configured.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// A configuration that cannot be used. Each message names the key (and flag) to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source} (check `--config` / NSQ_DEDUPE_CONFIG)")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown key, wrong type, bad value).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file (or `<string>`).
        path: String,
        /// The TOML parser's message, which names the key, its line and the value.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid `{key}` = {value}: {reason}")]
    Invalid {
        /// The key, as `section.name`.
        key: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A required value is missing.
    #[error("`{key}` is required: set it in the config file or pass `{flag}`")]
    Missing {
        /// The key, as `section.name`.
        key: &'static str,
        /// The flag that sets it.
        flag: &'static str,
    },
    /// A value that another one needs is missing (there is no flag for it).
    #[error("`{key}` is required with {with}: set it in the config file")]
    Required {
        /// The missing key, as `section.name`.
        key: &'static str,
        /// The setting that needs it.
        with: &'static str,
    },
    /// The NSQ consumer refused a setting.
    #[error("invalid `source.{field}`: {reason}")]
    Source {
        /// The consumer's name for the setting (as in the config file).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A duration written as `500ms`, `30s`, `5m`, `1h`, `1h30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        crate::sizing::parse_duration(&text)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// Which store keeps the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The in-process table.
    Memory,
    /// A table shared through Memcached.
    Memcached,
    /// No de-duplication (a baseline).
    None,
}

/// Where unique messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
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

/// Where undeliverable messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterKind {
    /// An NSQ topic.
    Nsq,
    /// A file of JSON lines.
    File,
}

/// `[source]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    pub nsqd_tcp_addresses: Option<Vec<String>>,
    pub lookupd_http_addresses: Option<Vec<String>>,
    pub topic: Option<String>,
    pub channel: Option<String>,
    pub max_in_flight: Option<u32>,
    pub msg_timeout: Option<Dur>,
    pub max_attempts: Option<u16>,
    pub backoff: Option<Dur>,
    pub max_backoff: Option<Dur>,
    pub heartbeat_interval: Option<Dur>,
    pub lookupd_poll_interval: Option<Dur>,
}

/// `[dedupe]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDedupe {
    pub key: Option<String>,
    pub digest: Option<String>,
    pub on_in_flight: Option<InFlightPolicy>,
    pub in_flight_requeue_delay: Option<Dur>,
    pub on_store_error: Option<StoreErrorPolicy>,
    pub store_error_requeue_delay: Option<Dur>,
}

/// `[store]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub kind: Option<StoreKind>,
    pub buckets: Option<u64>,
    pub ways: Option<u32>,
    pub probability: Option<f64>,
    pub rate: Option<f64>,
    pub window: Option<Dur>,
    pub memcached_addresses: Option<Vec<String>>,
    pub namespace: Option<String>,
    pub lease: Option<Dur>,
    pub timeout: Option<Dur>,
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

/// `[metrics]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub address: Option<String>,
    pub status_interval: Option<Dur>,
}

/// `[shutdown]`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShutdown {
    pub grace: Option<Dur>,
}

/// The configuration as written: every key optional, unknown keys rejected.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub source: RawSource,
    #[serde(default)]
    pub dedupe: RawDedupe,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub sink: RawSink,
    pub dead_letter: Option<RawDeadLetter>,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub shutdown: RawShutdown,
}

/// The validated store choice.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreSettings {
    /// In-process table of this shape.
    Memory(Geometry),
    /// Memcached table of this shape.
    Memcached(MemcachedConfig, Geometry),
    /// No de-duplication.
    None,
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

/// Everything `run` needs, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The consumer's configuration.
    pub source: ConsumerConfig,
    /// How bodies are keyed.
    pub keyer: Keyer,
    /// The pipeline's decisions.
    pub policy: Policy,
    /// The store.
    pub store: StoreSettings,
    /// The window the catch probability is reported for.
    pub window: Duration,
    /// The sink.
    pub sink: SinkSettings,
    /// The dead-letter, if any.
    pub dead_letter: Option<DeadLetterSettings>,
    /// Where metrics are served, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// How often the one-line status is logged.
    pub status_interval: Duration,
    /// How long in-flight handlers may finish at shutdown.
    pub grace: Duration,
}

impl RawConfig {
    /// Parses TOML text; `origin` names it in errors.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] naming the key, line and value.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: origin.to_owned(),
            message: error.to_string(),
        })
    }

    /// Reads and parses a file.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Checks every value and builds [`Settings`].
    ///
    /// # Errors
    ///
    /// The first problem found, naming its key.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let src = &self.source;
        let topic = src.topic.clone().ok_or(ConfigError::Missing {
            key: "source.topic",
            flag: "--topic",
        })?;
        let mut source = ConsumerConfig::new(
            topic,
            src.channel.clone().unwrap_or_else(|| "nsq-dedupe".into()),
        );
        source.nsqd_tcp_addresses = src.nsqd_tcp_addresses.clone().unwrap_or_default();
        source.lookupd_http_addresses = src.lookupd_http_addresses.clone().unwrap_or_default();
        if source.nsqd_tcp_addresses.is_empty() && source.lookupd_http_addresses.is_empty() {
            return Err(ConfigError::Missing {
                key: "source.nsqd_tcp_addresses",
                flag: "--nsqd-tcp-address or --lookupd-http-address",
            });
        }
        for addr in &source.nsqd_tcp_addresses {
            check_host_port("source.nsqd_tcp_addresses", addr)?;
        }
        source.max_in_flight = src.max_in_flight.unwrap_or(200);
        if source.max_in_flight == 0 {
            return Err(invalid("source.max_in_flight", "0", "must be at least 1"));
        }
        let msg_timeout = src.msg_timeout.map_or(Duration::from_secs(60), |d| d.0);
        if msg_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "source.msg_timeout",
                format!("{msg_timeout:?}"),
                "nsqd accepts at least 1s",
            ));
        }
        source.msg_timeout = Some(msg_timeout);
        // The pipeline decides what happens after many attempts (the dead-letter); the
        // consumer's own check would FIN such messages without handing them out.
        source.max_attempts = 0;
        if let Some(Dur(d)) = src.heartbeat_interval {
            source.heartbeat_interval = d;
        }
        if let Some(Dur(d)) = src.lookupd_poll_interval {
            source.lookupd_poll_interval = d;
        }
        let backoff = src.backoff.map_or(Duration::from_secs(1), |d| d.0);
        let max_backoff = src.max_backoff.map_or(Duration::from_secs(120), |d| d.0);
        if max_backoff < backoff {
            return Err(invalid(
                "source.max_backoff",
                format!("{max_backoff:?}"),
                format!("must be at least `source.backoff` ({backoff:?})"),
            ));
        }
        // go-nsq-style RDY backoff on handler failures: a failing sink slows consumption down
        // instead of cycling messages through requeues at full speed.
        source.backoff_multiplier = backoff;
        source.max_backoff = max_backoff;
        source.max_requeue_delay = source.max_requeue_delay.max(max_backoff);
        source.validate().map_err(|error| match error {
            crate::nsq::Error::Config { field, reason } => ConfigError::Source { field, reason },
            other => ConfigError::Source {
                field: "topic",
                reason: other.to_string(),
            },
        })?;

        let dd = &self.dedupe;
        let key: KeySpec =
            dd.key
                .as_deref()
                .unwrap_or("body")
                .parse()
                .map_err(|e: crate::error::SpecError| {
                    invalid("dedupe.key", quote(dd.key.as_deref()), e.to_string())
                })?;
        let digest: DigestAlgorithm = dd.digest.as_deref().unwrap_or("xxh3").parse().map_err(
            |e: crate::error::SpecError| {
                invalid("dedupe.digest", quote(dd.digest.as_deref()), e.to_string())
            },
        )?;
        let policy = Policy {
            on_in_flight: dd.on_in_flight.unwrap_or(InFlightPolicy::Requeue),
            in_flight_requeue_delay: dd
                .in_flight_requeue_delay
                .map_or(Duration::from_secs(1), |d| d.0),
            on_store_error: dd.on_store_error.unwrap_or(StoreErrorPolicy::Requeue),
            store_error_requeue_delay: dd
                .store_error_requeue_delay
                .map_or(Duration::from_secs(1), |d| d.0),
            backoff,
            max_backoff,
            max_attempts: src.max_attempts.unwrap_or(5),
            keepalive: (msg_timeout / 2).max(Duration::from_millis(100)),
        };
        if policy.max_attempts == 0 {
            return Err(invalid(
                "source.max_attempts",
                "0",
                "must be at least 1 (messages failing that often go to the dead-letter)",
            ));
        }

        let (store, window) = self.validate_store(msg_timeout)?;
        let sink = self.validate_sink()?;
        let dead_letter = self.validate_dead_letter()?;
        let metrics_address = match self.metrics.address.as_deref() {
            Some("off" | "") => None,
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "metrics.address",
                    quote(Some(text)),
                    "expected ip:port such as 127.0.0.1:9150, or \"off\"",
                )
            })?),
            None => Some(SocketAddr::from(([127, 0, 0, 1], 9150))),
        };
        Ok(Settings {
            source,
            keyer: Keyer::new(key, digest),
            policy,
            store,
            window,
            sink,
            dead_letter,
            metrics_address,
            status_interval: self
                .metrics
                .status_interval
                .map_or(Duration::from_secs(10), |d| d.0),
            grace: self.shutdown.grace.map_or(Duration::from_secs(10), |d| d.0),
        })
    }

    fn validate_store(
        &self,
        msg_timeout: Duration,
    ) -> Result<(StoreSettings, Duration), ConfigError> {
        let st = &self.store;
        let kind = st.kind.unwrap_or(StoreKind::Memory);
        let ways = st.ways.unwrap_or(8);
        if !Geometry::SUPPORTED_WAYS.contains(&ways) {
            return Err(invalid(
                "store.ways",
                ways.to_string(),
                "expected 1, 2, 4 or 8",
            ));
        }
        let window = st.window.map_or(DEFAULT_WINDOW, |d| d.0);
        if window.is_zero() {
            return Err(invalid("store.window", "\"0s\"", "must be more than 0"));
        }
        let geometry = match (st.buckets, st.probability) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "store.probability",
                    format!("{}", st.probability.unwrap_or_default()),
                    "give either `store.buckets` or `store.probability` with `store.rate` and `store.window`, not both",
                ))
            }
            (Some(buckets), None) => Geometry::new(buckets, ways)
                .map_err(|e| invalid("store.buckets", buckets.to_string(), e.to_string()))?,
            (None, Some(probability)) => {
                let rate = st.rate.ok_or(ConfigError::Required {
                    key: "store.rate",
                    with: "`store.probability`",
                })?;
                if !(rate > 0.0 && rate.is_finite()) {
                    return Err(invalid("store.rate", rate.to_string(), "must be more than 0 messages per second"));
                }
                if st.window.is_none() {
                    return Err(ConfigError::Required {
                        key: "store.window",
                        with: "`store.probability`",
                    });
                }
                let messages = rate * window.as_secs_f64();
                let geometry = crate::sizing::slots_for(probability, ways, messages)
                    .map_err(|e| invalid("store.probability", probability.to_string(), e.to_string()))?;
                tracing::info!(
                    probability,
                    rate,
                    window = %crate::sizing::format_duration(window),
                    buckets = geometry.slots(),
                    ways,
                    memory = %crate::sizing::format_bytes(geometry.memory_bytes()),
                    "Sized the table from probability, rate and window."
                );
                geometry
            }
            (None, None) => Geometry::new(DEFAULT_BUCKETS, ways).expect("the default size is valid"),
        };
        let store = match kind {
            StoreKind::Memory => StoreSettings::Memory(geometry),
            StoreKind::None => StoreSettings::None,
            StoreKind::Memcached => {
                let mut config = MemcachedConfig::default();
                if let Some(servers) = &st.memcached_addresses {
                    if servers.is_empty() {
                        return Err(invalid(
                            "store.memcached_addresses",
                            "[]",
                            "give at least one host:port",
                        ));
                    }
                    for s in servers {
                        check_host_port("store.memcached_addresses", s)?;
                    }
                    config.servers = servers.clone();
                }
                if let Some(ns) = &st.namespace {
                    if ns.is_empty() || ns.len() > 160 || !ns.bytes().all(|b| b.is_ascii_graphic())
                    {
                        return Err(invalid(
                            "store.namespace",
                            quote(Some(ns)),
                            "must be 1 to 160 printable ASCII characters without spaces",
                        ));
                    }
                    config.namespace = ns.clone();
                }
                config.lease = st
                    .lease
                    .map_or(msg_timeout + Duration::from_secs(5), |d| d.0);
                if config.lease < msg_timeout {
                    return Err(invalid(
                        "store.lease",
                        format!("{:?}", config.lease),
                        format!("must be at least `source.msg_timeout` ({msg_timeout:?}), or another delivery may take over a claim whose handler is still running"),
                    ));
                }
                if let Some(Dur(t)) = st.timeout {
                    if t.is_zero() {
                        return Err(invalid("store.timeout", "\"0s\"", "must be more than 0"));
                    }
                    config.timeout = t;
                }
                // Reuse the store's own checks, which name the key.
                crate::MemcachedStore::new_lazy(config.clone(), geometry)
                    .map_err(|e| invalid("store", String::new(), e.to_string()))?;
                StoreSettings::Memcached(config, geometry)
            }
        };
        Ok((store, window))
    }

    fn validate_sink(&self) -> Result<SinkSettings, ConfigError> {
        let sk = &self.sink;
        Ok(match sk.kind.unwrap_or(SinkKind::Stdout) {
            SinkKind::Stdout => SinkSettings::Stdout,
            SinkKind::Null => SinkSettings::Null,
            SinkKind::Nsq => {
                let addrs = sk
                    .destination_nsqd_tcp_addresses
                    .clone()
                    .unwrap_or_default();
                if addrs.is_empty() {
                    return Err(ConfigError::Missing {
                        key: "sink.destination_nsqd_tcp_addresses",
                        flag: "--destination-nsqd-tcp-address",
                    });
                }
                for a in &addrs {
                    check_host_port("sink.destination_nsqd_tcp_addresses", a)?;
                }
                let topic = sk.destination_topic.clone().ok_or(ConfigError::Missing {
                    key: "sink.destination_topic",
                    flag: "--destination-topic",
                })?;
                check_topic("sink.destination_topic", &topic)?;
                SinkSettings::Nsq {
                    nsqd_tcp_addresses: addrs,
                    topic,
                }
            }
            SinkKind::Http => {
                let post = sk.post.as_deref().ok_or(ConfigError::Missing {
                    key: "sink.post",
                    flag: "--post",
                })?;
                let url: HttpUrl = post
                    .parse()
                    .map_err(|reason: String| invalid("sink.post", quote(Some(post)), reason))?;
                let headers = sk.headers.clone().unwrap_or_default();
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
                    timeout: sk.timeout.map_or(Duration::from_secs(10), |d| d.0),
                }
            }
        })
    }

    fn validate_dead_letter(&self) -> Result<Option<DeadLetterSettings>, ConfigError> {
        let Some(dl) = &self.dead_letter else {
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
                check_topic("dead_letter.topic", &topic)?;
                let addrs = dl
                    .nsqd_tcp_addresses
                    .clone()
                    .or_else(|| self.source.nsqd_tcp_addresses.clone())
                    .unwrap_or_default();
                if addrs.is_empty() {
                    return Err(ConfigError::Required {
                        key: "dead_letter.nsqd_tcp_addresses",
                        with:
                            "`dead_letter.kind = \"nsq\"` when `source.nsqd_tcp_addresses` is empty",
                    });
                }
                DeadLetterSettings::Nsq {
                    nsqd_tcp_addresses: addrs,
                    topic,
                }
            }
        }))
    }
}

impl Settings {
    /// Parses and validates TOML text (with no flags): convenient for tests and embedding.
    ///
    /// # Errors
    ///
    /// As [`RawConfig::from_toml`] and [`RawConfig::validate`].
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        RawConfig::from_toml(text, "<string>")?.validate()
    }
}

fn invalid(key: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.into(),
        reason: reason.into(),
    }
}

fn quote(text: Option<&str>) -> String {
    format!("{:?}", text.unwrap_or(""))
}

fn check_host_port(key: &'static str, addr: &str) -> Result<(), ConfigError> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(())
        }
        _ => Err(invalid(
            key,
            quote(Some(addr)),
            "expected host:port such as 127.0.0.1:4150",
        )),
    }
}

fn check_topic(key: &'static str, topic: &str) -> Result<(), ConfigError> {
    let name = topic.strip_suffix("#ephemeral").unwrap_or(topic);
    if (1..=64).contains(&topic.len())
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        Ok(())
    } else {
        Err(invalid(
            key,
            quote(Some(topic)),
            "NSQ topic names are 1 to 64 of letters, digits, '.', '_' and '-'",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Settings::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn minimal_config_gets_the_defaults() {
        let s = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n",
        )
        .unwrap();
        assert_eq!(s.source.channel, "nsq-dedupe");
        assert_eq!(s.source.max_in_flight, 200);
        assert_eq!(s.source.max_attempts, 0);
        assert_eq!(s.policy.max_attempts, 5);
        assert_eq!(
            s.store,
            StoreSettings::Memory(Geometry::new(DEFAULT_BUCKETS, 8).unwrap())
        );
        assert_eq!(s.sink, SinkSettings::Stdout);
        assert_eq!(s.metrics_address, Some("127.0.0.1:9150".parse().unwrap()));
    }

    #[test]
    fn errors_name_the_key_and_value() {
        assert!(err("[store]\nbukets = 5\n").contains("unknown field `bukets`"));
        assert_eq!(
            err("[source]\nnsqd_tcp_addresses = [\"a:1\"]\n"),
            "`source.topic` is required: set it in the config file or pass `--topic`"
        );
        let e = err(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\nmsg_timeout = \"soon\"\n",
        );
        assert!(e.contains("msg_timeout") && e.contains("soon"), "{e}");
        let e = err("[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nways = 3\n");
        assert_eq!(e, "invalid `store.ways` = 3: expected 1, 2, 4 or 8");
    }

    #[test]
    fn probability_sizing_picks_the_buckets() {
        let s = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nprobability = 0.9\nrate = 1000\nwindow = \"1h\"\nways = 8\n",
        )
        .unwrap();
        let StoreSettings::Memory(g) = s.store else {
            panic!()
        };
        assert_eq!(g.slots(), 6_185_416);
    }
}
