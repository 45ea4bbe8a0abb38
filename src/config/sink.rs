//! `[sink]`: where unique messages go, validated into [`SinkSettings`]. The section's keys are
//! listed here, one table for every sink; each sink's keys are validated into its own
//! settings in a module of its name (`file`, `http`, `nsq`, `serve`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, Dur};
use crate::setting::{names, section, DefaultValue, FlagValue, Only};
use crate::sink::serve as serve_defaults;
use crate::sink::{
    BatchFormat, HttpMode, HttpSinkConfig, DEFAULT_BATCH_TIMEOUT, DEFAULT_CONCURRENCY,
    DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER,
};

mod file;
mod http;
mod nsq;
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

impl crate::setting::Overlay for OneOrMany {}

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

impl crate::setting::Overlay for SinkKind {}
impl crate::setting::Overlay for HttpMode {}
impl crate::setting::Overlay for BatchFormat {}

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
        crate::setting::name_of(&Self::NAMES, self)
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
        http_client_connect_timeout: Dur, default(DefaultValue::Duration(crate::http::DEFAULT_CONNECT_TIMEOUT)), only(&HTTP),
            flag("http-client-connect-timeout", value_name: "DURATION", value: FlagValue::Duration);
        /// Bound on one POST, answer included (default {default}).
        http_client_request_timeout: Dur, default(DefaultValue::Duration(crate::http::DEFAULT_REQUEST_TIMEOUT)), only(&HTTP),
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
        http_batch_size: usize, default(DefaultValue::Number(crate::sink::DEFAULT_BATCH_SIZE as u64)), only(&HTTP),
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
        sync_interval: Dur, default(DefaultValue::Duration(crate::sink::DEFAULT_SYNC_INTERVAL)), only(&FILE),
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
/// and query values, headers their values (`crate::redact`), in each sink's settings.
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
    /// POST to one or more URLs.
    Http(HttpSinkConfig),
    /// Archive to files.
    File(crate::sink::FileSinkConfig),
    /// Discard.
    Null,
    /// Serve NSQ consumers as nsqd does.
    Serve(crate::sink::serve::ServeConfig),
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
            SinkSettings::Http(config) => http::summary(config, f),
            SinkSettings::Serve(config) => serve::summary(config, f),
            SinkSettings::File(config) => file::summary(config, f),
        }
    }
}

impl RawSink {
    /// The sink's settings; `topic` and `channel` are the consumed ones.
    pub(super) fn validate(&self, topic: &str, channel: &str) -> Result<SinkSettings, ConfigError> {
        match self.kind.unwrap_or(SinkKind::Stdout) {
            SinkKind::Stdout => Ok(SinkSettings::Stdout),
            SinkKind::Serve => Ok(SinkSettings::Serve(serve::validate(self, topic, channel)?)),
            SinkKind::Null => Ok(SinkSettings::Null),
            SinkKind::File => Ok(SinkSettings::File(file::validate(self, topic)?)),
            SinkKind::Nsq => nsq::validate(self),
            SinkKind::Http => Ok(SinkSettings::Http(http::validate(self)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setting::Section;

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
