//! The `nsq-dedupe` binary: parses flags, starts logging and hands over to the library.

use std::io::{self, IsTerminal};
use std::process::ExitCode;

use cli::{Cli, Command};

mod cli;
mod cmd;

fn main() -> ExitCode {
    let cli = Cli::parse_with_env();
    if let Err(err) = start_logging(&cli.log) {
        eprintln!("error: {err:#}");
        return ExitCode::from(2);
    }
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

/// Logs to stderr at `--log-level` (else RUST_LOG, else info), as text or JSON lines.
fn start_logging(flags: &cli::LogFlags) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match &flags.log_level {
        Some(level) => EnvFilter::try_new(level).map_err(|error| {
            anyhow::anyhow!(
                "invalid `--log-level` {level:?} ({error}): expected a level such as info or \
                 debug, or directives such as info,nsq_dedupe::nsq=debug"
            )
        })?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let logs = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_env_filter(filter);
    match flags.log_format {
        // Colours only for a person at a terminal, not in log files.
        cli::LogFormat::Text => logs.with_ansi(io::stderr().is_terminal()).init(),
        cli::LogFormat::Json => logs.json().init(),
    }
    Ok(())
}

/// Runs the parsed command line; the error chain is printed by `main`.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Size(args) => cmd::size::run(&args),
        Command::Filter(args) => cmd::filter::run(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::definition(),
                "nsq-dedupe",
                &mut io::stdout(),
            );
            Ok(())
        }
        Command::Manpage => {
            clap_mangen::Man::new(Cli::definition()).render(&mut io::stdout())?;
            Ok(())
        }
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
