//! Each setting of a config section defined once: its key, its flag, its help, how the flag's
//! text is read and which kind of sink or store it belongs to; and what every section's
//! validation uses: [`ConfigError`] (`error`), the values and rules sections share ([`Dur`],
//! addresses and NSQ names, in `value`) and output file names (`output_name`).
//!
//! Below both `config` (the sections) and `sink` (each sink's keys of `[sink]`, in the sink's
//! own room), so that the two can share it without using each other.
//!
//! A section is written with [`section!`](crate::setting::section): one field per
//! setting, its `///` doc being the flag's help. The macro makes the raw serde struct (every
//! key optional, unknown keys refused) and a table of [`Setting`]s from the same lines, so the
//! command line (built from the table by the binary; the library knows nothing of clap), the
//! TOML loader, `--help`, the man pages and the "unused setting" rule cannot disagree. A flag's
//! environment variable is derived from the flag by the binary's one rule (`NSQ_DEDUPE_<FLAG>`).
//!
//! Flags are laid over the file generically: the binary reads each given flag into a
//! [`toml::Value`], as the file would have written it, and [`Section::lay`] deserializes it
//! into the field named by the key, so a flag's value passes the file's own checks.
//!
//! A setting's default is written in its entry ([`DefaultValue`]) and shown in its help where
//! the doc says `{default}`: `--help`, the man pages and the guide's table say what the file
//! and the flags fall back to, and a test lays every default through the file to check that it
//! changes nothing.
//!
//! A setting that belongs to some kinds only ([`Only`], such as `sink.post` to
//! `sink.kind = "http"`) is refused by [`check_kinds`] when given with another kind.

// The binary's flags, help and man page (behind `cli`) read what the configuration itself
// does not: a setting's flag, help and heading, and a section's overlay of flags.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::wording::Wording;

mod error;
pub(crate) mod output_name;
mod value;

pub use error::ConfigError;
pub(crate) use error::{invalid, quote};
pub use value::Dur;
pub(crate) use value::{check_host_port, check_name, resolve};

/// One setting of a section.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting {
    /// The config key, `section.name`.
    pub key: &'static str,
    /// The field's name in its section.
    pub name: &'static str,
    /// The long flag that sets it, `--name`, if one does.
    pub flag: Option<&'static str>,
    /// Another name the flag is known by, shown in help (`nsq_to_http`'s `--n`).
    pub alias: Option<&'static str>,
    /// What the flag's value is called in help.
    pub value_name: &'static str,
    /// The help, one doc line a piece; help ends by naming the key.
    pub help: &'static [&'static str],
    /// The heading the flag is listed under in `--help`, if not its section's.
    pub heading: &'static str,
    /// How the flag's text is read.
    pub value: FlagValue,
    /// The kinds the setting is used with, if not all.
    pub only: Option<&'static Only>,
    /// Where the flag is listed in `--help` among its section's, when not in the order of the
    /// definition (which is the order of the file's keys in error messages): by rank, 1 first.
    pub rank: u16,
    /// Settings of the section (by name) whose flags may not be given with this one's.
    pub conflicts: &'static [&'static str],
    /// Settings of the section (by name) that this one's flag takes the place of in the file:
    /// a size given by a flag replaces the file's other way of sizing.
    pub replaces: &'static [&'static str],
    /// Another setting of the section (by name) that this one's flag sets too, and its value
    /// as the file writes it, a string: `--dead-letter-file` sets `kind = "file"`. The help
    /// names it after the key.
    pub sets: Option<(&'static str, &'static str)>,
    /// What an unset setting falls back to, if a value the file could write.
    pub default: Option<DefaultValue>,
}

/// A setting's default: what the file and the flags fall back to when neither gives it. The
/// help shows it where the doc says `{default}`, or names it before `(default)` (`requeue it
/// (default) or finish it`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefaultValue {
    /// A duration, written as the file would (`10s`, `2m`; `0` for none).
    Duration(Duration),
    /// A duration written in whole seconds (`60s`), as the flag's own tools write it.
    Seconds(Duration),
    /// A whole number.
    Number(u64),
    /// Text as the file writes it in a string: a name or an address.
    Text(&'static str),
}

impl DefaultValue {
    /// The default as the file writes it.
    #[cfg(test)]
    pub(crate) fn to_toml(self) -> toml::Value {
        match self {
            DefaultValue::Duration(d) => toml::Value::String(crate::units::format_duration(d)),
            DefaultValue::Seconds(d) => toml::Value::String(format!("{}s", d.as_secs())),
            DefaultValue::Number(n) => {
                toml::Value::Integer(i64::try_from(n).expect("a default fits the file's integers"))
            }
            DefaultValue::Text(text) => toml::Value::String(text.to_owned()),
        }
    }
}

impl std::fmt::Display for DefaultValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefaultValue::Duration(d) if d.is_zero() => f.write_str("0"),
            DefaultValue::Duration(d) => f.write_str(&crate::units::format_duration(*d)),
            DefaultValue::Seconds(d) => write!(f, "{}s", d.as_secs()),
            DefaultValue::Number(n) => write!(f, "{n}"),
            DefaultValue::Text(text) => f.write_str(text),
        }
    }
}

impl Setting {
    /// The base the [`section!`] macro fills in.
    pub(crate) const BASE: Setting = Setting {
        key: "",
        name: "",
        flag: None,
        alias: None,
        value_name: "",
        help: &[],
        heading: "",
        value: FlagValue::Text,
        only: None,
        rank: 0,
        conflicts: &[],
        replaces: &[],
        sets: None,
        default: None,
    };

    /// The help shown for the flag: its doc lines joined, with the default where the doc says
    /// `{default}`, then the key.
    pub(crate) fn help_text(&self) -> String {
        let doc: Vec<&str> = self.help.iter().map(|line| line.trim()).collect();
        let doc = doc.join(" ");
        let doc = match self.default {
            Some(default) => doc.replace("{default}", &default.to_string()),
            None => doc,
        };
        let doc = doc.strip_suffix('.').unwrap_or(&doc);
        match self.sets {
            Some((name, value)) => {
                let section = self.key.split_once('.').map_or("", |(section, _)| section);
                format!(
                    "{doc}. `{}` with `{section}.{name} = \"{value}\"`",
                    self.key
                )
            }
            None => format!("{doc}. `{}`", self.key),
        }
    }
}

/// How a flag's text becomes the key's value, as the file would write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagValue {
    /// Text as typed.
    Text,
    /// A file or directory.
    Path,
    /// A duration such as `10s` (a string in the file); whether 0 means something is the
    /// setting's rule, checked with the file's.
    Duration,
    /// A whole number (`usize`).
    Count,
    /// A whole number of at most `u32::MAX`.
    Small,
    /// A whole number from 1 to `u32::MAX` (`--max-in-flight`).
    InFlight,
    /// A whole number from 1 to `u16::MAX` (`--max-attempts`).
    Attempts,
    /// A table size in slots, at least 1 (`_` and `,` allowed between digits).
    Buckets,
    /// A size in bytes, such as `64MiB` (text in the file).
    Memory,
    /// Slots per set: 1, 2, 4 or 8.
    Ways,
    /// A probability between 0 and 1 exclusive.
    Probability,
    /// Messages per second, more than 0.
    Rate,
    /// One of these names.
    Names(&'static [&'static str]),
    /// A switch: given means `true`.
    Switch,
    /// Repeatable; with a delimiter, each value may hold several.
    List {
        /// The separator within one value, if any.
        delimiter: Option<char>,
    },
    /// Repeatable `Name: value`, laid over the file's table of headers.
    Header,
}

/// The kinds a setting is used with: the values of the section's `kind` key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Only {
    /// The key that names the kind, such as `sink.kind`.
    pub kind: &'static str,
    /// The kinds that use the setting.
    pub kinds: &'static [&'static str],
    /// What those kinds are, for several (`a shared table`); empty for one kind.
    pub what: &'static str,
}

impl Only {
    /// The settings of one kind: `key = "kind"`.
    pub(crate) const fn one(key: &'static str, kinds: &'static [&'static str; 1]) -> Only {
        Only {
            kind: key,
            kinds,
            what: "",
        }
    }

    /// The settings of several kinds, `what` they are: `a shared table`.
    pub(crate) const fn any(
        key: &'static str,
        kinds: &'static [&'static str],
        what: &'static str,
    ) -> Only {
        Only {
            kind: key,
            kinds,
            what,
        }
    }

    /// What the setting needs, as the user would set it in the file:
    /// `` `sink.kind = "http"` `` or `` a shared table, `store.kind = "memcached"` or … ``.
    pub(crate) fn needs(&self) -> Wording {
        let mut needs = Wording::default();
        if !self.what.is_empty() {
            needs = needs.text(format!("{}, ", self.what));
        }
        for (i, kind) in self.kinds.iter().enumerate() {
            if i > 0 {
                needs = needs.text(if i + 1 == self.kinds.len() {
                    " or "
                } else {
                    ", "
                });
            }
            needs = needs.set(self.kind, format!("\"{kind}\""));
        }
        needs
    }
}

/// The names of a table of named values, such as `SinkKind::NAMES`.
pub(crate) const fn names<T: Copy, const N: usize>(
    table: &[(&'static str, T); N],
) -> [&'static str; N] {
    let mut names = [""; N];
    let mut i = 0;
    while i < N {
        names[i] = table[i].0;
        i += 1;
    }
    names
}

/// The name of `value` in a table of named values.
///
/// # Panics
///
/// If the table leaves `value` out: each table lists every value of its type.
pub(crate) fn name_of<T: PartialEq>(table: &[(&'static str, T)], value: T) -> &'static str {
    table
        .iter()
        .find(|(_, named)| *named == value)
        .map(|(name, _)| *name)
        .expect("a table of names names every value")
}

/// A config section made by [`section!`]: its settings, and a way to set one from a flag.
pub(crate) trait Section {
    /// The heading the section's flags are listed under in `--help`, unless their own says
    /// otherwise.
    const HEADING: &'static str;

    /// Every setting, in the order of `--help`.
    const SETTINGS: &'static [Setting];

    /// Whether the setting `name` was given.
    fn given(&self, name: &str) -> bool;

    /// Lays a flag's `value` over the setting `name`.
    ///
    /// # Errors
    ///
    /// The value does not fit the setting (a flag's parser let through what the file refuses).
    fn lay(&mut self, name: &str, value: toml::Value) -> Result<(), toml::de::Error>;

    /// Unsets the setting `name`.
    fn clear(&mut self, name: &str);
}

/// How a flag's value lays over the file's: it replaces it, but for a table, which it adds to.
pub(crate) trait Overlay: serde::de::DeserializeOwned {
    /// Lays `value` over `current`.
    ///
    /// # Errors
    ///
    /// `value` is not of this type.
    fn overlay(current: &mut Option<Self>, value: toml::Value) -> Result<(), toml::de::Error> {
        *current = Some(value.try_into()?);
        Ok(())
    }
}

impl Overlay for String {}
impl Overlay for PathBuf {}
impl Overlay for bool {}
impl Overlay for u32 {}
impl Overlay for f64 {}
impl Overlay for Vec<String> {}
impl Overlay for Dur {}
impl Overlay for u16 {}
impl Overlay for u8 {}
impl Overlay for i64 {}

/// A whole number: a flag's count above TOML's largest integer comes as its digits.
macro_rules! overlay_whole_number {
    ($($number:ty),*) => {$(
        impl Overlay for $number {
            fn overlay(current: &mut Option<Self>, value: toml::Value) -> Result<(), toml::de::Error> {
                *current = Some(match value {
                    toml::Value::String(digits) => digits
                        .parse()
                        .map_err(<toml::de::Error as serde::de::Error>::custom)?,
                    value => value.try_into()?,
                });
                Ok(())
            }
        }
    )*};
}

overlay_whole_number!(u64, usize);

/// Headers: flags give `[name, value]` pairs in the order typed; each adds to the file's
/// headers and wins over one of the same name in any case.
impl Overlay for BTreeMap<String, String> {
    fn overlay(current: &mut Option<Self>, value: toml::Value) -> Result<(), toml::de::Error> {
        let pairs: Vec<(String, String)> = value.try_into()?;
        let headers = current.get_or_insert_with(Default::default);
        for (name, value) in pairs {
            headers.retain(|existing, _| !existing.eq_ignore_ascii_case(&name));
            headers.insert(name, value);
        }
        Ok(())
    }
}

/// Refuses the first setting of `section` given that its kind leaves unused; `kind_of` names
/// the value of a key that decides the kind, such as `http` for `sink.kind`.
///
/// # Errors
///
/// [`ConfigError::Unused`] naming the setting and the kinds that use it.
pub(crate) fn check_kinds<S: Section>(
    section: &S,
    kind_of: impl Fn(&str) -> &'static str,
) -> Result<(), ConfigError> {
    let unused = S::SETTINGS.iter().find_map(|setting| {
        let only = setting.only?;
        let unused = section.given(setting.name) && !only.kinds.contains(&kind_of(only.kind));
        unused.then_some((setting, only))
    });
    match unused {
        Some((setting, only)) => Err(ConfigError::Unused {
            key: setting.key,
            needs: only.needs(),
            instead: None,
        }),
        None => Ok(()),
    }
}

/// Defines a config section once: the raw serde struct `$name` (every field an `Option`,
/// unknown keys refused), a setter per key for building it in code (`RawSource::default()
/// .topic("events")`), and its [`Section`] table. Each field reads
///
/// ```text
/// /// Help of the flag (the key is added).
/// field: Type, default(DefaultValue::Duration(DEFAULT_X)), only(&ONLY_CONST),
///     flag("long-name", value_name: "X", value: FlagValue::Duration);
/// ```
///
/// where `default(...)` (a [`DefaultValue`]), `only(...)` and `flag(...)` are optional, and
/// `flag`'s options are [`Setting`]'s fields. A `#[serde(...)]` after the doc goes to the field, such as
/// `#[serde(deserialize_with = "crate::setting::required")]` for a key the file must give.
/// Fields that are not settings (set by the program, never by the file) follow in an
/// `extra { ... }` block.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $section:literal, heading $heading:literal {
            $(
                $(#[doc = $doc:literal])*
                $(#[serde($($serde:tt)*)])*
                $field:ident : $ty:ty
                    $(, default($default:expr))?
                    $(, only($only:expr))?
                    $(, flag($flag:literal $(, $opt:ident : $val:expr)* $(,)?))?
                ;
            )*
        }
        $( extra { $($extra:tt)* } )?
    ) => {
        $(#[$meta])*
        #[allow(missing_docs)]
        #[derive(Debug, Clone, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: Option<$ty>, )*
            $( $($extra)* )?
        }

        impl $name {
            $(
                #[doc = concat!("Sets `", $section, ".", stringify!($field), "`:")]
                $(#[doc = $doc])*
                pub fn $field(mut self, value: impl Into<$ty>) -> Self {
                    self.$field = Some(value.into());
                    self
                }
            )*
        }

        impl $crate::setting::Section for $name {
            const HEADING: &'static str = $heading;
            const SETTINGS: &'static [$crate::setting::Setting] = &[$(
                $crate::setting::Setting {
                    key: concat!($section, ".", stringify!($field)),
                    name: stringify!($field),
                    help: &[$($doc),*],
                    only: $crate::setting::optional!($($only)?),
                    default: $crate::setting::optional!($($default)?),
                    $( flag: Some(concat!("--", $flag)), $($opt: $val,)* )?
                    ..$crate::setting::Setting::BASE
                },
            )*];

            fn given(&self, name: &str) -> bool {
                match name {
                    $( stringify!($field) => self.$field.is_some(), )*
                    _ => false,
                }
            }

            fn clear(&mut self, name: &str) {
                match name {
                    $( stringify!($field) => self.$field = None, )*
                    _ => {}
                }
            }

            fn lay(&mut self, name: &str, value: toml::Value) -> Result<(), toml::de::Error> {
                match name {
                    $( stringify!($field) => <$ty as $crate::setting::Overlay>::overlay(
                        &mut self.$field,
                        value,
                    ), )*
                    _ => Ok(()),
                }
            }
        }
    };
}

/// Reads a key the file must give into its `Option` field: serde then refuses a section
/// without it ("missing field `kind`"), where a plain `Option` would read as unset.
///
/// # Errors
///
/// The value is not of type `T`.
pub(crate) fn required<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `None`, or `Some` of the one expression given.
macro_rules! optional {
    () => {
        None
    };
    ($value:expr) => {
        Some($value)
    };
}

pub(crate) use {optional, section};

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::Setting;
    use crate::config::{Settings, SECTIONS};

    /// What a setting needs besides a topic and an nsqd to be used at all, as `(key, value)`
    /// in the file's words: its kind (`sink.kind = "http"`), what that kind requires, and the
    /// setting another one is used only with.
    fn needs(setting: &Setting) -> Vec<(&'static str, &'static str)> {
        let mut needs = Vec::new();
        if let Some(only) = setting.only {
            let kind = only.kinds[0];
            needs.push((only.kind, kind));
            needs.extend(match (only.kind, kind) {
                ("sink.kind", "http") => &[("sink.post", "\"http://127.0.0.1:1/\"")][..],
                ("sink.kind", "file") => &[("sink.output_dir", "\"/tmp\"")][..],
                ("store.kind", "memcached") => {
                    &[("store.memcached_addresses", "[\"127.0.0.1:11211\"]")][..]
                }
                ("store.kind", "redis") => {
                    &[("store.redis_urls", "[\"redis://127.0.0.1:6379\"]")][..]
                }
                _ => &[][..],
            });
        }
        needs.extend(match setting.key {
            "store.snapshot_interval" | "store.table_file_on_mismatch" => {
                &[("store.table_file", "\"/tmp/nsq-dedupe-defaults.table\"")][..]
            }
            "source.lookupd_poll_interval" => {
                &[("source.lookupd_http_addresses", "[\"127.0.0.1:4161\"]")][..]
            }
            "sink.gzip_level" => &[("sink.gzip", "true")][..],
            "consumer_opt.deflate_level" => &[("consumer_opt.deflate", "true")][..],
            "consumer_opt.tls_min_version" => &[("consumer_opt.tls_v1", "true")][..],
            _ => &[][..],
        });
        needs
    }

    /// A config file of `settings`, `(key, value)` as the file writes them, after a topic and
    /// an nsqd; each value is quoted as needed by the caller.
    fn file(settings: &[(&str, String)]) -> String {
        let mut sections: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        sections.entry("source").or_default().extend([
            "topic = \"t\"".to_owned(),
            "nsqd_tcp_addresses = [\"127.0.0.1:4150\"]".to_owned(),
        ]);
        for (key, value) in settings {
            let (section, name) = key.split_once('.').unwrap();
            sections
                .entry(section)
                .or_default()
                .push(format!("{name} = {value}"));
        }
        sections
            .iter()
            .map(|(section, lines)| format!("[{section}]\n{}\n", lines.join("\n")))
            .collect()
    }

    /// Every name a setting refers to by a string (`conflicts`, `replaces`, `sets`, and the
    /// kind key of `only`) is a setting: a misspelt one would silently do nothing.
    #[test]
    fn every_setting_a_setting_names_exists() {
        let mut unknown = Vec::new();
        for section in SECTIONS {
            let named = |name: &str| section.iter().any(|setting| setting.name == name);
            for setting in section.iter() {
                let names = setting.conflicts.iter().chain(setting.replaces);
                let names = names.chain(setting.sets.as_ref().map(|(name, _)| name));
                for name in names.filter(|name| !named(name)) {
                    unknown.push(format!("{} names `{name}`", setting.key));
                }
                let kind = setting.only.map(|only| only.kind);
                let known = |key: &str| SECTIONS.iter().copied().flatten().any(|s| s.key == key);
                if let Some(kind) = kind.filter(|kind| !known(kind)) {
                    unknown.push(format!("{} is used only with `{kind}`", setting.key));
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "settings that do not exist: {unknown:?}"
        );
    }

    /// Each setting's default, laid through the config file, gives the same settings as leaving
    /// it out: the table's default is the one the validation falls back to.
    #[test]
    fn every_default_laid_through_the_file_changes_nothing() {
        let mut checked = 0;
        for setting in SECTIONS.iter().copied().flatten() {
            let Some(default) = setting.default else {
                continue;
            };
            let needs: Vec<(&str, String)> = needs(setting)
                .into_iter()
                .map(|(key, value)| match value {
                    "true" => (key, value.to_owned()),
                    _ if value.starts_with(['"', '[']) => (key, value.to_owned()),
                    _ => (key, format!("{value:?}")),
                })
                .collect();
            let without = file(&needs);
            let mut laid = needs.clone();
            laid.push((setting.key, default.to_toml().to_string()));
            let with = file(&laid);
            let expected = Settings::from_toml(&without)
                .unwrap_or_else(|error| panic!("{}: {error}\n{without}", setting.key));
            let got = Settings::from_toml(&with)
                .unwrap_or_else(|error| panic!("{}: {error}\n{with}", setting.key));
            assert_eq!(
                format!("{got:?}"),
                format!("{expected:?}"),
                "`{} = {}`, the table's default, is not what leaving it out gives",
                setting.key,
                default.to_toml()
            );
            checked += 1;
        }
        assert!(checked >= 40, "only {checked} defaults");
    }

    /// The help shows each default from the table: where the doc says `{default}`, or after
    /// the name it picks (`requeue it (default)`); a help never writes a value as its default
    /// by hand, where it could drift from the table.
    #[test]
    fn every_help_shows_its_default_from_the_table() {
        for setting in SECTIONS.iter().copied().flatten() {
            let doc = setting.help.join(" ");
            let marked = doc.matches("{default}").count();
            match setting.default {
                Some(default) => assert!(
                    marked == 1
                        || (marked == 0
                            && doc
                                .find("(default)")
                                .is_some_and(|at| { doc[..at].contains(&default.to_string()) })),
                    "{}: the help does not show its default {default}: {doc}",
                    setting.key
                ),
                None => {
                    let by_hand = doc.match_indices("(default ").any(|(at, text)| {
                        doc[at + text.len()..].starts_with(|c: char| c.is_ascii_digit())
                    });
                    assert!(
                        marked == 0 && !by_hand,
                        "{}: a default written in the help, not in the table: {doc}",
                        setting.key
                    );
                }
            }
        }
    }

    #[test]
    fn an_unknown_key_lists_the_sections_keys_in_the_files_order() {
        let error = Settings::from_toml("[store]\nbukets = 5\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(
                "unknown field `bukets`, expected one of `kind`, `buckets`, `memory`, `ways`, \
                 `probability`, `rate`, `max_memory`, `window`, `memcached_addresses`, \
                 `namespace`"
            ),
            "{error}"
        );
        let error = Settings::from_toml("[dedupe]\nmax_ages = \"1m\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`on_store_error`, `store_error_requeue_delay`, `max_age`"),
            "{error}"
        );
    }
}
