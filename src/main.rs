//! The `nsq-dedupe` binary: parses flags, starts logging and hands over to the library.

use std::io::{self, IsTerminal};
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

mod cli;
mod cmd;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        // Colours only for a person at a terminal, not in log files.
        .with_ansi(io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`nsq-dedupe filter | head`) is how a reader says it has enough.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parsed command line; the error chain is printed by `main`.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Size(args) => cmd::size::run(&args),
        Command::Filter(args) => cmd::filter::run(&args),
        Command::Run(args) => cmd::run::run(&args),
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<nsq_dedupe::filter::FilterError>()
                .is_some_and(|f| matches!(f, nsq_dedupe::filter::FilterError::Io(io) if io.kind() == io::ErrorKind::BrokenPipe))
    })
}
