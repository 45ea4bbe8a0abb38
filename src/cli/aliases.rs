//! Which flags were typed by an alias, such as `--n`, `nsq_to_http`'s name of
//! `--http-concurrency`: clap takes either name and says only that the flag was given, and an
//! error should name what the user typed.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

/// The flags typed by one of their aliases, with the alias typed: `--http-concurrency` to
/// `--n`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TypedAliases(BTreeMap<String, &'static str>);

/// A long alias made a flag of its own: the command it belongs to, its id and the id of the
/// flag it stands for, and that flag's name and the alias, both with their dashes.
struct Split {
    command: String,
    id: String,
    original: String,
    flag: String,
    alias: String,
}

impl TypedAliases {
    /// The flags of `definition` (not yet built) and of its subcommand in use that `args`
    /// gave by an alias.
    ///
    /// clap does not tell which name matched, so `args` are parsed once more with each alias
    /// made a flag of its own. They parsed with `definition`, so they parse with that as well;
    /// if they did not, nothing is recorded and errors name each flag by its own name.
    pub(crate) fn of(definition: Command, args: &[OsString]) -> TypedAliases {
        let mut splits = Vec::new();
        let name = definition.get_name().to_owned();
        let Ok(matches) = split(definition, &mut splits).try_get_matches_from(args) else {
            return TypedAliases::default();
        };
        let mut commands: Vec<(&str, &ArgMatches)> = vec![(&name, &matches)];
        if let Some(subcommand) = matches.subcommand() {
            commands.push(subcommand);
        }
        let mut typed = TypedAliases::default();
        for (command, matches) in commands {
            let typed_as = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
            for alias in splits.iter().filter(|split| split.command == command) {
                if typed_as(&alias.id) && !typed_as(&alias.original) {
                    // One short name per alias typed, kept for the life of the process: errors
                    // hold their names as `&'static str`.
                    let name = Box::leak(alias.alias.clone().into_boxed_str());
                    typed.0.insert(alias.flag.clone(), name);
                }
            }
        }
        typed
    }

    /// The alias `flag` (such as `--http-concurrency`) was typed as, if it was.
    pub(crate) fn typed(&self, flag: &str) -> Option<&'static str> {
        self.0.get(flag).copied()
    }
}

/// `command` and, at any depth, its subcommands with each long alias of an argument made a
/// hidden argument of its own, which takes the same values but no environment variable; each
/// is added to `splits`.
fn split(command: Command, splits: &mut Vec<Split>) -> Command {
    let name = command.get_name().to_owned();
    let mut added = Vec::new();
    for arg in command.get_arguments() {
        let (Some(long), Some(aliases)) = (arg.get_long(), arg.get_all_aliases()) else {
            continue;
        };
        for alias in aliases {
            let id = format!("{} as --{alias}", arg.get_id());
            added.push(
                arg.clone()
                    .id(id.clone())
                    .long(alias.to_owned())
                    .alias(None::<&str>)
                    .short(None)
                    .env(None::<&str>)
                    .required(false)
                    .hide(true),
            );
            splits.push(Split {
                command: name.clone(),
                id,
                original: arg.get_id().to_string(),
                flag: format!("--{long}"),
                alias: format!("--{alias}"),
            });
        }
    }
    let subcommands: Vec<String> = command
        .get_subcommands()
        .map(|subcommand| subcommand.get_name().to_owned())
        .collect();
    let mut command = command
        .mut_args(|arg: Arg| arg.alias(None::<&str>).required(false))
        .args(added);
    for subcommand in subcommands {
        command = command.mut_subcommand(subcommand, |subcommand| split(subcommand, splits));
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(args: &[&str]) -> TypedAliases {
        let args: Vec<OsString> = ["nsq-dedupe", "run", "--topic", "t"]
            .iter()
            .chain(args)
            .map(OsString::from)
            .collect();
        TypedAliases::of(crate::cli::Cli::definition(), &args)
    }

    #[test]
    fn a_flag_typed_by_its_alias_is_told_from_one_typed_by_its_name() {
        assert_eq!(
            typed(&["--n", "5"]).typed("--http-concurrency"),
            Some("--n")
        );
        assert_eq!(typed(&["--n=5"]).typed("--http-concurrency"), Some("--n"));
        assert_eq!(
            typed(&["--http-concurrency", "5"]).typed("--http-concurrency"),
            None
        );
        assert_eq!(typed(&[]).typed("--http-concurrency"), None);
        assert_eq!(typed(&["--n", "5"]).typed("--topic"), None);
    }

    /// Every alias of every command, whatever its flag: a command line that gives one by its
    /// alias is told so.
    #[test]
    fn every_alias_is_told() {
        let mut definition = crate::cli::Cli::definition();
        definition.build();
        let mut seen = 0;
        for command in std::iter::once(&definition).chain(definition.get_subcommands()) {
            for arg in command.get_arguments() {
                let (Some(long), Some(aliases)) = (arg.get_long(), arg.get_all_aliases()) else {
                    continue;
                };
                for alias in aliases {
                    let mut args = vec!["nsq-dedupe".to_owned()];
                    if command.get_name() != definition.get_name() {
                        args.push(command.get_name().to_owned());
                    }
                    args.push(format!("--{alias}"));
                    if arg.get_action().takes_values() {
                        args.push("1".to_owned());
                    }
                    let args: Vec<OsString> = args.into_iter().map(OsString::from).collect();
                    let typed = TypedAliases::of(crate::cli::Cli::definition(), &args);
                    assert_eq!(
                        typed.typed(&format!("--{long}")),
                        Some(format!("--{alias}").as_str()),
                        "{args:?}"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 0, "no alias was found: the test tested nothing");
    }
}
