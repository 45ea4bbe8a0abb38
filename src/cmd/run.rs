//! `nsq-dedupe run`: merges the config file and the flags, then runs the sidecar until
//! SIGINT or SIGTERM.

use anyhow::Context as _;

use crate::cli::{FromEnv, RunArgs};
use crate::cmd::std_streams::{require, Stream};
use nsq_dedupe::config::{RawConfig, SinkSettings};
use nsq_dedupe::sidecar::RunError;

/// Builds the settings from `--config`, the flags and the environment (`from_env` tells
/// which flags took their value from it), and runs the service.
///
/// The first SIGINT/SIGTERM starts a graceful stop; a second one exits at once (status 128
/// plus the signal's number: 130 for SIGINT, 143 for SIGTERM, as a shell reports a process
/// the signal ended), leaving nsqd to redeliver whatever was in flight.
pub(crate) fn run(args: &RunArgs, from_env: &FromEnv) -> anyhow::Result<()> {
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    args.apply(&mut raw, from_env);
    let settings = raw.validate()?;
    // Before anything is consumed. A service's log is how it tells of failing sinks and
    // stores; `2>/dev/null` runs it without one on purpose.
    require(Stream::Stderr, "`run` writes its log")?;
    if settings.sink == SinkSettings::Stdout {
        require(
            Stream::Stdout,
            "`run` writes the unique messages of the stdout sink",
        )?;
    }
    tracing::info!(version = crate::cli::VERSION, "Starting nsq-dedupe.");
    let names = settings.names.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(async move {
        // Before anything connects: a signal from then on starts a graceful stop.
        let stop = signals();
        let sidecar = nsq_dedupe::Sidecar::new(settings).await?;
        sidecar.run(stop).await?;
        anyhow::Ok(())
    });
    // The service's errors carry the settings they name; say them as the user gave them. A
    // closed output keeps its cause, and a setting error its kind, which `main` looks for.
    result.map_err(|error| {
        if crate::cmd::output::is_broken_pipe(&error) {
            return error;
        }
        match error.downcast::<RunError>() {
            Ok(error) => {
                let error = error.naming(&names);
                if error.is_setting() {
                    SettingError(error).into()
                } else {
                    error.into()
                }
            }
            Err(error) => error,
        }
    })
}

/// An error of the running service that starting again with the same settings meets again
/// (see [`RunError::is_setting`]): `main` exits with the status of an invalid config for it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct SettingError(RunError);

/// Installs the SIGINT and SIGTERM handlers at once (inside the runtime), and returns a future
/// that completes on the first of those signals and arms an immediate exit on the second.
///
/// Installed when called, not when first polled: the service polls its stop future only once
/// it has opened the store and started the consumer, and a signal before that would end the
/// process by the signal's default action, without a graceful stop.
fn signals() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(int), Ok(term)) = handlers else {
            // Without signal handlers we can still be stopped by SIGKILL; nsqd redelivers.
            tracing::warn!("Could not install signal handlers; graceful shutdown is unavailable.");
            return std::future::pending().await;
        };
        first_and_second(int, term).await;
    }
}

/// Completes on the first of `int` and `term`, and arms an immediate exit on the second.
async fn first_and_second(
    mut int: tokio::signal::unix::Signal,
    mut term: tokio::signal::unix::Signal,
) {
    use tokio::signal::unix::SignalKind;
    tokio::select! {
        _ = int.recv() => tracing::info!(signal = "SIGINT", "Stopping gracefully; send it again to exit at once."),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "Stopping gracefully; send it again to exit at once."),
    }
    tokio::spawn(async move {
        let (name, kind) = tokio::select! {
            _ = int.recv() => ("SIGINT", SignalKind::interrupt()),
            _ = term.recv() => ("SIGTERM", SignalKind::terminate()),
        };
        tracing::warn!(
            signal = name,
            "Second signal: exiting at once; nsqd redelivers what was in flight."
        );
        std::process::exit(128 + kind.as_raw_value());
    });
}
