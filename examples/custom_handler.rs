//! The de-dup filter in your own program: the sidecar's pipeline with your own async handler,
//! and the same filter over a plain stream of records.
//!
//! ```sh
//! cargo run --example custom_handler -- 127.0.0.1:4150 events
//! ```
//!
//! consumes `events` from that nsqd, drops the copies (keyed on the JSON field `id`) and
//! prints the rest, until Ctrl-C. Without arguments it only runs the stream part.

use std::io::IsTerminal;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use nsq_dedupe::sink::HandlerError;
use nsq_dedupe::{filter_stream, Keyer, Settings, Sidecar, Table};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Colours only for a person at a terminal, not in a file or a pipe.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    // 1. A plain stream of records, de-duplicated by their `id` field.
    let table = Arc::new(Table::with_slots(1 << 16, 8)?);
    let keyer = Keyer::new("json:/id".parse()?, Default::default());
    let records = futures::stream::iter([
        Bytes::from_static(br#"{"id":"a","n":1}"#),
        Bytes::from_static(br#"{"id":"b","n":2}"#),
        Bytes::from_static(br#"{"id":"a","n":1}"#),
    ]);
    let unique: Vec<Bytes> = filter_stream(table, keyer, records).collect().await;
    assert_eq!(unique.len(), 2);
    eprintln!("stream: {} of 3 records are unique", unique.len());

    // 2. NSQ in, your handler out, with everything `nsq-dedupe run` does around it: claims,
    //    TOUCH and lease renewal while the handler runs, commit before FIN, erase before REQ.
    let mut args = std::env::args().skip(1);
    let (Some(nsqd), Some(topic)) = (args.next(), args.next()) else {
        return Ok(());
    };
    let settings = Settings::builder()
        .source(|source| source.nsqd_tcp_addresses(vec![nsqd]).topic(topic))
        .dedupe(|dedupe| dedupe.key("json:/id"))
        .store(|store| {
            store
                .probability(0.99)
                .rate(100.0)
                .window(std::time::Duration::from_secs(600))
        })
        .metrics(|metrics| metrics.address("127.0.0.1:0"))
        .build()?;
    let handler = |body: Bytes| async move {
        // Your work here. An error is retried with backoff (`Retry`), or sent to the
        // dead-letter (`Reject`); `Ok` FINishes the message.
        if body.is_empty() {
            return Err(HandlerError::Reject("empty body".into()));
        }
        println!("{}", String::from_utf8_lossy(&body));
        Ok(())
    };
    let sidecar = Sidecar::with_handler(settings, handler).await?;
    if let Some(url) = sidecar.metrics_url() {
        eprintln!("metrics at {url}");
    }
    let report = sidecar
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    eprintln!("stopped: {report:?}");
    Ok(())
}
