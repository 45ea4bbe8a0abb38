//! `run` flags of the `[sink]` section: where unique messages go. The http sink's flags are
//! `nsq_to_http`'s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nsq_dedupe::config::{Dur, OneOrMany, RawConfig, SinkKind};
use nsq_dedupe::sink::{BatchFormat, HttpMode};

use super::Overlay;
use crate::cli::parse::{named, parse_duration};

/// Where unique messages go.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sink")]
pub(crate) struct SinkFlags {
    /// Where unique messages go. `sink.kind`.
    #[arg(long, value_name = "SINK", value_parser = named(&SinkKind::NAMES))]
    pub(crate) sink: Option<SinkKind>,
    /// nsqd TCP address to publish to (repeatable, or comma-separated; nsq sink).
    /// `sink.destination_nsqd_tcp_addresses`.
    #[arg(
        long = "destination-nsqd-tcp-address",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub(crate) destination_nsqd_tcp_addresses: Vec<String>,
    /// Topic to publish to (nsq sink). `sink.destination_topic`.
    #[arg(long, value_name = "TOPIC")]
    pub(crate) destination_topic: Option<String>,
    /// URL to POST each message to, http:// or https:// (repeatable; http sink). `sink.post`.
    #[arg(long = "post", value_name = "URL")]
    pub(crate) posts: Vec<String>,
    /// With several --post: each message to one URL in turn, or to every URL. `sink.mode`.
    #[arg(long, value_name = "MODE", value_parser = named(&HttpMode::NAMES))]
    pub(crate) mode: Option<HttpMode>,
    /// A header of every POST, as "Name: value" (repeatable). `sink.headers`.
    #[arg(long = "header", value_name = "HEADER", value_parser = HeaderParser)]
    pub(crate) headers: Vec<(String, String)>,
    /// Content-Type of every POST (default application/octet-stream). `sink.content_type`.
    #[arg(long, value_name = "TYPE")]
    pub(crate) content_type: Option<String>,
    /// Bound on connecting to an http sink URL (default 2s). `sink.http_client_connect_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) http_client_connect_timeout: Option<Duration>,
    /// Bound on one POST, answer included (default 10s). `sink.http_client_request_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) http_client_request_timeout: Option<Duration>,
    /// PEM file of CA certificates trusted for https:// besides the system's.
    /// `sink.http_client_tls_root_ca_file`.
    #[arg(long, value_name = "FILE")]
    pub(crate) http_client_tls_root_ca_file: Option<PathBuf>,
    /// Most requests in flight, and connections open, per http sink endpoint; more records
    /// wait (default 100). Fewer while connects to the endpoint stall. `sink.http_concurrency`.
    #[arg(long, visible_alias = "n", value_name = "N")]
    pub(crate) http_concurrency: Option<usize>,
    /// Header carrying each request's idempotency key (the body's digest), or "off" (default
    /// Idempotency-Key). `sink.http_idempotency_header`.
    #[arg(long, value_name = "NAME|off")]
    pub(crate) http_idempotency_header: Option<String>,
    /// Records per POST (default 1: each body as it is). `sink.http_batch_size`.
    #[arg(long, value_name = "N")]
    pub(crate) http_batch_size: Option<usize>,
    /// How long a batch that is not full waits for more records (default 100ms): a burst's
    /// full batches go at once, the rest joins the records that follow. `sink.http_batch_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) http_batch_timeout: Option<Duration>,
    /// How a batch's records make one body: each followed by a newline (nsqd's /mpub,
    /// NDJSON), or a JSON array (default lines). `sink.http_batch_format`.
    #[arg(long, value_name = "FORMAT", value_parser = named(&BatchFormat::NAMES))]
    pub(crate) http_batch_format: Option<BatchFormat>,
}

/// Parses `--header` without ever repeating the value in an error: it may hold a secret
/// (`Authorization: Bearer ...`), and clap's own message for a bad value quotes it.
#[derive(Clone)]
struct HeaderParser;

impl clap::builder::TypedValueParser for HeaderParser {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let refuse = |reason: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "invalid value for '--header <HEADER>' (not shown: it may hold a secret): \
                     {reason}\n"
                ),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refuse("it is not UTF-8"))?;
        parse_header(text).map_err(|reason| refuse(&reason))
    }
}

/// `Name: value` to its name and value.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err("expected \"Name: value\", such as \"Authorization: Bearer abc\"".to_owned()),
    }
}

impl SinkFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        let sink = &mut raw.sink;
        overlay.value(&mut sink.kind, self.sink.as_ref(), "sink.kind", "--sink");
        overlay.list(
            &mut sink.destination_nsqd_tcp_addresses,
            &self.destination_nsqd_tcp_addresses,
            "sink.destination_nsqd_tcp_addresses",
            "--destination-nsqd-tcp-address",
        );
        overlay.value(
            &mut sink.destination_topic,
            self.destination_topic.as_ref(),
            "sink.destination_topic",
            "--destination-topic",
        );
        let posts = (!self.posts.is_empty()).then(|| OneOrMany::Many(self.posts.clone()));
        overlay.value(&mut sink.post, posts.as_ref(), "sink.post", "--post");
        overlay.value(&mut sink.mode, self.mode.as_ref(), "sink.mode", "--mode");
        if !self.headers.is_empty() {
            // Flags add to the file's headers, and win over a header of the same name.
            let headers = sink.headers.get_or_insert_with(Default::default);
            for (name, value) in &self.headers {
                headers.retain(|existing, _| !existing.eq_ignore_ascii_case(name));
                headers.insert(name.clone(), value.clone());
            }
        }
        overlay.record("sink.headers", "--header", !self.headers.is_empty());
        overlay.value(
            &mut sink.content_type,
            self.content_type.as_ref(),
            "sink.content_type",
            "--content-type",
        );
        overlay.value(
            &mut sink.http_client_connect_timeout,
            self.http_client_connect_timeout.map(Dur).as_ref(),
            "sink.http_client_connect_timeout",
            "--http-client-connect-timeout",
        );
        overlay.value(
            &mut sink.http_client_request_timeout,
            self.http_client_request_timeout.map(Dur).as_ref(),
            "sink.http_client_request_timeout",
            "--http-client-request-timeout",
        );
        overlay.value(
            &mut sink.http_client_tls_root_ca_file,
            self.http_client_tls_root_ca_file.as_ref(),
            "sink.http_client_tls_root_ca_file",
            "--http-client-tls-root-ca-file",
        );
        overlay.value(
            &mut sink.http_concurrency,
            self.http_concurrency.as_ref(),
            "sink.http_concurrency",
            "--http-concurrency",
        );
        overlay.value(
            &mut sink.http_idempotency_header,
            self.http_idempotency_header.as_ref(),
            "sink.http_idempotency_header",
            "--http-idempotency-header",
        );
        overlay.value(
            &mut sink.http_batch_size,
            self.http_batch_size.as_ref(),
            "sink.http_batch_size",
            "--http-batch-size",
        );
        overlay.value(
            &mut sink.http_batch_timeout,
            self.http_batch_timeout.map(Dur).as_ref(),
            "sink.http_batch_timeout",
            "--http-batch-timeout",
        );
        overlay.value(
            &mut sink.http_batch_format,
            self.http_batch_format.as_ref(),
            "sink.http_batch_format",
            "--http-batch-format",
        );
    }
}
