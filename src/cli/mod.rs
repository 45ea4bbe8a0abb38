//! Command-line flags (clap derive) of the `nsq-dedupe` binary.
//!
//! Flags belong to the binary: the library knows nothing of clap. Each subcommand has its
//! flags here and its code under `cmd`, which reads these types; nothing here calls `cmd`.
//! `run`'s flags are grouped by the config section they override.

mod aliases;
mod env;
mod filter;
mod parse;
mod run;
mod size;
mod table;

use std::path::PathBuf;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};

pub(crate) use aliases::TypedAliases;
pub(crate) use env::{EnvError, FromEnv};
pub(crate) use filter::{Digest, FilterArgs, MissingKey};
pub(crate) use parse::MAX_WINDOW_MESSAGES;
pub(crate) use run::{ResizeArgs, RunArgs};
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
    /// Which flags took their value from the environment.
    #[arg(skip)]
    pub(crate) from_env: FromEnv,
    /// Which flags were typed by an alias.
    #[arg(skip)]
    pub(crate) aliases: TypedAliases,
    /// The `NSQ_DEDUPE_` variables set that no flag reads (a misspelling, most likely).
    #[arg(skip)]
    pub(crate) unread_variables: Vec<String>,
}

/// The store settings (by key) that only a running consumer uses: `resize` leaves their flags
/// out of its help and refuses them, and leaves them unused in the `[store]` section of
/// `run`'s config file, which it reads.
pub(crate) const RUN_ONLY_STORE_SETTINGS: [&str; 8] = [
    "store.lease",
    "store.near_table",
    "store.fleet_interval",
    "store.table_file",
    "store.snapshot_interval",
    "store.table_file_on_mismatch",
    "store.journal_fsync",
    "store.max_memory",
];

impl Cli {
    /// The command line's definition, with every flag of `run` also read from the environment
    /// as `NSQ_DEDUPE_<FLAG>` (`--max-in-flight` from `NSQ_DEDUPE_MAX_IN_FLIGHT`): one rule
    /// instead of an `env` attribute on each flag. A flag on the command line wins over the
    /// environment, which wins over the config file. `--help` names the variables but never
    /// shows their values, for any flag of any command: `--post`, `--header` and the secrets
    /// may hold credentials, and help text is pasted into tickets.
    pub(crate) fn definition() -> clap::Command {
        let definition = Cli::command().mut_subcommand("run", |run| {
            run.mut_args(|arg| match arg.get_long() {
                Some(long) if !matches!(long, "help" | "version") => {
                    let env = format!("NSQ_DEDUPE_{}", long.to_ascii_uppercase().replace('-', "_"));
                    arg.env(env)
                }
                _ => arg,
            })
        });
        // `resize` leaves the store settings that only a running consumer uses out of its
        // help; given, they are refused by name (`cmd::resize`).
        let definition = definition.mut_subcommand("resize", |resize| {
            resize.mut_args(|arg| {
                let hidden = RUN_ONLY_STORE_SETTINGS.contains(&arg.get_id().as_str());
                arg.hide(hidden)
            })
        });
        map_args(definition, |arg| arg.hide_env_values(true))
    }

    /// Parses the process's arguments and environment; exits with clap's message when the
    /// command line is wrong, and returns a value from the environment that is wrong, named
    /// by its variable.
    ///
    /// # Errors
    ///
    /// [`EnvError`] for a variable's value that clap refuses.
    pub(crate) fn parse_with_env() -> Result<Cli, EnvError> {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let mut definition = Cli::definition();
        let matches = match definition.try_get_matches_from_mut(&args) {
            Ok(matches) => matches,
            Err(error) => match env::explain(&definition, &args, &error) {
                Some(from_env) => return Err(from_env),
                None => error.exit(),
            },
        };
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
        cli.from_env = FromEnv::of(&definition, &matches);
        cli.aliases = TypedAliases::of(Cli::definition(), &args);
        cli.unread_variables = env::unread(&definition);
        Ok(cli)
    }
}

/// `command` with `change` made to every argument of it and of its subcommands, at any depth.
fn map_args(command: clap::Command, change: fn(clap::Arg) -> clap::Arg) -> clap::Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|subcommand| subcommand.get_name().to_owned())
        .collect();
    let mut command = command.mut_args(change);
    for name in names {
        command = command.mut_subcommand(name, |subcommand| map_args(subcommand, change));
    }
    command
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
    ///
    /// SIGINT, SIGTERM or SIGHUP stops it gracefully: no new messages, running handlers get
    /// --shutdown-grace to finish, the rest are requeued, exit status 0; a second signal exits
    /// at once.
    Run(Box<RunArgs>),
    /// Change the size of a shared store's table for the whole fleet, without forgetting.
    ///
    /// Takes `run`'s store flags (or `--config`'s `[store]`) with the new size: --buckets, or
    /// --rate, sized for --probability (0.99 by default) over --window (1h by default), as it
    /// says. The store's descriptor key
    /// (`<namespace>:table`) then names the new size and keeps the old one as the previous
    /// generation, which claims still read until it no longer counts; running sidecars follow
    /// within one --fleet-interval. Refused while the previous size is still read (--force
    /// forgets it), and where the namespace has no table (--create starts one). Redis (one
    /// server or a cluster) and Memcached.
    Resize(Box<ResizeArgs>),
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
    fn no_help_shows_a_value_from_the_environment() {
        fn check(command: &clap::Command, checked: &mut usize) {
            for arg in command
                .get_arguments()
                .filter(|arg| arg.get_env().is_some())
            {
                assert!(
                    arg.is_hide_env_values_set(),
                    "{} --{:?}",
                    command.get_name(),
                    arg.get_long()
                );
                *checked += 1;
            }
            for subcommand in command.get_subcommands() {
                check(subcommand, checked);
            }
        }
        let mut definition = super::Cli::definition();
        definition.build();
        let mut checked = 0;
        check(&definition, &mut checked);
        assert!(checked > 30, "only {checked} flags read the environment");
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
