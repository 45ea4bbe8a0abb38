//! Messages that name settings as fields, not as text: a [`Wording`] is text and [`Named`]
//! settings, and each setting is said as the user gave it, by its flag (`--post`), its
//! environment variable (`NSQ_DEDUPE_POST`) or its file key (`sink.post`).
//!
//! Whoever words a message names settings by their keys (a validator, a store refusing its
//! settings, nsqd's refusal turned into advice); where the message is shown,
//! [`FlagOrigins::show`] writes each setting as the user gave it, from which flag or variable
//! gave it (`shown.rs`). A library user who never shows them so sees the keys.
//!
//! This module depends on nothing else of the crate, so that every layer (the stores, the NSQ
//! client, the config) can word its errors with it. `flag_origins.rs` holds [`FlagOrigins`].

mod flag_origins;
mod shown;

use std::fmt;

pub use flag_origins::FlagOrigins;
pub(crate) use shown::in_effect;
pub use shown::Shown;

/// One setting a message names, perhaps with a value: `` `sink.kind = "http"` ``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The key, as `section.name`, or for a setting a message names by its flag
    /// ([`Named::flag`]), the flag.
    pub key: &'static str,
    /// The value as the file writes it (`"http"`, `true`, `6`), if the message gives one.
    pub value: Option<String>,
}

impl Named {
    /// The setting `key`, named by its key unless shown in the user's words
    /// ([`FlagOrigins::show`]).
    pub fn key(key: &'static str) -> Named {
        Named { key, value: None }
    }

    /// The setting `key` set to `value`, written as the file writes it (`"http"`, `6`).
    pub fn set(key: &'static str, value: impl Into<String>) -> Named {
        Named {
            value: Some(value.into()),
            ..Named::key(key)
        }
    }

    /// The setting whose flag is `flag`, named by that flag, or shown in the user's words by
    /// the environment variable that gave it.
    pub fn flag(flag: &'static str) -> Named {
        Named::key(flag)
    }

    /// The flag or environment variable the user gave the setting by, if the message is
    /// shown in their words: the flag or variable that set it, or, with no config file, the
    /// flag that sets it; a setting named by its flag, the variable that gave its value.
    fn given_as(&self) -> Option<&'static str> {
        in_effect(|names| {
            names
                .naming(self.key)
                .or_else(|| names.given_by_flag(self.key))
        })
    }
}

impl fmt::Display for Named {
    /// `` `sink.kind = "http"` `` by the key; `` `--sink http` `` by a flag,
    /// `` `NSQ_DEDUPE_SINK=http` `` by a variable and `` `--consumer-opt deflate_level,6` `` by
    /// a flag that carries the option's name; a switch set `true` by the flag alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.as_deref();
        match (self.given_as(), value) {
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
    /// One setting named two ways, `` `--x` (`section.x`) `` or `` `--x` / `section.x` ``,
    /// said once when both come out the same.
    Both {
        first: Named,
        second: Named,
        /// `(second)`, else `/ second`.
        brackets: bool,
    },
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

    /// `self`, then one setting named two ways: `` `first` (`second`) ``, such as
    /// `` `--topic` (`source.topic`) ``; said once if both ways come out the same.
    #[must_use]
    pub fn both(mut self, first: Named, second: Named) -> Wording {
        self.0.push(Part::Both {
            first,
            second,
            brackets: true,
        });
        self
    }

    /// `self`, then one setting named two ways: `` `first` / `second` ``; said once if both
    /// ways come out the same.
    #[must_use]
    pub fn either(mut self, first: Named, second: Named) -> Wording {
        self.0.push(Part::Both {
            first,
            second,
            brackets: false,
        });
        self
    }

    /// `self`, then `other`.
    #[must_use]
    pub fn then(mut self, other: Wording) -> Wording {
        self.0.extend(other.0);
        self
    }

    /// The settings named, in order.
    pub fn settings(&self) -> impl Iterator<Item = &Named> {
        self.0
            .iter()
            .flat_map(|part| match part {
                Part::Setting(named) => [Some(named), None],
                Part::Both { first, second, .. } => [Some(first), Some(second)],
                Part::Text(_) => [None, None],
            })
            .flatten()
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
            Part::Both {
                first,
                second,
                brackets,
            } => {
                let (first, second) = (first.to_string(), second.to_string());
                match (first == second, brackets) {
                    (true, _) => f.write_str(&first),
                    (false, true) => write!(f, "{first} ({second})"),
                    (false, false) => write!(f, "{first} / {second}"),
                }
            }
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
            names.show(&wording).to_string(),
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
            names.show(&wording.clone()).to_string(),
            "set `NSQ_DEDUPE_SINK=http` or `--gzip`"
        );
        // A flag typed by its alias is named by the alias, by its key and by its flag.
        names.record("sink.http_concurrency", "--http-concurrency", true);
        names.record_alias("sink.http_concurrency", "--n");
        let wording = Wording::from("set ")
            .set("sink.http_concurrency", "0")
            .text(" or ")
            .setting(Named::flag("--http-concurrency"));
        assert_eq!(names.show(&wording).to_string(), "set `--n 0` or `--n`");
        // With a config file, a setting no flag gave keeps its key.
        names.with_file();
        let wording = Wording::default()
            .set("store.kind", "\"redis\"")
            .text(", ")
            .key("source.backoff");
        assert_eq!(
            names.show(&wording).to_string(),
            "`store.kind = \"redis\"`, `--backoff`"
        );
    }

    #[test]
    fn a_setting_named_two_ways_is_said_once_when_both_come_out_the_same() {
        let msg_timeout = || {
            Wording::from("set ")
                .both(
                    Named::flag("--msg-timeout"),
                    Named::key("source.msg_timeout"),
                )
                .text(", ")
                .set("sink.kind", "\"http\"")
                .text(", ")
                .setting(Named::flag("--sink"))
        };
        // A library user, who names nothing, sees both ways.
        assert_eq!(
            msg_timeout().to_string(),
            "set `--msg-timeout` (`source.msg_timeout`), `sink.kind = \"http\"`, `--sink`"
        );
        let mut names = FlagOrigins::default();
        names.record("source.msg_timeout", "--msg-timeout", false);
        names.record("sink.kind", "--sink", false);
        names.record("store.kind", "--store", false);
        // Without a config file, every setting is its flag.
        assert_eq!(
            names.show(&msg_timeout()).to_string(),
            "set `--msg-timeout`, `--sink http`, `--sink`"
        );
        // A flag's value from its environment variable is named by the variable, as a key
        // and as a flag.
        names.record("source.msg_timeout", "--msg-timeout", true);
        names.record_variable("source.msg_timeout", "NSQ_DEDUPE_MSG_TIMEOUT");
        names.record("sink.kind", "--sink", true);
        names.record_variable("sink.kind", "NSQ_DEDUPE_SINK");
        assert_eq!(
            names.show(&msg_timeout()).to_string(),
            "set `NSQ_DEDUPE_MSG_TIMEOUT`, `NSQ_DEDUPE_SINK=http`, `NSQ_DEDUPE_SINK`"
        );
        // With a config file, a setting no flag gave keeps its key beside its flag.
        names.with_file();
        let store = Wording::default()
            .either(Named::key("store.kind"), Named::flag("--store"))
            .text(", ")
            .both(Named::flag("--store"), Named::key("store.kind"));
        assert_eq!(
            names.show(&store).to_string(),
            "`store.kind` / `--store`, `--store` (`store.kind`)"
        );
    }
}
