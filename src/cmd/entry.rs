//! The `nsq-dedupe` binary's `main`: parses flags, starts logging, runs the subcommand and
//! reports its error with the exit status a service manager reads.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::OnceLock;

use crate::cli::{self, Cli, Command};
use crate::cmd::{self, output};
use crate::wording::FlagOrigins;

/// Every subcommand ends quietly when its output or its error output goes away: nothing here
/// writes with `print!`, which panics on a closed pipe. A closed stdout (`nsq-dedupe filter |
/// head`) is how a reader says it has enough (status 0); a closed stderr loses the messages,
/// not the work (the exit status still tells an error). A stream closed before the program
/// started (`>&-`) is another matter: a command that needs it refuses to start
/// ([`cmd::std_streams`]).
pub(crate) fn main() -> ExitCode {
    let cli = match Cli::parse_with_env() {
        Ok(cli) => cli,
        Err(from_env) => {
            let _ = writeln!(io::stderr().lock(), "error: {}", from_env.message);
            return bad_value_status(from_env.is_run, true);
        }
    };
    let is_service = matches!(cli.command, Command::Run(_) | Command::Resize(_));
    let log_level_variable = cli.from_env.variable("--log-level");
    // A one-shot command prints its result; its log says only what went wrong.
    let default_level = if matches!(cli.command, Command::Resize(_)) {
        "warn"
    } else {
        "info"
    };
    if let Err(err) = start_logging(&cli.log, log_level_variable, default_level) {
        report(&err);
        return bad_value_status(is_service, log_level_variable.is_some());
    }
    for variable in &cli.unread_variables {
        tracing::warn!(
            %variable,
            "No flag reads this variable, so it sets nothing: is it misspelt? `--help` names each \
             flag's variable."
        );
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if output::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            report(&err);
            if is_service && is_setting_error(&err) {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The exit status for a value clap or the logging refused: 2 as for a command line that
/// cannot be parsed, but [`EXIT_CONFIG`] for `run` when the value came from the environment,
/// which holds `run`'s settings as the config file does.
fn bad_value_status(is_run: bool, from_env: bool) -> ExitCode {
    ExitCode::from(if is_run && from_env { EXIT_CONFIG } else { 2 })
}

/// The exit status of `run` when its settings (the config file, a flag's value) cannot be read
/// or are invalid, or a server or file they name refuses them (a store's password, a table
/// file written for another size), or when it was started without a standard stream it needs
/// (stdout for the stdout sink, stderr for its log): `EX_CONFIG` of sysexits.h. Starting again
/// unchanged fails the same way, so the systemd unit lists it, with clap's 2 for a command
/// line it cannot parse, in `RestartPreventExitStatus=` instead of retrying every few seconds.
/// `resize`, which takes `run`'s store settings, exits with it for the same errors. Any other
/// error is 1, as is every error of the other commands.
const EXIT_CONFIG: u8 = 78;

/// Whether `err` is one of `run`'s setting errors (see [`EXIT_CONFIG`]).
fn is_setting_error(err: &anyhow::Error) -> bool {
    err.downcast_ref::<crate::config::ConfigError>().is_some()
        || err.downcast_ref::<cmd::run::SettingError>().is_some()
        || err.downcast_ref::<cmd::resize::NotShared>().is_some()
        || err.downcast_ref::<cmd::resize::NoSize>().is_some()
        || err.downcast_ref::<cmd::resize::NoNamespace>().is_some()
        || err.downcast_ref::<cmd::resize::Refused>().is_some()
        || err.downcast_ref::<cmd::resize::RunOnly>().is_some()
        || err
            .downcast_ref::<crate::error::StoreError>()
            .is_some_and(|error| {
                matches!(
                    error,
                    crate::error::StoreError::Config(_) | crate::error::StoreError::Refused { .. }
                )
            })
        || err
            .downcast_ref::<cmd::std_streams::ClosedAtStart>()
            .is_some()
}

/// How the user gave each setting of the command, once it has read them: [`report`] says the
/// settings an error names so (`--post`, `NSQ_DEDUPE_POST` or `sink.post`). Errors hold
/// keys; this is the one place the binary's errors are put in the user's words.
static NAMES: OnceLock<FlagOrigins> = OnceLock::new();

/// Records how the user gave each setting, for [`report`]; called once, by a command that
/// reads `run`'s settings (`run`, `resize`).
pub(crate) fn name_settings_as(names: FlagOrigins) {
    let _ = NAMES.set(names);
}

/// Prints the error chain on stderr, if stderr is still there, with the settings it names as
/// the user gave them.
fn report(err: &anyhow::Error) {
    let mut stderr = io::stderr().lock();
    let _ = match NAMES.get() {
        Some(names) => writeln!(stderr, "error: {}", names.show(format_args!("{err:#}"))),
        None => writeln!(stderr, "error: {err:#}"),
    };
}

/// Logs to stderr at `--log-level` (else RUST_LOG, else `default_level`), as text or JSON
/// lines; `variable` is the environment variable the level came from, if it came from one.
fn start_logging(
    flags: &cli::LogFlags,
    variable: Option<&str>,
    default_level: &str,
) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match &flags.log_level {
        Some(level) => check_log_level(level)
            .and_then(|()| EnvFilter::try_new(level).map_err(|error| format!("{error}; ")))
            .map_err(|reason| {
                anyhow::anyhow!(
                    "invalid `{}` {level:?}: {reason}expected one of {LOG_LEVELS}, or \
                     directives such as info,nsq_dedupe::nsq=debug",
                    variable.unwrap_or("--log-level")
                )
            })?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
    };
    // A log line that cannot be written (stderr closed) is dropped, not reported on the
    // same closed stderr.
    let logs = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .log_internal_errors(false)
        .with_env_filter(filter);
    match flags.log_format {
        // Colours only for a person at a terminal, not in log files.
        cli::LogFormat::Text => logs.with_ansi(io::stderr().is_terminal()).init(),
        cli::LogFormat::Json => logs.json().init(),
    }
    Ok(())
}

/// The levels `--log-level` accepts, alone or after `target=`.
const LOG_LEVELS: &str = "off, error, warn, info, debug, trace";

/// Refuses a directive that is a word but not a level: tracing would read `verbose` or
/// `WARNING` as the name of a module to log at every level, and so log nothing else.
fn check_log_level(text: &str) -> Result<(), String> {
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains(['[', '{']) {
            continue;
        }
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        let known = LOG_LEVELS
            .split(", ")
            .any(|name| name.eq_ignore_ascii_case(level));
        if !known {
            return Err(format!("{level:?} is not a level; "));
        }
    }
    Ok(())
}

/// Runs the parsed command line; the error chain is printed by `main`.
fn run(cli: Cli) -> anyhow::Result<()> {
    use cmd::std_streams::{require, Stream};
    match cli.command {
        Command::Size(args) => {
            require(Stream::Stdout, "`size` writes its answer")?;
            cmd::size::run(&args)
        }
        Command::Filter(args) => cmd::filter::run(&args),
        Command::Run(args) => cmd::run::run(&args, &cli.from_env, &cli.aliases),
        Command::Resize(args) => {
            require(Stream::Stdout, "`resize` writes what it changed")?;
            cmd::resize::run(&args, &cli.from_env, &cli.aliases)
        }
        Command::Completions { shell } => {
            require(Stream::Stdout, "`completions` writes the script")?;
            cmd::completions::run(shell, Cli::definition())
        }
        Command::Manpage { dir } => {
            if dir.is_none() {
                require(Stream::Stdout, "`manpage` writes the page")?;
            }
            cmd::manpage::run(Cli::definition(), dir.as_deref())
        }
    }
}
