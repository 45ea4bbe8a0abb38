//! A config file's TOML error as it may be printed.
//!
//! The TOML parser's own message quotes the line at fault, and a line may hold a secret: an
//! AUTH secret, a Redis password, an HTTP header, or a URL (user info and query values; see
//! [`crate::redact`]). Nor is the line it quotes always the one its place names: an array left
//! open at the end of the file is reported one past the end, and quoted from its opening line.
//! So no line is ever quoted. An error is told by its place (line, column and, when that line
//! sets a key, the key), and the parser's reason, whose hints (`expected `]``) are kept and
//! whose quoted values are replaced by [`REDACTED`](crate::redact::REDACTED) where the line may
//! hold a secret.

use crate::redact::REDACTED;

/// Words in the keys whose values are secrets (`auth_secret`, `redis_password`, `headers`), and
/// in misspellings of them.
const SECRET_WORDS: [&str; 4] = ["secret", "password", "header", "token"];

/// The parser's error on `text`: its place and reason, without any line of `text`, and without
/// the values it would quote when that line may hold a secret.
pub(super) fn describe(text: &str, error: &toml::de::Error) -> String {
    let reason = error
        .message()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(span) = error.span() else {
        // Without a place nothing tells the value's key: mask whatever the reason quotes.
        return format!("TOML parse error: {}", mask_values(&reason));
    };
    let place = Place::of(text, span.start);
    let line = &text[place.line_start..place.line_end];
    let before = &text[..place.line_start];
    let reason = if may_hold_secret(before, line) {
        mask_values(&reason)
    } else {
        reason
    };
    let key = match key_path(before, line) {
        Some(key) => format!(" (`{key}`)"),
        None => String::new(),
    };
    let place = format!(
        "TOML parse error at line {}, column {}{key}",
        place.line, place.column
    );
    if reason.is_empty() {
        place
    } else {
        format!("{place}: {reason}")
    }
}

/// Where an error is, numbered as the TOML parser numbers it.
struct Place {
    /// 1-based.
    line: usize,
    /// 1-based, in characters; one past the end of the line for an error at the end of the
    /// file.
    column: usize,
    /// The byte range of the line, without its newline.
    line_start: usize,
    line_end: usize,
}

impl Place {
    /// The place of byte `at` of `text`. As the parser does, an error at the end of the file
    /// (an array or a string left open) is placed on the last line, past its last character,
    /// not on the empty line after the final newline: that last line is what it is about.
    fn of(text: &str, at: usize) -> Place {
        let mut index = at.min(text.len().saturating_sub(1));
        while !text.is_char_boundary(index) {
            index -= 1;
        }
        let past_end = at.saturating_sub(index);
        let line_start = text[..index].rfind('\n').map_or(0, |nl| nl + 1);
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |nl| line_start + nl);
        Place {
            line: text[..line_start].matches('\n').count() + 1,
            column: text[line_start..index].chars().count() + 1 + past_end,
            line_start,
            line_end,
        }
    }
}

/// The key `line` sets, with its table's name (`store.redis_urls`), when both are plain names;
/// `None` for any other line (a table header, a value continuing an array). Only names are
/// taken, so no part of a value can be read as one.
fn key_path(before: &str, line: &str) -> Option<String> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    if !is_name(key) {
        return None;
    }
    match table_of(before) {
        Some(table) => Some(format!("{table}.{key}")),
        None => Some(key.to_owned()),
    }
}

/// The name of the last table header (`[sink.headers]`, `[[x]]`) in `before`, if it is a
/// plain name.
fn table_of(before: &str) -> Option<&str> {
    let header = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))?;
    let name = header.trim_matches(['[', ']']).trim();
    is_name(name).then_some(name)
}

/// Whether `text` is a bare TOML key, or several joined by dots.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Whether `line`, which follows `before`, sets a secret-bearing key, lies in a headers table,
/// or holds a URL.
fn may_hold_secret(before: &str, line: &str) -> bool {
    let key = line
        .split('=')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_matches(['"', '\''])
        .rsplit('.')
        .next()
        .unwrap_or_default();
    let table = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .unwrap_or_default()
        .trim_matches(['[', ']']);
    let key = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|word| key.contains(word))
        || table.ends_with("headers")
        || line.contains("://")
}

/// `reason` with each `"…"` and `` `…` `` span before its hint replaced by a redacted one,
/// unless it is about keys (an unknown, missing or repeated key), which are names, not values.
/// The hint, from the first `expected` outside quotes on, names what the parser or the setting
/// wanted (`expected `]``, `expected a string`), never what the file holds, and is kept.
fn mask_values(reason: &str) -> String {
    let about_keys = ["unknown field", "missing field", "duplicate key"];
    if about_keys.iter().any(|start| reason.starts_with(start)) {
        return reason.to_owned();
    }
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    loop {
        let quote = rest.find(['"', '`']);
        let hint = rest.find("expected");
        match (quote, hint) {
            (_, Some(hint)) if quote.is_none_or(|quote| hint < quote) => break,
            (Some(open), _) => {
                let quote = rest[open..].chars().next().unwrap_or('"');
                let Some(len) = closing(&rest[open + 1..], quote) else {
                    // Never closed: everything after the quote may be the value.
                    out.push_str(&rest[..=open]);
                    out.push_str(REDACTED);
                    return out;
                };
                out.push_str(&rest[..=open]);
                out.push_str(REDACTED);
                out.push(quote);
                rest = &rest[open + 1 + len + 1..];
            }
            (None, _) => break,
        }
    }
    out.push_str(rest);
    out
}

/// The byte offset of the `quote` that closes a span starting at `text`; a backslash escapes
/// the character after it inside `"…"` (as a string value is printed with its escapes).
fn closing(text: &str, quote: char) -> Option<usize> {
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quote == '"' => escaped = true,
            c if c == quote => return Some(at),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{describe, mask_values};
    use crate::config::RawConfig;

    fn error_of(text: &str) -> String {
        match RawConfig::from_toml(text, "nsq-dedupe.toml") {
            Ok(_) => panic!("{text:?} parsed"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn lines_that_may_hold_a_secret_are_told_by_place_and_reason_only() {
        for (text, line) in [
            ("[consumer_opt]\nauth_secret = \"hunter2-secret\n", 2),
            ("[consumer_opt]\nauth_secret = [\"hunter2-secret\"]\n", 2),
            (
                "[store]\nredis_urls = \"redis://u:hunter2-secret@h:6379\"\n",
                2,
            ),
            (
                "[sink]\nkind = \"http\"\nheaders = { X-Token = 5, Y = \"hunter2-secret\" }\n",
                3,
            ),
            ("[sink.headers]\nX-Token = [\"hunter2-secret\"]\n", 2),
            ("[sink]\npost = 5 # http://u:hunter2-secret@h\n", 2),
            ("[store]\nredis_urls = [\"redis://:hunter2@h:6379\"\n", 2),
            ("[store]\nredis_urls = [\"redis://:hunter2@h:6379\"", 2),
            ("[sink]\npost = [\"http://u:hunter2@h/\"\n\n[metrics]\n", 4),
            ("[consumer_opt]\nauth_secret = [\"hunter2\"\n", 2),
            (
                "[sink]\npost = [\n  \"http://h/?token=hunter2\",\n  5,\n]\n",
                2,
            ),
        ] {
            let error = error_of(text);
            assert!(!error.contains("hunter2"), "{text:?}: {error}");
            assert!(
                error.contains(&format!("at line {line}, column ")),
                "{text:?}: {error}"
            );
        }
    }

    #[test]
    fn an_open_array_keeps_the_parsers_hint_and_its_place() {
        let text = "[store]\nredis_urls = [\"redis://:hunter2@h:6379\"\n";
        assert_eq!(
            error_of(text),
            "invalid config file nsq-dedupe.toml: TOML parse error at line 2, column 41 \
             (`store.redis_urls`): invalid array, expected `]`"
        );
    }

    #[test]
    fn no_line_is_quoted_but_other_values_are_kept() {
        let text = "[sink]\nkind = \"carrier-pigeon\"\n";
        let error = error_of(text);
        assert!(!error.contains("kind = "), "{error}");
        assert!(
            error.contains("at line 2, column 8 (`sink.kind`)"),
            "{error}"
        );
        assert!(
            error.contains("unknown variant `carrier-pigeon`"),
            "{error}"
        );
        let parsed = toml::from_str::<toml::Value>("a = ").unwrap_err();
        // The parser gives no reason for a value left out: the place is all there is.
        assert_eq!(
            describe("a = ", &parsed),
            "TOML parse error at line 1, column 5 (`a`)"
        );
    }

    #[test]
    fn a_masked_reason_keeps_what_was_expected_and_the_names_of_keys() {
        let error = error_of("[consumer_opt]\nauth_secret = 5\n");
        assert!(error.contains("expected a string"), "{error}");
        let error = error_of("[consumer_opt]\nauth_secrets = \"hunter2\"\n");
        assert!(error.contains("unknown field `auth_secrets`"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn values_are_masked_up_to_the_hint_whatever_they_hold() {
        assert_eq!(
            mask_values(r#"invalid type: string "a \"expected\" b", expected a sequence"#),
            r#"invalid type: string "<redacted>", expected a sequence"#
        );
        assert_eq!(
            mask_values("invalid array, expected `]`"),
            "invalid array, expected `]`"
        );
        assert_eq!(mask_values("bad `hunter2"), "bad `<redacted>");
    }
}
