//! Messages that name settings as fields, not as text: a [`Wording`] is text and [`Named`]
//! settings, and each setting is said as the user gave it, by its flag (`--post`), its
//! environment variable (`NSQ_DEDUPE_POST`) or its file key (`sink.post`).
//!
//! A validator words its reason with keys alone; [`Wording::naming`] then records, from the
//! [`FlagOrigins`], which flag or variable gave each setting, and the message is written from
//! those fields when it is shown.

use std::fmt;

use super::FlagOrigins;

/// One setting a message names, perhaps with a value: `` `sink.kind = "http"` ``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The key, as `section.name`.
    pub key: &'static str,
    /// The value as the file writes it (`"http"`, `true`, `6`), if the message gives one.
    pub value: Option<String>,
    /// The flag or environment variable the user gives the setting by, if not by its key.
    pub given_as: Option<&'static str>,
}

impl Named {
    /// The setting `key`, named by its key until [`Named::naming`] says otherwise.
    pub fn key(key: &'static str) -> Named {
        Named {
            key,
            value: None,
            given_as: None,
        }
    }

    /// The setting `key` set to `value`, written as the file writes it (`"http"`, `6`).
    pub fn set(key: &'static str, value: impl Into<String>) -> Named {
        Named {
            value: Some(value.into()),
            ..Named::key(key)
        }
    }

    /// Named as the user gives it: by the flag or variable that set it, or, with no config
    /// file, by the flag that sets it.
    pub fn naming(self, names: &FlagOrigins) -> Named {
        Named {
            given_as: names.naming(self.key),
            ..self
        }
    }
}

impl fmt::Display for Named {
    /// `` `sink.kind = "http"` `` by the key; `` `--sink http` `` by a flag,
    /// `` `NSQ_DEDUPE_SINK=http` `` by a variable and `` `--consumer-opt deflate_level,6` `` by
    /// a flag that carries the option's name; a switch set `true` by the flag alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.as_deref();
        match (self.given_as, value) {
            (None, None) => write!(f, "`{}`", self.key),
            (None, Some(value)) => write!(f, "`{} = {value}`", self.key),
            (Some(name), None | Some("true")) => write!(f, "`{name}`"),
            (Some(name), Some(value)) => {
                let value = value.trim_matches('"');
                if name.contains([' ', '=']) {
                    write!(f, "`{name},{value}`")
                } else if name.starts_with("--") {
                    write!(f, "`{name} {value}`")
                } else {
                    write!(f, "`{name}={value}`")
                }
            }
        }
    }
}

/// A piece of a [`Wording`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Setting(Named),
}

/// A message, or part of one, that names settings: text and [`Named`] settings in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wording(Vec<Part>);

impl Wording {
    /// `self`, then `text`.
    #[must_use]
    pub fn text(mut self, text: impl Into<String>) -> Wording {
        self.0.push(Part::Text(text.into()));
        self
    }

    /// `self`, then the setting `key`.
    #[must_use]
    pub fn key(self, key: &'static str) -> Wording {
        self.setting(Named::key(key))
    }

    /// `self`, then the setting `key` set to `value` (as the file writes it).
    #[must_use]
    pub fn set(self, key: &'static str, value: impl Into<String>) -> Wording {
        self.setting(Named::set(key, value))
    }

    /// `self`, then `setting`.
    #[must_use]
    pub fn setting(mut self, setting: Named) -> Wording {
        self.0.push(Part::Setting(setting));
        self
    }

    /// Each setting named as the user gives it (see [`Named::naming`]).
    #[must_use]
    pub fn naming(self, names: &FlagOrigins) -> Wording {
        Wording(
            self.0
                .into_iter()
                .map(|part| match part {
                    Part::Setting(named) => Part::Setting(named.naming(names)),
                    text => text,
                })
                .collect(),
        )
    }

    /// The settings named, in order.
    pub fn settings(&self) -> impl Iterator<Item = &Named> {
        self.0.iter().filter_map(|part| match part {
            Part::Setting(named) => Some(named),
            Part::Text(_) => None,
        })
    }
}

/// A wording that names no setting.
impl From<String> for Wording {
    fn from(text: String) -> Wording {
        Wording::default().text(text)
    }
}

/// A wording that names no setting.
impl From<&str> for Wording {
    fn from(text: &str) -> Wording {
        Wording::default().text(text)
    }
}

impl fmt::Display for Wording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|part| match part {
            Part::Text(text) => f.write_str(text),
            Part::Setting(named) => named.fmt(f),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_as_the_user_gave_them() {
        let mut names = FlagOrigins::default();
        for (key, flag, given) in [
            ("source.backoff", "--backoff", true),
            ("store.kind", "--store", false),
            (
                "consumer_opt.deflate_level",
                "--consumer-opt deflate_level",
                true,
            ),
        ] {
            names.record(key, flag, given);
        }
        let wording = Wording::default()
            .key("source.backoff")
            .text(", ")
            .set("store.kind", "\"memcached\"")
            .text(", ")
            .set("consumer_opt.deflate_level", "6")
            .text(", ")
            .key("dedupe.key");
        assert_eq!(
            wording.naming(&names).to_string(),
            "`--backoff`, `--store memcached`, `--consumer-opt deflate_level,6`, `dedupe.key`"
        );
        // A flag's value from its environment variable is named by the variable.
        names.record("sink.kind", "--sink", true);
        names.record_variable("sink.kind", "NSQ_DEDUPE_SINK");
        names.record("sink.gzip", "--gzip", true);
        let wording = Wording::from("set ")
            .set("sink.kind", "\"http\"")
            .text(" or ")
            .set("sink.gzip", "true");
        assert_eq!(
            wording.clone().naming(&names).to_string(),
            "set `NSQ_DEDUPE_SINK=http` or `--gzip`"
        );
        // With a config file, a setting no flag gave keeps its key.
        names.with_file();
        let wording = Wording::default()
            .set("store.kind", "\"redis\"")
            .text(", ")
            .key("source.backoff");
        assert_eq!(
            wording.naming(&names).to_string(),
            "`store.kind = \"redis\"`, `--backoff`"
        );
    }
}
