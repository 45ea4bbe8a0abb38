//! The serve sink in your own program (`nsq-dedupe run --sink serve` does the same from the
//! command line): consumes a topic from one or more nsqd, drops the copies (keyed on the JSON
//! field `id`, or the whole body without one) and serves the rest to any NSQ client.
//!
//! ```sh
//! cargo run --example serve -- events app 127.0.0.1:4250 127.0.0.1:4251 127.0.0.1:4150 127.0.0.1:5150
//! nsq_tail --nsqd-tcp-address 127.0.0.1:4250 --topic events --channel app
//! nsq_tail --lookupd-http-address 127.0.0.1:4251 --topic events --channel app
//! ```
//!
//! Arguments: topic, channel, the served TCP address, the served HTTP address, then the
//! upstream nsqd TCP addresses. `KEY=body` keys on the whole body.

use std::io::IsTerminal;

use nsq_dedupe::serve::{ServeConfig, ServeSink};
use nsq_dedupe::{Settings, Sidecar};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [topic, channel, tcp, http, upstream @ ..] = &args[..] else {
        return Err("usage: serve TOPIC CHANNEL SERVE_TCP SERVE_HTTP NSQD_TCP...".into());
    };
    if upstream.is_empty() {
        return Err("give at least one upstream nsqd TCP address".into());
    }
    let key = std::env::var("KEY").unwrap_or_else(|_| "json:/id".into());
    let nsqd = upstream
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let settings = Settings::from_toml(&format!(
        r#"
        [source]
        nsqd_tcp_addresses = [{nsqd}]
        topic = "{topic}"
        channel = "{channel}"
        max_in_flight = 2500
        [dedupe]
        key = "{key}"
        [store]
        probability = 0.99
        rate = 10000
        window = "10m"
        "#
    ))?;
    let mut config = ServeConfig::new(topic.as_str(), channel.as_str());
    config.tcp_address = tcp.parse()?;
    config.http_address = Some(http.parse()?);
    let sink = ServeSink::start(config).await?;
    eprintln!(
        "serving {topic}/{channel} on {} (HTTP {})",
        sink.tcp_address(),
        http
    );
    let sidecar = Sidecar::with_handler(settings, sink).await?;
    let report = sidecar
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    eprintln!("stopped: {report:?}");
    Ok(())
}
