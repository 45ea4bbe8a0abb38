//! `nsq-dedupe run`: merges the config file and the flags, then runs the sidecar until
//! SIGINT or SIGTERM.

use anyhow::Context as _;

use crate::cli::RunArgs;
use crate::config::RawConfig;

/// Builds the settings from `--config` and the flags, and runs the service.
///
/// The first SIGINT/SIGTERM starts a graceful stop; a second one exits at once (status 130),
/// leaving nsqd to redeliver whatever was in flight.
pub(crate) fn run(args: &RunArgs) -> anyhow::Result<()> {
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    apply_flags(&mut raw, args);
    let settings = raw.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let sidecar = crate::sidecar::Sidecar::new(settings).await?;
        sidecar.run(signals()).await?;
        anyhow::Ok(())
    })
}

/// Completes on the first SIGINT or SIGTERM, and arms an immediate exit on the second.
async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers we can still be stopped by SIGKILL; nsqd redelivers.
        tracing::warn!("Could not install signal handlers; graceful shutdown is unavailable.");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => tracing::info!(signal = "SIGINT", "Stopping gracefully; send it again to exit at once."),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "Stopping gracefully; send it again to exit at once."),
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::warn!("Second signal: exiting at once; nsqd redelivers what was in flight.");
        std::process::exit(130);
    });
}

fn apply_flags(raw: &mut RawConfig, args: &RunArgs) {
    let set_vec = |target: &mut Option<Vec<String>>, values: &Vec<String>| {
        if !values.is_empty() {
            *target = Some(values.clone());
        }
    };
    set_vec(&mut raw.source.nsqd_tcp_addresses, &args.nsqd_tcp_addresses);
    set_vec(
        &mut raw.source.lookupd_http_addresses,
        &args.lookupd_http_addresses,
    );
    set_vec(
        &mut raw.store.memcached_addresses,
        &args.memcached_addresses,
    );
    set_vec(
        &mut raw.sink.destination_nsqd_tcp_addresses,
        &args.destination_nsqd_tcp_addresses,
    );
    if let Some(v) = &args.topic {
        raw.source.topic = Some(v.clone());
    }
    if let Some(v) = &args.channel {
        raw.source.channel = Some(v.clone());
    }
    if let Some(v) = args.max_in_flight {
        raw.source.max_in_flight = Some(v);
    }
    if let Some(v) = args.msg_timeout {
        raw.source.msg_timeout = Some(crate::config::Dur(v));
    }
    if let Some(v) = &args.key {
        raw.dedupe.key = Some(v.clone());
    }
    if let Some(v) = args.store {
        raw.store.kind = Some(v);
    }
    if let Some(v) = args.buckets {
        raw.store.buckets = Some(v);
        // Flags win over the file: an explicit size replaces probability-based sizing.
        raw.store.probability = None;
    }
    if let Some(v) = args.ways {
        raw.store.ways = Some(v);
    }
    if let Some(v) = args.sink {
        raw.sink.kind = Some(v);
    }
    if let Some(v) = &args.destination_topic {
        raw.sink.destination_topic = Some(v.clone());
    }
    if let Some(v) = &args.post {
        raw.sink.post = Some(v.clone());
    }
    if let Some(v) = &args.metrics_address {
        raw.metrics.address = Some(v.clone());
    }
}
