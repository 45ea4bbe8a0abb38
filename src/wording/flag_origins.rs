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
    pub(crate) fn naming(&self, key: &str) -> Option<&'static str> {
        self.flag_for(key)
            .or_else(|| (!self.file).then(|| self.known.get(key).copied()).flatten())
    }

    /// The flag that sets `key`, if one does.
    pub(crate) fn flag_of(&self, key: &str) -> Option<&'static str> {
        self.known.get(key).copied()
    }

    /// How the user gave the setting of `flag`: its environment variable, when the value came
    /// from there.
    pub(super) fn given_by_flag(&self, flag: &str) -> Option<&'static str> {
        self.known
            .iter()
            .filter(|(_, known)| **known == flag)
            .find_map(|(key, _)| self.given.get(key).copied())
    }

    /// `text` with each setting in backquotes named as the user gives it: `` `source.backoff` ``
    /// as `` `--backoff` `` when that flag set it (or there is no config file), as
    /// `` `NSQ_DEDUPE_BACKOFF` `` when the flag's variable did (and so is `` `--backoff` ``), and
    /// `` `store.kind = "memcached"` `` as `` `--store memcached` `` (or
    /// `` `NSQ_DEDUPE_STORE=memcached` ``).
    pub fn rename(&self, text: &str) -> String {
        let mut pieces: Vec<String> = text.split('`').map(str::to_owned).collect();
        for piece in pieces.iter_mut().skip(1).step_by(2) {
            let (key, value) = match piece.split_once(" = ") {
                Some((key, value)) => (key, Some(value.trim_matches('"'))),
                None => (piece.as_str(), None),
            };
            let Some(name) = self.naming(key).or_else(|| self.given_by_flag(key)) else {
                continue;
            };
            *piece = match value {
                None | Some("true") => name.to_owned(),
                // `--consumer-opt deflate_level,6`, `NSQ_DEDUPE_CONSUMER_OPT=deflate_level,6`
                Some(value) if name.contains([' ', '=']) => format!("{name},{value}"),
                Some(value) if name.starts_with("--") => format!("{name} {value}"),
                Some(value) => format!("{name}={value}"),
            };
        }
        // A message that names a setting both ways, "`--x` (`section.x`)" or "`--x` /
        // `section.x`", now names it twice: once is enough.
        let mut i = 1;
        while i + 3 < pieces.len() {
            let (this, between, next) = (&pieces[i], &pieces[i + 1], &pieces[i + 2]);
            let in_brackets = between == " (" && pieces[i + 3].starts_with(')');
            if this == next && (between == " / " || in_brackets) {
                if in_brackets {
                    pieces[i + 3].remove(0);
                }
                pieces.drain(i + 1..i + 3);
            } else {
                i += 2;
            }
        }
        pieces.join("`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_renamed_as_the_user_gave_them() {
        let mut names = FlagOrigins::default();
        names.record("source.backoff", "--backoff", true);
        names.record("store.kind", "--store", false);
        names.record(
            "consumer_opt.deflate_level",
            "--consumer-opt deflate_level",
            true,
        );
        let text = "`source.backoff`, `store.kind = \"memcached\"`, `--backoff` \
                    (`source.backoff`), `consumer_opt.deflate_level = 6`, `dedupe.key`";
        assert_eq!(
            names.rename(text),
            "`--backoff`, `--store memcached`, `--backoff`, `--consumer-opt deflate_level,6`, \
             `dedupe.key`"
        );
        // A flag's value from its environment variable is named by the variable, as a key
        // and as a flag.
        names.record("source.msg_timeout", "--msg-timeout", true);
        names.record_variable("source.msg_timeout", "NSQ_DEDUPE_MSG_TIMEOUT");
        names.record("sink.kind", "--sink", true);
        names.record_variable("sink.kind", "NSQ_DEDUPE_SINK");
        assert_eq!(
            names.rename(
                "set `--msg-timeout` (`source.msg_timeout`), `sink.kind = \"http\"`, `--sink`"
            ),
            "set `NSQ_DEDUPE_MSG_TIMEOUT`, `NSQ_DEDUPE_SINK=http`, `NSQ_DEDUPE_SINK`"
        );
        // With a config file, a setting no flag gave keeps its key.
        names.with_file();
        assert_eq!(
            names.rename("`store.kind` / `--store`, `source.backoff`"),
            "`store.kind` / `--store`, `--backoff`"
        );
    }
}
