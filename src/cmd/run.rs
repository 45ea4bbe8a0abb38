//! `nsq-dedupe run`: merges the config file and the flags, then runs the sidecar until
//! SIGINT or SIGTERM.

use anyhow::Context as _;

use crate::cli::{FromEnv, RunArgs};
use nsq_dedupe::config::RawConfig;

/// Builds the settings from `--config`, the flags and the environment (`from_env` tells
/// which flags took their value from it), and runs the service.
///
/// The first SIGINT/SIGTERM starts a graceful stop; a second one exits at once (status 130),
/// leaving nsqd to redeliver whatever was in flight.
pub(crate) fn run(args: &RunArgs, from_env: &FromEnv) -> anyhow::Result<()> {
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    args.apply(&mut raw, from_env);
    let settings = raw.validate()?;
    tracing::info!(version = crate::cli::VERSION, "Starting nsq-dedupe.");
    let names = settings.names.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(async move {
        let sidecar = nsq_dedupe::Sidecar::new(settings).await?;
        sidecar.run(signals()).await?;
        anyhow::Ok(())
    });
    // The service's errors name settings by their keys; say them as the user gave them. A
    // closed output keeps its cause, which `main` looks for.
    result.map_err(|error| {
        if crate::is_broken_pipe(&error) {
            error
        } else {
            anyhow::anyhow!("{}", names.rename(&format!("{error:#}")))
        }
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
