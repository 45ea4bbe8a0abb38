//! `[sink]`'s http settings (`sink.kind = "http"`, `nsq_to_http`'s) validated into the http
//! sink's [`HttpSinkConfig`]. A setting not given keeps the http sink's own default
//! ([`HttpSinkConfig::new`], [`HttpClientConfig::default`]).

use std::fmt;
use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue};

use super::{OneOrMany, RawSink};
use crate::config::{invalid, quote, ConfigError, Dur};
use crate::http::{check_url, HttpClientConfig};
use crate::redact;
use crate::sink::{
    with_content_type, HttpMode, HttpSinkConfig, DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER,
};

/// The http sink: its URLs, headers, client, concurrency and batches.
///
/// # Errors
///
/// The first setting that is wrong, by its key: no URL, a URL, header, count or duration
/// that is refused, a CA file that cannot be read.
pub(super) fn validate(raw: &RawSink) -> Result<HttpSinkConfig, ConfigError> {
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
pub(super) fn summary(config: &HttpSinkConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
