//! The http sink's keys of `[sink]` (`sink.kind = "http"`, `nsq_to_http`'s) validated into
//! its [`HttpSinkConfig`], its start-up summary and its build. A setting not given keeps the
//! http sink's own default ([`HttpSinkConfig::new`], [`HttpClientConfig::default`]).

use std::fmt;
use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::{with_content_type, BatchFormat, HttpMode, HttpSink, HttpSinkConfig};
use super::{DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER};
use crate::http::{check_url, HttpClientConfig};
use crate::redact;
use crate::setting::{invalid, names, quote, ConfigError, Dur};
use crate::sink::room::{Build, Room};
use crate::sink::{BuildError, RawSink};

/// The names of `sink.mode`, as `--mode` lists them.
pub(crate) const HTTP_MODES: [&str; 2] = names(&HttpMode::NAMES);

/// The names of `sink.http_batch_format`, as `--http-batch-format` lists them.
pub(crate) const BATCH_FORMATS: [&str; 2] = names(&BatchFormat::NAMES);

/// The http sink's keys: the rows of `[sink]`'s table, for `sinks!`.
macro_rules! sink_keys {
    ($kind:literal [$($rest:tt)*] [$($rows:tt)*]) => {
        $crate::sink::room::sink_section! { [$($rest)*] [$($rows)*
            /// URL to POST each message to, http:// or https:// (repeatable; http sink).
            post: $crate::sink::OneOrMany, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("post", value_name: "URL", value: $crate::setting::FlagValue::List { delimiter: None });
            /// With several --post: each message to one URL in turn, or to every URL.
            mode: $crate::sink::HttpMode, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("mode", value_name: "MODE",
                     value: $crate::setting::FlagValue::Names(&$crate::sink::http::settings::HTTP_MODES));
            /// A header of every POST, as "Name: value" (repeatable).
            headers: std::collections::BTreeMap<String, String>,
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("header", value_name: "HEADER", value: $crate::setting::FlagValue::Header);
            /// Content-Type of every POST (default {default}).
            content_type: String,
                default($crate::setting::DefaultValue::Text($crate::sink::DEFAULT_CONTENT_TYPE)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("content-type", value_name: "TYPE");
            /// Bound on connecting to an http sink URL (default {default}).
            http_client_connect_timeout: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::http::DEFAULT_CONNECT_TIMEOUT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-client-connect-timeout", value_name: "DURATION",
                     value: $crate::setting::FlagValue::Duration);
            /// Bound on one POST, answer included (default {default}).
            http_client_request_timeout: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::http::DEFAULT_REQUEST_TIMEOUT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-client-request-timeout", value_name: "DURATION",
                     value: $crate::setting::FlagValue::Duration);
            /// PEM file of CA certificates trusted for https:// besides the system's.
            http_client_tls_root_ca_file: std::path::PathBuf,
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-client-tls-root-ca-file", value_name: "FILE",
                     value: $crate::setting::FlagValue::Path);
            /// Most requests in flight, and connections open, per http sink endpoint; more records
            /// wait (default {default}). Fewer while connects to the endpoint stall.
            http_concurrency: usize,
                default($crate::setting::DefaultValue::Number($crate::sink::DEFAULT_CONCURRENCY as u64)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-concurrency", alias: Some("n"), value_name: "N",
                     value: $crate::setting::FlagValue::Count);
            /// Header carrying each request's idempotency key (the body's digest), or "off" (default
            /// {default}).
            http_idempotency_header: String,
                default($crate::setting::DefaultValue::Text($crate::sink::DEFAULT_IDEMPOTENCY_HEADER)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-idempotency-header", value_name: "NAME|off");
            /// Records per POST (default {default}: each body as it is).
            http_batch_size: usize,
                default($crate::setting::DefaultValue::Number($crate::sink::http::DEFAULT_BATCH_SIZE as u64)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-batch-size", value_name: "N", value: $crate::setting::FlagValue::Count);
            /// How long a batch that is not full waits for more records (default {default}): a burst's
            /// full batches go at once, the rest joins the records that follow.
            http_batch_timeout: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::sink::DEFAULT_BATCH_TIMEOUT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-batch-timeout", value_name: "DURATION",
                     value: $crate::setting::FlagValue::Duration);
            /// How a batch's records make one body: each followed by a newline (nsqd's /mpub,
            /// NDJSON), or a JSON array (default {default}).
            http_batch_format: $crate::sink::BatchFormat,
                default($crate::setting::DefaultValue::Text("lines")),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("http-batch-format", value_name: "FORMAT",
                     value: $crate::setting::FlagValue::Names(&$crate::sink::http::settings::BATCH_FORMATS));
        ] }
    };
}

pub(crate) use sink_keys;

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

impl crate::setting::Overlay for OneOrMany {}
impl crate::setting::Overlay for HttpMode {}
impl crate::setting::Overlay for BatchFormat {}

impl Room for HttpSink {
    type Settings = HttpSinkConfig;

    fn validate(
        raw: &RawSink,
        _topic: &str,
        _channel: &str,
    ) -> Result<HttpSinkConfig, ConfigError> {
        validate(raw)
    }

    fn summary(config: &HttpSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        summary(config, f)
    }

    async fn build(config: &HttpSinkConfig, _with: &Build<'_>) -> Result<HttpSink, BuildError> {
        HttpSink::new(config).map_err(BuildError::Http)
    }
}

/// The http sink: its URLs, headers, client, concurrency and batches.
///
/// # Errors
///
/// The first setting that is wrong, by its key: no URL, a URL, header, count or duration
/// that is refused, a CA file that cannot be read.
fn validate(raw: &RawSink) -> Result<HttpSinkConfig, ConfigError> {
    let posts = raw.post.as_ref().map(OneOrMany::to_vec).unwrap_or_default();
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
    let headers = headers(raw)?;
    let defaults = HttpClientConfig::default();
    if let Some(path) = &raw.http_client_tls_root_ca_file {
        std::fs::File::open(path).map_err(|error| {
            invalid(
                "sink.http_client_tls_root_ca_file",
                quote(path.to_str()),
                format!("cannot be read: {error}"),
            )
        })?;
    }
    let mut config = HttpSinkConfig::new(urls);
    config.idempotency_header = idempotency_header_name(raw)?;
    config.concurrency = positive_count(
        "sink.http_concurrency",
        raw.http_concurrency,
        config.concurrency,
    )?;
    config.batch_size = positive_count(
        "sink.http_batch_size",
        raw.http_batch_size,
        config.batch_size,
    )?;
    config.batch_timeout = positive(
        "sink.http_batch_timeout",
        raw.http_batch_timeout,
        config.batch_timeout,
    )?;
    config.batch_format = raw.http_batch_format.unwrap_or_default();
    config.mode = raw.mode.unwrap_or_default();
    config.headers = headers;
    config.client = HttpClientConfig {
        connect_timeout: positive(
            "sink.http_client_connect_timeout",
            raw.http_client_connect_timeout,
            defaults.connect_timeout,
        )?,
        request_timeout: positive(
            "sink.http_client_request_timeout",
            raw.http_client_request_timeout,
            defaults.request_timeout,
        )?,
        root_ca_file: raw.http_client_tls_root_ca_file.clone(),
        ..defaults
    };
    Ok(config)
}

/// The http sink's headers, with its `Content-Type` first unless they set one. A header's
/// value is never shown: it may hold a credential.
fn headers(raw: &RawSink) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let mut headers = Vec::new();
    for (name, value) in raw.headers.clone().unwrap_or_default() {
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
    let content_type = raw.content_type.as_deref().unwrap_or(DEFAULT_CONTENT_TYPE);
    with_content_type(content_type, headers)
        .map_err(|reason| invalid("sink.content_type", quote(Some(content_type)), reason))
}

/// The header each request carries its idempotency key in, or none (`"off"`).
fn idempotency_header_name(raw: &RawSink) -> Result<Option<HeaderName>, ConfigError> {
    match raw.http_idempotency_header.as_deref() {
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

/// The startup line's summary: `http POST https://host/path (2 URLs, round-robin)`, never a
/// secret (a URL's user info and query values are redacted, headers named without values).
fn summary(config: &HttpSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let HttpSinkConfig {
        urls,
        mode,
        headers,
        ..
    } = config;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::setting::Section;
    use crate::sink::{NsqSinkConfig, SinkKind, SinkSettings};

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
        let nsq = SinkSettings::Nsq(NsqSinkConfig {
            nsqd_tcp_addresses: vec!["10.0.0.1:4150".into(), "10.0.0.2:4150".into()],
            topic: "events.unique".into(),
        });
        assert_eq!(
            nsq.to_string(),
            "nsq PUB events.unique to 10.0.0.1:4150,10.0.0.2:4150"
        );
    }
}
