//! `run` flags of the `[sink]` section: where unique messages go.

use clap::Args;
use nsq_dedupe::config::{RawConfig, SinkKind};

use super::Overlay;
use crate::cli::parse::named;

/// Where unique messages go.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sink")]
pub(crate) struct SinkFlags {
    /// Where unique messages go. `sink.kind`.
    #[arg(long, value_name = "SINK", value_parser = named(&SinkKind::NAMES))]
    pub(crate) sink: Option<SinkKind>,
    /// nsqd TCP address to publish to (repeatable; nsq sink). `sink.destination_nsqd_tcp_addresses`.
    #[arg(long = "destination-nsqd-tcp-address", value_name = "ADDR")]
    pub(crate) destination_nsqd_tcp_addresses: Vec<String>,
    /// Topic to publish to (nsq sink). `sink.destination_topic`.
    #[arg(long, value_name = "TOPIC")]
    pub(crate) destination_topic: Option<String>,
    /// URL to POST each message to (http sink; http:// only). `sink.post`.
    #[arg(long, value_name = "URL")]
    pub(crate) post: Option<String>,
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
        overlay.value(&mut sink.post, self.post.as_ref(), "sink.post", "--post");
    }
}
