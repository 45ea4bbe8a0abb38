//! Values read from the environment (`NSQ_DEDUPE_WAYS` for `--ways`): which flags took their
//! value from their variable, so that errors name what the user set rather than a flag they
//! did not type, and clap's errors about such a value, told by the variable.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// The flags whose value came from the environment, with their variables.
#[derive(Debug, Clone, Default)]
pub(crate) struct FromEnv(BTreeMap<String, &'static str>);

impl FromEnv {
    /// The flags of `definition` (built, as parsing leaves it) and of its subcommand in use
    /// whose values in `matches` came from the environment.
    pub(crate) fn of(definition: &Command, matches: &ArgMatches) -> FromEnv {
        let mut from_env = FromEnv::default();
        from_env.add(definition, matches);
        if let Some((name, sub_matches)) = matches.subcommand() {
            if let Some(subcommand) = definition.find_subcommand(name) {
                from_env.add(subcommand, sub_matches);
            }
        }
        from_env
    }

    fn add(&mut self, command: &Command, matches: &ArgMatches) {
        for arg in command.get_arguments() {
            let (Some(long), Some(variable)) = (arg.get_long(), arg.get_env()) else {
                continue;
            };
            if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::EnvVariable) {
                // One short name per variable set, kept for the life of the process: errors
                // hold their names as `&'static str`.
                let variable = Box::leak(variable.to_string_lossy().into_owned().into_boxed_str());
                self.0.insert(format!("--{long}"), variable);
            }
        }
    }

    /// The variable `flag` (such as `--ways`) took its value from, if it did.
    pub(crate) fn variable(&self, flag: &str) -> Option<&'static str> {
        self.0.get(flag).copied()
    }
}

/// A value from the environment that clap refused: its message, naming the variable.
#[derive(Debug)]
pub(crate) struct EnvError {
    /// clap's message (without "error: " and the usage), the flag replaced by its variable.
    pub(crate) message: String,
    /// Whether the command is `run`, whose settings the environment is.
    pub(crate) is_run: bool,
}

/// clap's `error` from parsing `args` with `definition` (built, as parsing leaves it), when the
/// value it is about came from the environment: clap reads the command line first, so an
/// error that the command line alone does not give is the environment's. `None` for an error
/// of the command line, or for help and version (which are not errors).
pub(crate) fn explain(
    definition: &Command,
    args: &[OsString],
    error: &clap::Error,
) -> Option<EnvError> {
    if !error.use_stderr() {
        return None;
    }
    let without_env = super::map_args(definition.clone(), |arg| arg.env(None));
    let matches = without_env.try_get_matches_from(args).ok()?;
    let mut message = error.render().to_string();
    // The first paragraph: the usage and the `--help` hint that follow are the command line's.
    if let Some(end) = message.find("\n\n") {
        message.truncate(end);
    }
    let mut message = message
        .trim_end()
        .strip_prefix("error: ")
        .map(str::to_owned)
        .unwrap_or(message);
    let subcommand = matches
        .subcommand()
        .and_then(|(name, sub_matches)| Some((definition.find_subcommand(name)?, sub_matches)));
    let commands = std::iter::once((definition, &matches)).chain(subcommand);
    for (command, matches) in commands {
        for arg in command.get_arguments() {
            let Some(variable) = arg.get_env() else {
                continue;
            };
            let given =
                matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine);
            if !given && std::env::var_os(variable).is_some() {
                message = message.replace(
                    &format!("'{arg}'"),
                    &format!("`{}`", variable.to_string_lossy()),
                );
            }
        }
    }
    Some(EnvError {
        message,
        is_run: matches.subcommand_name() == Some("run"),
    })
}

/// Variables nsq-dedupe reads that no flag has: the Redis password (`run`), the commit a build
/// names (and `NSQ_DEDUPE_COMMIT`, which the build script sets and `cargo run` and `cargo test`
/// pass on), and the binary the benchmark scripts run.
const READ_WITHOUT_FLAG: [&str; 4] = [
    "NSQ_DEDUPE_REDIS_PASSWORD",
    "NSQ_DEDUPE_BUILD_COMMIT",
    "NSQ_DEDUPE_COMMIT",
    "NSQ_DEDUPE_BIN",
];

/// The `NSQ_DEDUPE_` variables of the environment that nothing reads, by name: a misspelt one
/// (`NSQ_DEDUPE_MAX_IN_FLIGT`) would otherwise leave its setting at its default, unsaid.
pub(crate) fn unread(definition: &Command) -> Vec<String> {
    let mut read: BTreeSet<String> = READ_WITHOUT_FLAG.map(str::to_owned).into();
    variables(definition, &mut read);
    let mut unread: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| name.starts_with("NSQ_DEDUPE_") && !read.contains(name))
        .collect();
    unread.sort();
    unread
}

/// Adds the variables of `command`'s flags and of its subcommands' to `read`.
fn variables(command: &Command, read: &mut BTreeSet<String>) {
    for arg in command.get_arguments() {
        if let Some(variable) = arg.get_env() {
            read.insert(variable.to_string_lossy().into_owned());
        }
    }
    for subcommand in command.get_subcommands() {
        variables(subcommand, read);
    }
}
