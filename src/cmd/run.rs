//! `nsq-dedupe run`: merges the config file and the flags, then runs the sidecar until
//! SIGINT, SIGTERM or SIGHUP.

use anyhow::Context as _;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::cli::{FromEnv, RunArgs, TypedAliases};
use crate::cmd::std_streams::{require, Stream};
use crate::config::{RawConfig, SinkSettings};
use crate::sidecar::RunError;

/// Builds the settings from `--config`, the flags and the environment (`from_env` tells
/// which flags took their value from it, `aliases` which were typed by an alias), and runs
/// the service.
///
/// The first SIGINT, SIGTERM or SIGHUP starts a graceful stop; a second one exits at once
/// (status 128 plus the signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP, as
/// a shell reports a process the signal ended), leaving nsqd to redeliver whatever was in
/// flight.
pub(crate) fn run(
    args: &RunArgs,
    from_env: &FromEnv,
    aliases: &TypedAliases,
) -> anyhow::Result<()> {
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    args.apply(&mut raw, from_env, aliases);
    crate::cmd::entry::name_settings_as(raw.flags.clone());
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(async move {
        // Before anything connects: a signal from then on starts a graceful stop.
        let stop = signals();
        // On a worker, not on this thread: the run loop takes each burst from the consumer's
        // task and spawns the burst's own task, and on a worker both are woken and started
        // on the core that has the burst, where from this thread each cost a wake-up of
        // another thread.
        let run = tokio::spawn(async move {
            let sidecar = crate::Sidecar::new(settings).await?;
            sidecar.run(stop).await?;
            anyhow::Ok(())
        });
        match run.await {
            Ok(result) => result,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    });
    // A closed output keeps its cause, and a setting error its kind, which `main` looks for.
    result.map_err(|error| {
        if crate::cmd::output::is_broken_pipe(&error) {
            return error;
        }
        match error.downcast::<RunError>() {
            Ok(error) => {
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

/// The signals that stop the run: SIGINT (Ctrl-C), SIGTERM (`kill`, `systemctl stop`) and
/// SIGHUP (the terminal closed, `kill -HUP`), which by default would end the process at once,
/// without a graceful stop. A long-running daemon often reloads its config on SIGHUP; `run`
/// has nothing to reload, and a graceful stop loses nothing where dying would cost the
/// running handlers' work and the table file's last changes.
const STOPPING: [(&str, SignalKind); 3] = [
    ("SIGINT", SignalKind::interrupt()),
    ("SIGTERM", SignalKind::terminate()),
    ("SIGHUP", SignalKind::hangup()),
];

/// Installs the handlers of the [`STOPPING`] signals at once (inside the runtime), and returns
/// a future that completes on the first of those signals and arms an immediate exit on the
/// second.
///
/// Installed when called, not when first polled: the service polls its stop future only once
/// it has opened the store and started the consumer, and a signal before that would end the
/// process by the signal's default action, without a graceful stop.
fn signals() -> impl std::future::Future<Output = ()> {
    let handlers: std::io::Result<Vec<Stopping>> = STOPPING
        .iter()
        .map(|&(name, kind)| {
            Ok(Stopping {
                name,
                kind,
                signal: signal(kind)?,
            })
        })
        .collect();
    async move {
        let Ok(handlers) = handlers else {
            // Without signal handlers we can still be stopped by SIGKILL; nsqd redelivers.
            tracing::warn!("Could not install signal handlers; graceful shutdown is unavailable.");
            return std::future::pending().await;
        };
        first_and_second(handlers).await;
    }
}

/// One of the [`STOPPING`] signals, with its handler.
struct Stopping {
    name: &'static str,
    kind: SignalKind,
    signal: Signal,
}

/// Completes on the first of `handlers`' signals, and arms an immediate exit on the second.
async fn first_and_second(mut handlers: Vec<Stopping>) {
    let (first, _) = next(&mut handlers).await;
    tracing::info!(
        signal = first,
        "Stopping gracefully; send it again to exit at once."
    );
    tokio::spawn(async move {
        let (name, kind) = next(&mut handlers).await;
        tracing::warn!(
            signal = name,
            "Second signal: exiting at once; nsqd redelivers what was in flight."
        );
        std::process::exit(128 + kind.as_raw_value());
    });
}

/// The name and kind of the next signal any of `handlers` receives.
async fn next(handlers: &mut [Stopping]) -> (&'static str, SignalKind) {
    let received = handlers.iter_mut().map(|handler| {
        Box::pin(async move {
            handler.signal.recv().await;
            (handler.name, handler.kind)
        })
    });
    futures_util::future::select_all(received).await.0
}
