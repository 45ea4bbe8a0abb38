//! The flags of a config section, made from the section's table of settings
//! ([`Section::SETTINGS`]): one flag per setting that has one, with its help, value name,
//! heading and parser, laid over the file's settings generically.

use std::marker::PhantomData;

use crate::setting::{FlagValue, Section, Setting};
use clap::builder::{PathBufValueParser, PossibleValuesParser, TypedValueParser as _};
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use super::FlagRecorder;
use crate::cli::parse::{
    parse_attempts, parse_buckets, parse_in_flight, parse_memory_text, parse_probability,
    parse_rate, parse_ways,
};

/// The flags given of section `S`, each with its value as the config file would write it.
pub(crate) struct SectionFlags<S> {
    given: Vec<(&'static Setting, toml::Value)>,
    section: PhantomData<fn() -> S>,
}

impl<S> std::fmt::Debug for SectionFlags<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets (`--header "Authorization: ..."`): keys only.
        let keys: Vec<&str> = self.given.iter().map(|(setting, _)| setting.key).collect();
        f.debug_struct("SectionFlags")
            .field("given", &keys)
            .finish()
    }
}

impl<S: Section> SectionFlags<S> {
    /// Lays the given flags over `section`, the file's, and records for every flag of the
    /// section whether it set its key. The settings a given flag replaces are cleared first,
    /// so that flags given together all stay.
    ///
    /// # Panics
    ///
    /// If a flag's parser lets through a value the file's type refuses: each parser gives the
    /// value as the file writes it.
    pub(super) fn apply(&self, section: &mut S, recorder: &mut FlagRecorder<'_>) {
        for (setting, _) in &self.given {
            for replaced in setting.replaces {
                section.clear(replaced);
            }
        }
        for setting in S::SETTINGS {
            let Some(flag) = setting.flag else { continue };
            let value = self
                .given
                .iter()
                .find(|(given, _)| given.key == setting.key);
            if let Some((_, value)) = value {
                let lay = |section: &mut S, name: &str, value: toml::Value| {
                    section
                        .lay(name, value)
                        .unwrap_or_else(|error| panic!("{flag} gave {}: {error}", setting.key));
                };
                lay(section, setting.name, value.clone());
                if let Some((name, value)) = setting.sets {
                    lay(section, name, text_value(value.to_owned()));
                }
            }
            recorder.record(setting.key, flag, value.is_some());
        }
    }

    /// Lays the given flags over a section the file may leave out (`[dead_letter]`): over
    /// the file's, or over a new one when a flag of the section is given.
    pub(super) fn apply_optional(&self, section: &mut Option<S>, recorder: &mut FlagRecorder<'_>)
    where
        S: Default,
    {
        let given = section.is_some() || !self.given.is_empty();
        let mut laid = section.take().unwrap_or_default();
        self.apply(&mut laid, recorder);
        *section = given.then_some(laid);
    }
}

impl<S: Section> FromArgMatches for SectionFlags<S> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for setting in S::SETTINGS.iter().filter(|setting| setting.flag.is_some()) {
            let value = match setting.value {
                FlagValue::Switch => matches
                    .get_flag(setting.key)
                    .then_some(toml::Value::Boolean(true)),
                FlagValue::List { .. } | FlagValue::Header => matches
                    .get_many::<toml::Value>(setting.key)
                    .map(|values| toml::Value::Array(values.cloned().collect())),
                _ => matches.get_one::<toml::Value>(setting.key).cloned(),
            };
            if let Some(value) = value {
                given.push((setting, value));
            }
        }
        Ok(SectionFlags {
            given,
            section: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl<S: Section> Args for SectionFlags<S> {
    fn augment_args(command: Command) -> Command {
        let mut settings: Vec<&Setting> = S::SETTINGS.iter().collect();
        settings.sort_by_key(|setting| setting.rank);
        command.args(
            settings
                .into_iter()
                .filter_map(|setting| Some(arg::<S>(setting, setting.flag?))),
        )
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

/// The flag of `setting`.
fn arg<S: Section>(setting: &Setting, flag: &'static str) -> Arg {
    let heading = S::HEADING;
    let heading = match setting.heading {
        "" => heading,
        own => own,
    };
    let arg = Arg::new(setting.key)
        .long(flag.trim_start_matches("--"))
        .help(setting.help_text())
        .help_heading(heading)
        .conflicts_with_all(setting.conflicts.iter().map(|name| key_of::<S>(name)));
    let arg = match setting.alias {
        Some(alias) => arg.visible_alias(alias),
        None => arg,
    };
    let arg = match setting.value {
        FlagValue::Switch => return arg.action(ArgAction::SetTrue),
        FlagValue::List { .. } | FlagValue::Header => arg.action(ArgAction::Append),
        _ => arg.action(ArgAction::Set),
    }
    .value_name(setting.value_name);
    match setting.value {
        FlagValue::Text => {
            arg.value_parser(clap::builder::StringValueParser::new().map(text_value))
        }
        FlagValue::List { delimiter } => {
            let arg = arg.value_parser(clap::builder::StringValueParser::new().map(text_value));
            match delimiter {
                Some(delimiter) => arg.value_delimiter(delimiter),
                None => arg,
            }
        }
        // The file's paths are TOML strings, UTF-8: a path that is not is refused rather
        // than changed.
        FlagValue::Path => arg.value_hint(clap::ValueHint::AnyPath).value_parser(
            PathBufValueParser::new().try_map(|path| {
                path.into_os_string()
                    .into_string()
                    .map(text_value)
                    .map_err(|_| "expected a path in UTF-8")
            }),
        ),
        // The file's rule for a duration; whether 0 means something is the setting's, checked
        // for the flag and the file alike.
        FlagValue::Duration => arg.value_parser(|value: &str| {
            crate::units::parse_duration(value).map(|_| text_value(value.into()))
        }),
        FlagValue::Count => {
            arg.value_parser(|value: &str| value.parse::<usize>().map(|n| whole_number(n as u64)))
        }
        FlagValue::Small => {
            arg.value_parser(clap::value_parser!(u32).map(|n| toml::Value::Integer(n.into())))
        }
        FlagValue::Names(names) => {
            arg.value_parser(PossibleValuesParser::new(names.iter().copied()).map(text_value))
        }
        FlagValue::Header => arg.value_parser(HeaderParser),
        FlagValue::InFlight => {
            arg.value_parser(|text: &str| parse_in_flight(text).map(|n| integer(n.into())))
        }
        FlagValue::Attempts => {
            arg.value_parser(|text: &str| parse_attempts(text).map(|n| integer(n.into())))
        }
        FlagValue::Ways => {
            arg.value_parser(|text: &str| parse_ways(text).map(|n| integer(n.into())))
        }
        FlagValue::Buckets => arg.value_parser(|text: &str| parse_buckets(text).map(whole_number)),
        FlagValue::Memory => arg.value_parser(|text: &str| parse_memory_text(text).map(text_value)),
        FlagValue::Probability => arg
            .allow_negative_numbers(true)
            .value_parser(|text: &str| parse_probability(text).map(toml::Value::Float)),
        FlagValue::Rate => arg
            .allow_negative_numbers(true)
            .value_parser(|text: &str| parse_rate(text).map(toml::Value::Float)),
        FlagValue::Switch => unreachable!("returned above"),
    }
}

fn text_value(text: String) -> toml::Value {
    toml::Value::String(text)
}

/// A whole number as the file writes it, an integer; above TOML's largest, its digits (which
/// the setting reads as its number), so that an error quotes the number typed.
fn whole_number(n: u64) -> toml::Value {
    i64::try_from(n).map_or_else(|_| text_value(n.to_string()), toml::Value::Integer)
}

fn integer(n: i64) -> toml::Value {
    toml::Value::Integer(n)
}

/// The key of the setting `name` of section `S`, the id of its flag.
fn key_of<S: Section>(name: &str) -> &'static str {
    S::SETTINGS
        .iter()
        .find(|setting| setting.name == name)
        .map_or("", |setting| setting.key)
}

/// Parses `--header` without ever repeating the value in an error: it may hold a secret
/// (`Authorization: Bearer ...`), and clap's own message for a bad value quotes it. The value
/// is `[name, value]`, a pair of the file's `headers` table.
#[derive(Clone)]
struct HeaderParser;

impl clap::builder::TypedValueParser for HeaderParser {
    type Value = toml::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let refuse = |reason: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "invalid value for '--header <HEADER>' (not shown: it may hold a secret): \
                     {reason}\n"
                ),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refuse("it is not UTF-8"))?;
        let (name, value) = parse_header(text).map_err(|reason| refuse(&reason))?;
        Ok(toml::Value::Array(vec![
            text_value(name),
            text_value(value),
        ]))
    }
}

/// `Name: value` to its name and value.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err("expected \"Name: value\", such as \"Authorization: Bearer abc\"".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::SECTIONS;

    /// The rows of the guide's table of `run`'s flags: (flags cell, keys cell, default cell).
    fn guide_rows() -> Vec<(String, String, String)> {
        let guide = include_str!("../../../docs/guide.md");
        let table = guide
            .split("| Flag | Config key | Default |")
            .nth(1)
            .expect("the guide has the flag table");
        table
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                let cell = |at: usize| cells.get(at).copied().unwrap_or("").to_owned();
                (cell(0), cell(1), cell(2))
            })
            .collect()
    }

    /// Whether `cell` names `name` in backquotes, alone or followed by a value or alternatives.
    fn names(cell: &str, name: &str) -> bool {
        [" ", "`", "\\|"]
            .iter()
            .any(|after| cell.contains(&format!("`{name}{after}")))
    }

    #[test]
    fn the_guides_flag_table_names_every_flag_with_its_key() {
        let rows = guide_rows();
        let mut missing = Vec::new();
        for setting in SECTIONS.iter().copied().flatten() {
            let Some(flag) = setting.flag else { continue };
            let listed = rows
                .iter()
                .any(|(flags, keys, _)| names(flags, flag) && names(keys, setting.key));
            if !listed {
                missing.push(format!("{flag} ({})", setting.key));
            }
        }
        assert!(
            missing.is_empty(),
            "not in docs/guide.md's flag table: {missing:?}"
        );
    }

    /// The guide's Default column shows each setting's default as its table entry has it.
    #[test]
    fn the_guides_flag_table_shows_every_default_of_the_table() {
        let rows = guide_rows();
        let mut wrong = Vec::new();
        for setting in SECTIONS.iter().copied().flatten() {
            let Some(default) = setting.default else {
                continue;
            };
            let shown = rows
                .iter()
                .filter(|(_, keys, _)| names(keys, setting.key))
                .any(|(_, _, cell)| cell.contains(&default.to_string()));
            if !shown {
                wrong.push(format!("{} ({default})", setting.key));
            }
        }
        assert!(
            wrong.is_empty(),
            "docs/guide.md's flag table does not show these defaults: {wrong:?}"
        );
    }

    #[test]
    fn the_run_man_page_names_every_flag_and_key() {
        let mut definition = crate::cli::Cli::definition();
        definition.build();
        let run = definition.find_subcommand("run").unwrap().clone();
        let mut page = Vec::new();
        clap_mangen::Man::new(run).render(&mut page).unwrap();
        // roff escapes each '-' of a flag as "\-".
        let page = String::from_utf8(page).unwrap().replace("\\-", "-");
        for setting in SECTIONS.iter().copied().flatten() {
            let Some(flag) = setting.flag else { continue };
            assert!(page.contains(flag), "{flag} is not in the man page");
            assert!(
                page.contains(setting.key),
                "{} is not in the man page",
                setting.key
            );
        }
    }
}
