//! `[sink]`: where unique messages go, validated into [`SinkSettings`]; the serve sink's
//! settings are validated in `serve`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::setting::{names, section, DefaultValue, FlagValue, Only};
use super::{check_host_port, check_name, invalid, output_name, quote, ConfigError, Dur};
use crate::http::{check_url, HttpClientConfig};
use crate::redact;
use crate::sink::serve as serve_defaults;
use crate::sink::{
    with_content_type, BatchFormat, HttpMode, HttpSinkConfig, DEFAULT_BATCH_TIMEOUT,
    DEFAULT_CONCURRENCY, DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER,
};
use hyper::header::{HeaderName, HeaderValue};

mod serve;

/// One URL or several: `post = "http://a/"` or `post = ["http://a/", "http://b/"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The values, in order.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one.clone()],
            OneOrMany::Many(many) => many.clone(),
        }
    }
}

impl From<Vec<String>> for OneOrMany {
    fn from(many: Vec<String>) -> Self {
        OneOrMany::Many(many)
    }
}

impl From<String> for OneOrMany {
    fn from(one: String) -> Self {
        OneOrMany::One(one)
    }
}

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
    /// Archive to files, as `nsq_to_file`.
    File,
    /// Discard (benchmarks).
    Null,
    /// Serve NSQ consumers as nsqd does: a consumer's FIN delivers.
    Serve,
}

impl SinkKind {
    /// Every kind with its name in the config file and on the command line.
    pub const NAMES: [(&'static str, SinkKind); 6] = [
        ("stdout", SinkKind::Stdout),
        ("nsq", SinkKind::Nsq),
        ("http", SinkKind::Http),
        ("file", SinkKind::File),
        ("null", SinkKind::Null),
        ("serve", SinkKind::Serve),
    ];

    /// The kind's name in the config file and on the command line.
    pub fn name(self) -> &'static str {
        super::setting::name_of(&Self::NAMES, self)
    }
}

/// The settings of the http sink only.
const HTTP: Only = Only::one("sink.kind", &["http"]);

/// The settings of the nsq sink only.
const NSQ: Only = Only::one("sink.kind", &["nsq"]);

/// The settings of the file sink only.
const FILE: Only = Only::one("sink.kind", &["file"]);

/// The settings of the serve sink only.
const SERVE: Only = Only::one("sink.kind", &["serve"]);

const SINK_KINDS: [&str; 6] = names(&SinkKind::NAMES);
const HTTP_MODES: [&str; 2] = names(&HttpMode::NAMES);
const BATCH_FORMATS: [&str; 2] = names(&BatchFormat::NAMES);

/// The file sink's flags are listed under their own heading.
const FILE_HEADING: &str = "File sink (as nsq_to_file)";

/// The serve sink's flags are listed under their own heading.
const SERVE_HEADING: &str = "Serve sink (as nsqd, for NSQ consumers)";

section! {
    /// `[sink]`. The http sink's flags are `nsq_to_http`'s, the file sink's `nsq_to_file`'s.
    pub struct RawSink in "sink", heading "Sink" {
        /// Where unique messages go.
        kind: SinkKind, flag("sink", value_name: "SINK", value: FlagValue::Names(&SINK_KINDS));
        /// nsqd TCP address to publish to (repeatable, or comma-separated; nsq sink).
        destination_nsqd_tcp_addresses: Vec<String>, only(&NSQ),
            flag("destination-nsqd-tcp-address", value_name: "ADDR", value: FlagValue::List { delimiter: Some(',') });
        /// Topic to publish to (nsq sink).
        destination_topic: String, only(&NSQ), flag("destination-topic", value_name: "TOPIC");
        /// URL to POST each message to, http:// or https:// (repeatable; http sink).
        post: OneOrMany, only(&HTTP),
            flag("post", value_name: "URL", value: FlagValue::List { delimiter: None });
        /// With several --post: each message to one URL in turn, or to every URL.
        mode: HttpMode, only(&HTTP),
            flag("mode", value_name: "MODE", value: FlagValue::Names(&HTTP_MODES));
        /// A header of every POST, as "Name: value" (repeatable).
        headers: BTreeMap<String, String>, only(&HTTP),
            flag("header", value_name: "HEADER", value: FlagValue::Header);
        /// Content-Type of every POST (default {default}).
        content_type: String, default(DefaultValue::Text(DEFAULT_CONTENT_TYPE)), only(&HTTP), flag("content-type", value_name: "TYPE");
        /// Bound on connecting to an http sink URL (default {default}).
        http_client_connect_timeout: Dur, default(DefaultValue::Duration(Duration::from_secs(2))), only(&HTTP),
            flag("http-client-connect-timeout", value_name: "DURATION", value: FlagValue::Duration);
        /// Bound on one POST, answer included (default {default}).
        http_client_request_timeout: Dur, default(DefaultValue::Duration(Duration::from_secs(10))), only(&HTTP),
            flag("http-client-request-timeout", value_name: "DURATION", value: FlagValue::Duration);
        /// PEM file of CA certificates trusted for https:// besides the system's.
        http_client_tls_root_ca_file: PathBuf, only(&HTTP),
            flag("http-client-tls-root-ca-file", value_name: "FILE", value: FlagValue::Path);
        /// Most requests in flight, and connections open, per http sink endpoint; more records
        /// wait (default {default}). Fewer while connects to the endpoint stall.
        http_concurrency: usize, default(DefaultValue::Number(DEFAULT_CONCURRENCY as u64)), only(&HTTP),
            flag("http-concurrency", alias: Some("n"), value_name: "N", value: FlagValue::Count);
        /// Header carrying each request's idempotency key (the body's digest), or "off" (default
        /// {default}).
        http_idempotency_header: String, default(DefaultValue::Text(DEFAULT_IDEMPOTENCY_HEADER)), only(&HTTP),
            flag("http-idempotency-header", value_name: "NAME|off");
        /// Records per POST (default {default}: each body as it is).
        http_batch_size: usize, default(DefaultValue::Number(1)), only(&HTTP),
            flag("http-batch-size", value_name: "N", value: FlagValue::Count);
        /// How long a batch that is not full waits for more records (default {default}): a burst's
        /// full batches go at once, the rest joins the records that follow.
        http_batch_timeout: Dur, default(DefaultValue::Duration(DEFAULT_BATCH_TIMEOUT)), only(&HTTP),
            flag("http-batch-timeout", value_name: "DURATION", value: FlagValue::Duration);
        /// How a batch's records make one body: each followed by a newline (nsqd's /mpub,
        /// NDJSON), or a JSON array (default {default}).
        http_batch_format: BatchFormat, default(DefaultValue::Text("lines")), only(&HTTP),
            flag("http-batch-format", value_name: "FORMAT", value: FlagValue::Names(&BATCH_FORMATS));
        /// Directory closed files go to.
        output_dir: PathBuf, only(&FILE),
            flag("output-dir", heading: FILE_HEADING, value_name: "DIR", value: FlagValue::Path);
        /// Directory files are written in until closed (default: the output dir).
        work_dir: PathBuf, only(&FILE),
            flag("work-dir", heading: FILE_HEADING, value_name: "DIR", value: FlagValue::Path);
        /// File name with `<TOPIC>`, `<HOST>`, `<REV>`, `<DATETIME>`, `<PID>` (default
        /// {default}).
        filename_format: String, default(DefaultValue::Text(crate::sink::DEFAULT_FILENAME_FORMAT)), only(&FILE),
            flag("filename-format", heading: FILE_HEADING, value_name: "FORMAT");
        /// `<DATETIME>` as strftime, UTC (default {default}: a file per hour).
        datetime_format: String, default(DefaultValue::Text(crate::sink::DEFAULT_DATETIME_FORMAT)), only(&FILE),
            flag("datetime-format", heading: FILE_HEADING, value_name: "FORMAT");
        /// Close a file after this long.
        rotate_interval: Dur, only(&FILE),
            flag("rotate-interval", heading: FILE_HEADING, value_name: "DURATION", value: FlagValue::Duration);
        /// Close a file at this size, such as 100MiB.
        rotate_size: String, only(&FILE),
            flag("rotate-size", heading: FILE_HEADING, value_name: "SIZE");
        /// Gzip the files (a member per sync).
        gzip: bool, only(&FILE), flag("gzip", heading: FILE_HEADING, value: FlagValue::Switch);
        /// Gzip level 1-9 (default {default}; implies --gzip).
        gzip_level: u32, default(DefaultValue::Number(crate::sink::DEFAULT_GZIP_LEVEL as u64)), only(&FILE),
            flag("gzip-level", heading: FILE_HEADING, value_name: "N", value: FlagValue::Small);
        /// Gather records this long before each write and fsync (default {default}: as soon as the disk is
        /// free); longer means fewer fsyncs and later FINs.
        sync_interval: Dur, default(DefaultValue::Duration(Duration::ZERO)), only(&FILE),
            flag("sync-interval", heading: FILE_HEADING, value_name: "DURATION", value: FlagValue::Duration);
        /// `<HOST>` in file names (default: the short host name).
        host_identifier: String, only(&FILE),
            flag("host-identifier", heading: FILE_HEADING, value_name: "NAME");
        /// Remove files that got no record instead of keeping them.
        skip_empty_files: bool, only(&FILE),
            flag("skip-empty-files", heading: FILE_HEADING, value: FlagValue::Switch);
        /// Where NSQ consumers connect, as to nsqd (default {default}).
        serve_tcp_address: String, default(DefaultValue::Text(serve_defaults::DEFAULT_TCP_ADDRESS)), only(&SERVE),
            flag("serve-tcp-address", heading: SERVE_HEADING, value_name: "ADDR");
        /// Where /ping, /lookup (as nsqlookupd) and /stats (as nsqd) answer, or off (default
        /// {default}).
        serve_http_address: String, default(DefaultValue::Text(serve_defaults::DEFAULT_HTTP_ADDRESS)), only(&SERVE),
            flag("serve-http-address", heading: SERVE_HEADING, value_name: "ADDR|off");
        /// A served message not answered within this goes back upstream; a consumer may ask
        /// for another in IDENTIFY (default {default}).
        serve_msg_timeout: Dur, default(DefaultValue::Duration(serve_defaults::DEFAULT_MSG_TIMEOUT)), only(&SERVE),
            flag("serve-msg-timeout", heading: SERVE_HEADING, value_name: "DURATION", value: FlagValue::Duration);
        /// The longest message timeout a consumer may ask for, and the longest a TOUCHed
        /// message stays out (default {default}).
        serve_max_msg_timeout: Dur, default(DefaultValue::Duration(serve_defaults::DEFAULT_MAX_MSG_TIMEOUT)), only(&SERVE),
            flag("serve-max-msg-timeout", heading: SERVE_HEADING, value_name: "DURATION", value: FlagValue::Duration);
        /// Heartbeats to a consumer that asks for none in IDENTIFY; one that misses two is
        /// closed (default {default}).
        serve_heartbeat_interval: Dur, default(DefaultValue::Duration(serve_defaults::DEFAULT_HEARTBEAT_INTERVAL)), only(&SERVE),
            flag("serve-heartbeat-interval", heading: SERVE_HEADING, value_name: "DURATION", value: FlagValue::Duration);
        /// The largest RDY a consumer may send (default {default}).
        serve_max_rdy_count: u32, default(DefaultValue::Number(serve_defaults::DEFAULT_MAX_RDY_COUNT as u64)), only(&SERVE),
            flag("serve-max-rdy-count", heading: SERVE_HEADING, value_name: "N", value: FlagValue::InFlight);
        /// Consumers connected at once; more are closed at once (default {default}).
        serve_max_connections: usize, default(DefaultValue::Number(serve_defaults::DEFAULT_MAX_CONNECTIONS as u64)), only(&SERVE),
            flag("serve-max-connections", heading: SERVE_HEADING, value_name: "N", value: FlagValue::Count);
        /// PEM certificate chain: TLS offered to consumers (IDENTIFY tls_v1); needs --serve-tls-key.
        serve_tls_cert: PathBuf, only(&SERVE),
            flag("serve-tls-cert", heading: SERVE_HEADING, value_name: "FILE", value: FlagValue::Path);
        /// PEM private key of --serve-tls-cert.
        serve_tls_key: PathBuf, only(&SERVE),
            flag("serve-tls-key", heading: SERVE_HEADING, value_name: "FILE", value: FlagValue::Path);
        /// Refuse every command but IDENTIFY before the TLS upgrade.
        serve_tls_required: bool, only(&SERVE),
            flag("serve-tls-required", heading: SERVE_HEADING, value: FlagValue::Switch);
        /// File holding the secret consumers must send with AUTH before SUB.
        serve_auth_secret_file: PathBuf, only(&SERVE),
            flag("serve-auth-secret-file", heading: SERVE_HEADING, value_name: "FILE", value: FlagValue::Path);
    }
}

/// The validated sink. `Debug` and `Display` never show a secret: URLs lose their user info
/// and query values, headers their values (`crate::redact`).
#[derive(Clone, PartialEq)]
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
    /// POST to one or more URLs.
    Http(HttpSinkConfig),
    /// Archive to files.
    File(crate::sink::FileSinkConfig),
    /// Discard.
    Null,
    /// Serve NSQ consumers as nsqd does.
    Serve(crate::sink::serve::ServeConfig),
}

impl fmt::Debug for SinkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSettings::Stdout => f.write_str("Stdout"),
            SinkSettings::Null => f.write_str("Null"),
            SinkSettings::Nsq {
                nsqd_tcp_addresses,
                topic,
            } => f
                .debug_struct("Nsq")
                .field("nsqd_tcp_addresses", nsqd_tcp_addresses)
                .field("topic", topic)
                .finish(),
            SinkSettings::Http(config) => f.debug_tuple("Http").field(config).finish(),
            SinkSettings::File(config) => f.debug_tuple("File").field(config).finish(),
            SinkSettings::Serve(config) => f.debug_tuple("Serve").field(config).finish(),
        }
    }
}

/// One line a person reads, e.g. `http POST https://host/path (2 URLs, round-robin)`,
/// `nsq PUB events.unique to 10.0.0.1:4150` or
/// `file dir=/var/archive format=<TOPIC>.<HOST><REV>.<DATETIME>.log`; never a secret.
impl fmt::Display for SinkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSettings::Stdout => f.write_str("stdout"),
            SinkSettings::Null => f.write_str("null (records are discarded)"),
            SinkSettings::Nsq {
                nsqd_tcp_addresses,
                topic,
            } => write!(f, "nsq PUB {topic} to {}", nsqd_tcp_addresses.join(",")),
            SinkSettings::Http(HttpSinkConfig {
                urls,
                mode,
                headers,
                ..
            }) => {
                let first = urls.first().map(|url| redact::url(&url.to_string()));
                write!(f, "http POST {}", first.unwrap_or_default())?;
                let mode = HttpMode::NAMES
                    .iter()
                    .find(|(_, m)| m == mode)
                    .map_or("", |(name, _)| name);
                let mut notes = Vec::new();
                if urls.len() > 1 {
                    notes.push(format!("{} URLs, {mode}", urls.len()));
                }
                let names: Vec<&str> = headers.iter().map(|(name, _)| name.as_str()).collect();
                if !names.is_empty() {
                    notes.push(format!("headers {}", names.join(", ")));
                }
                if !notes.is_empty() {
                    write!(f, " ({})", notes.join("; "))?;
                }
                Ok(())
            }
            SinkSettings::Serve(config) => serve::summary(config, f),
            SinkSettings::File(config) => {
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
        }
    }
}

impl RawSink {
    /// The file sink's settings: `nsq_to_file`'s, for the consumed `topic`.
    fn file(&self, topic: &str) -> Result<SinkSettings, ConfigError> {
        let output_dir = self.output_dir.clone().ok_or(ConfigError::Missing {
            key: "sink.output_dir",
            flags: &["--output-dir"],
        })?;
        let mut config = crate::sink::FileSinkConfig::new(output_dir, topic.to_owned());
        config.work_dir = self.work_dir.clone();
        if let Some(format) = &self.filename_format {
            config.filename_format = format.clone();
        }
        if let Some(format) = &self.datetime_format {
            config.datetime_format = format.clone();
        }
        config.rotate_interval = match self.rotate_interval {
            Some(Dur(d)) if d.is_zero() => None,
            Some(Dur(d)) => Some(d),
            None => None,
        };
        if let Some(text) = &self.rotate_size {
            let bytes = crate::units::parse_bytes(text)
                .map_err(|reason| invalid("sink.rotate_size", quote(Some(text)), reason))?;
            config.rotate_size = (bytes > 0).then_some(bytes);
        }
        if self.gzip == Some(true) || self.gzip_level.is_some() {
            config.gzip_level = Some(self.gzip_level.unwrap_or(crate::sink::DEFAULT_GZIP_LEVEL));
        }
        if let Some(Dur(d)) = self.sync_interval {
            config.sync_interval = d;
        }
        if let Some(host) = &self.host_identifier {
            config.host_identifier = host.clone();
        }
        config.skip_empty_files = self.skip_empty_files.unwrap_or(false);
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
        Ok(SinkSettings::File(config))
    }

    /// The sink's settings; `topic` and `channel` are the consumed ones.
    pub(super) fn validate(&self, topic: &str, channel: &str) -> Result<SinkSettings, ConfigError> {
        match self.kind.unwrap_or(SinkKind::Stdout) {
            SinkKind::Stdout => Ok(SinkSettings::Stdout),
            SinkKind::Serve => Ok(SinkSettings::Serve(serve::validate(self, topic, channel)?)),
            SinkKind::Null => Ok(SinkSettings::Null),
            SinkKind::File => self.file(topic),
            SinkKind::Nsq => self.nsq(),
            SinkKind::Http => self.http(),
        }
    }

    /// The nsq sink: its nsqd addresses and topic, both named at once when both are missing.
    fn nsq(&self) -> Result<SinkSettings, ConfigError> {
        let addrs = self
            .destination_nsqd_tcp_addresses
            .clone()
            .unwrap_or_default();
        let (Some(topic), false) = (self.destination_topic.clone(), addrs.is_empty()) else {
            let mut missing = Vec::new();
            if addrs.is_empty() {
                missing.push(ConfigError::Missing {
                    key: "sink.destination_nsqd_tcp_addresses",
                    flags: &["--destination-nsqd-tcp-address"],
                });
            }
            if self.destination_topic.is_none() {
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

    /// The http sink: its URLs, headers, client, concurrency and batches.
    fn http(&self) -> Result<SinkSettings, ConfigError> {
        let posts = self
            .post
            .as_ref()
            .map(OneOrMany::to_vec)
            .unwrap_or_default();
        if posts.is_empty() {
            return Err(ConfigError::Missing {
                key: "sink.post",
                flags: &["--post"],
            });
        }
        let urls = posts
            .iter()
            .map(|post| {
                check_url(post)
                    .map_err(|reason| invalid("sink.post", quote(Some(&redact::url(post))), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let headers = self.http_headers()?;
        let defaults = HttpClientConfig::default();
        if let Some(path) = &self.http_client_tls_root_ca_file {
            std::fs::File::open(path).map_err(|error| {
                invalid(
                    "sink.http_client_tls_root_ca_file",
                    quote(path.to_str()),
                    format!("cannot be read: {error}"),
                )
            })?;
        }
        let mut config = HttpSinkConfig::new(urls);
        config.idempotency_header = self.idempotency_header_name()?;
        config.concurrency = positive_count(
            "sink.http_concurrency",
            self.http_concurrency,
            config.concurrency,
        )?;
        config.batch_size = positive_count(
            "sink.http_batch_size",
            self.http_batch_size,
            config.batch_size,
        )?;
        config.batch_timeout = positive(
            "sink.http_batch_timeout",
            self.http_batch_timeout,
            config.batch_timeout,
        )?;
        config.batch_format = self.http_batch_format.unwrap_or_default();
        config.mode = self.mode.unwrap_or_default();
        config.headers = headers;
        config.client = HttpClientConfig {
            connect_timeout: positive(
                "sink.http_client_connect_timeout",
                self.http_client_connect_timeout,
                defaults.connect_timeout,
            )?,
            request_timeout: positive(
                "sink.http_client_request_timeout",
                self.http_client_request_timeout,
                defaults.request_timeout,
            )?,
            root_ca_file: self.http_client_tls_root_ca_file.clone(),
            ..defaults
        };
        Ok(SinkSettings::Http(config))
    }

    /// The http sink's headers, with its `Content-Type` first unless they set one. A header's
    /// value is never shown: it may hold a credential.
    fn http_headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
        let mut headers = Vec::new();
        for (name, value) in self.headers.clone().unwrap_or_default() {
            let parsed = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            );
            let (Ok(name), Ok(value)) = parsed else {
                return Err(invalid(
                    "sink.headers",
                    format!("{name:?} = {:?}", redact::REDACTED),
                    "header names are letters, digits, '-' and '_'; values have no line breaks",
                ));
            };
            headers.push((name, value));
        }
        let content_type = self.content_type.as_deref().unwrap_or(DEFAULT_CONTENT_TYPE);
        with_content_type(content_type, headers)
            .map_err(|reason| invalid("sink.content_type", quote(Some(content_type)), reason))
    }

    /// The header each request carries its idempotency key in, or none (`"off"`).
    fn idempotency_header_name(&self) -> Result<Option<HeaderName>, ConfigError> {
        match self.http_idempotency_header.as_deref() {
            Some("off") => Ok(None),
            name => {
                let name = name.unwrap_or(DEFAULT_IDEMPOTENCY_HEADER);
                HeaderName::from_bytes(name.as_bytes())
                    .map(Some)
                    .map_err(|_| {
                        invalid(
                            "sink.http_idempotency_header",
                            quote(Some(name)),
                            "expected a header name (letters, digits, '-' and '_') or \"off\"",
                        )
                    })
            }
        }
    }
}

/// A duration that must be more than 0, else `default`.
fn positive(
    key: &'static str,
    value: Option<Dur>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        Some(Dur(d)) if d.is_zero() => Err(invalid(key, "\"0s\"", "must be more than 0")),
        Some(Dur(d)) => Ok(d),
        None => Ok(default),
    }
}

/// A count that must be at least 1, else `default`.
fn positive_count(
    key: &'static str,
    value: Option<usize>,
    default: usize,
) -> Result<usize, ConfigError> {
    match value {
        Some(0) => Err(invalid(key, "0", "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::setting::Section;

    #[test]
    fn every_http_client_and_batch_setting_is_refused_without_the_http_sink() {
        let http: Vec<_> = <RawSink as Section>::SETTINGS
            .iter()
            .filter(|setting| setting.name.starts_with("http_"))
            .collect();
        assert_eq!(http.len(), 8, "the http_ settings changed: check this test");
        for setting in http {
            assert_eq!(
                setting.only.map(|only| (only.kind, only.kinds)),
                Some(("sink.kind", &["http"][..])),
                "{}",
                setting.key
            );
        }
    }

    #[test]
    fn sinks_print_as_summaries_without_secrets() {
        let raw = RawSink {
            kind: Some(SinkKind::Http),
            post: Some(OneOrMany::Many(vec![
                "https://user:hunter2@example.com/in?key=hunter2".into(),
                "http://10.0.0.2/in".into(),
            ])),
            mode: Some(HttpMode::Multicast),
            headers: Some(BTreeMap::from([(
                "Authorization".to_owned(),
                "Bearer hunter2".to_owned(),
            )])),
            ..RawSink::default()
        };
        let sink = raw.validate("events", "app").unwrap();
        assert_eq!(
            sink.to_string(),
            "http POST https://<redacted>@example.com/in?key=<redacted> (2 URLs, multicast; \
             headers content-type, authorization)"
        );
        let debug = format!("{sink:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(
            debug.contains(r#""authorization": "<redacted>""#),
            "{debug}"
        );
        let nsq = SinkSettings::Nsq {
            nsqd_tcp_addresses: vec!["10.0.0.1:4150".into(), "10.0.0.2:4150".into()],
            topic: "events.unique".into(),
        };
        assert_eq!(
            nsq.to_string(),
            "nsq PUB events.unique to 10.0.0.1:4150,10.0.0.2:4150"
        );
    }
}
