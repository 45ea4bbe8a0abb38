//! Which flag (or environment variable) gave which config key, so that errors name a setting
//! as the user gave it.

use std::collections::BTreeMap;

/// Which config keys were set by which flag, so that errors name what the user typed: the
/// flag, or the environment variable the flag took its value from.
#[derive(Debug, Clone, Default)]
pub struct FlagOrigins {
    /// Keys a flag set, with that flag (or its variable).
    given: BTreeMap<&'static str, &'static str>,
    /// Every key that has a flag, with the flag.
    known: BTreeMap<&'static str, &'static str>,
    /// Whether a config file was read: without one, every setting is named by its flag.
    file: bool,
}

impl FlagOrigins {
    /// Records that `flag` sets `key` (as `section.name`); `given` when it did here.
    pub fn record(&mut self, key: &'static str, flag: &'static str, given: bool) {
        self.known.insert(key, flag);
        if given {
            self.given.insert(key, flag);
        }
    }

    /// Records that `key`, which a flag sets, was given by the flag's environment variable
    /// (such as `NSQ_DEDUPE_WAYS`), and is to be named by it.
    pub fn record_variable(&mut self, key: &'static str, variable: &'static str) {
        self.given.insert(key, variable);
    }

    /// Records that `key`'s flag was typed as `alias`, one of its other names (`--n` for
    /// `--http-concurrency`), and is to be named by it.
    pub fn record_alias(&mut self, key: &'static str, alias: &'static str) {
        self.given.insert(key, alias);
    }

    /// Records that the settings come from a config file as well as from flags.
    pub fn with_file(&mut self) {
        self.file = true;
    }

    /// The flag that set `key`, if one did.
    pub fn flag_for(&self, key: &str) -> Option<&'static str> {
        self.given.get(key).copied()
    }

    /// The flag to name `key` by: the one that set it, or with no config file the one that
    /// sets it.
    pub fn naming(&self, key: &str) -> Option<&'static str> {
        self.flag_for(key)
            .or_else(|| (!self.file).then(|| self.known.get(key).copied()).flatten())
    }

    /// The flag that sets `key`, if one does.
    pub fn flag_of(&self, key: &str) -> Option<&'static str> {
        self.known.get(key).copied()
    }

    /// How the user gave the setting whose flag is `flag`, if they did: by the flag, or by its
    /// environment variable when the value came from there.
    pub(super) fn given_by_flag(&self, flag: &str) -> Option<&'static str> {
        self.known
            .iter()
            .filter(|(_, known)| **known == flag)
            .find_map(|(key, _)| self.given.get(key).copied())
    }
}
