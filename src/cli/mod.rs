//! Command-line flags (clap derive) of the `nsq-dedupe` binary.
//!
//! Flags belong to the binary: the library knows nothing of clap. Each subcommand has its
//! flags here and its code under `cmd`, which reads these types; nothing here calls `cmd`.
//! `run`'s flags are grouped by the config section they override.

mod filter;
mod parse;
mod run;
mod size;
mod table;

use std::path::PathBuf;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};

pub(crate) use filter::{Digest, FilterArgs, MissingKey};
pub(crate) use parse::MAX_WINDOW_MESSAGES;
pub(crate) use run::RunArgs;
pub(crate) use size::SizeArgs;

/// What `--version` prints after the name: the crate's version and the commit it was built
/// from (`unknown` when built outside a git checkout without one given; see `build.rs`).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NSQ_DEDUPE_COMMIT"),
    ")"
);

/// Removes duplicate messages from NSQ streams with bounded memory.
#[derive(Debug, Parser)]
#[command(name = "nsq-dedupe", version = VERSION, about, propagate_version = true)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
    /// How to log.
    #[command(flatten)]
    pub(crate) log: LogFlags,
}

impl Cli {
    /// The command line's definition, with every flag of `run` also read from the environment
    /// as `NSQ_DEDUPE_<FLAG>` (`--max-in-flight` from `NSQ_DEDUPE_MAX_IN_FLIGHT`): one rule
    /// instead of an `env` attribute on each flag. A flag on the command line wins over the
    /// environment, which wins over the config file. `--help` names the variables but never
    /// shows their values.
    pub(crate) fn definition() -> clap::Command {
        Cli::command().mut_subcommand("run", |run| {
            run.mut_args(|arg| match arg.get_long() {
                Some(long) if !matches!(long, "help" | "version") => {
                    let env = format!("NSQ_DEDUPE_{}", long.to_ascii_uppercase().replace('-', "_"));
                    // `--help` shows no value from the environment: `--post`, `--header` and
                    // the secrets may hold credentials, and help text is pasted into tickets.
                    arg.env(env).hide_env_values(true)
                }
                _ => arg,
            })
        })
    }

    /// Parses the process's arguments and environment; exits with clap's message on errors.
    pub(crate) fn parse_with_env() -> Cli {
        let matches = Cli::definition().get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
    }
}

/// How the binary logs (to stderr), for every subcommand.
#[derive(Debug, Args)]
pub(crate) struct LogFlags {
    /// What to log: a level (off, error, warn, info, debug, trace) or tracing directives such
    /// as `info,nsq_dedupe::nsq=debug`. Without it, RUST_LOG is read, else `info`.
    #[arg(
        long,
        global = true,
        help_heading = "Logging",
        value_name = "LEVEL",
        env = "NSQ_DEDUPE_LOG_LEVEL"
    )]
    pub(crate) log_level: Option<String>,
    /// Log lines as text, or as one JSON object per line.
    #[arg(
        long,
        global = true,
        help_heading = "Logging",
        value_enum,
        value_name = "FORMAT",
        default_value_t = LogFormat::Text,
        env = "NSQ_DEDUPE_LOG_FORMAT"
    )]
    pub(crate) log_format: LogFormat,
}

/// The shape of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable text (coloured only on a terminal).
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Turn a catch probability, a message rate and a window into a table size, or back.
    ///
    /// Give two of --probability, the table size (--buckets or --memory) and the window
    /// (--window with --rate, or --messages); the third is computed. Instead of --rate,
    /// --nsqd-http-address with --topic measures the topic's rate on nsqd.
    Size(SizeArgs),
    /// Write each newline-delimited record whose key was not seen before; drop the copies.
    Filter(FilterArgs),
    /// Consume an NSQ topic, drop the copies, deliver the rest to a sink (the sidecar).
    ///
    /// Settings come from `--config FILE` (TOML) and these flags, which override the file.
    Run(Box<RunArgs>),
    /// Print a shell completion script, e.g. `nsq-dedupe completions bash > /etc/bash_completion.d/nsq-dedupe`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `nsq-dedupe manpage > nsq-dedupe.1`; with `--dir`, write
    /// every page.
    Manpage {
        /// Write every page into this directory instead (created when missing): nsq-dedupe.1 and
        /// one per subcommand (nsq-dedupe-run.1, ...). Prints each path written.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
        super::Cli::definition().debug_assert();
    }

    #[test]
    fn every_run_flag_reads_the_environment() {
        let definition = super::Cli::definition();
        let run = definition.find_subcommand("run").unwrap();
        let mut flags = 0;
        for arg in run.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let expected = format!("NSQ_DEDUPE_{}", long.to_ascii_uppercase().replace('-', "_"));
            assert_eq!(env.as_deref(), Some(expected.as_str()), "--{long}");
            flags += 1;
        }
        assert!(flags >= 20, "only {flags} flags");
    }
}
