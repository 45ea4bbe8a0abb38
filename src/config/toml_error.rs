//! A config file's TOML error as it may be printed.
//!
//! The TOML parser's message quotes the line at fault and, for a value of the wrong type, the
//! value itself. That helps everywhere but on a line that may hold a secret: an AUTH secret, a
//! Redis password, an HTTP header, or a URL (user info and query values; see
//! [`crate::redact`]). Those lines are told by their place and the parser's reason, with every
//! quoted value in the reason replaced by [`REDACTED`](crate::redact::REDACTED).

use crate::redact::REDACTED;

/// Words in the keys whose values are secrets (`auth_secret`, `redis_password`, `headers`), and
/// in misspellings of them.
const SECRET_WORDS: [&str; 4] = ["secret", "password", "header", "token"];

/// The parser's error on `text`, without the line or values it would quote when that line may
/// hold a secret.
pub(super) fn describe(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else {
        return error.to_string();
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |at| at + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |at| start + at);
    let line = &text[line_start..line_end];
    if !may_hold_secret(&text[..line_start], line) {
        return error.to_string();
    }
    let line_number = text[..line_start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    format!(
        "TOML parse error at line {line_number}, column {column} (line not shown: it may hold a \
         secret): {}",
        mask_quoted(error.message().trim_end())
    )
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

/// `message` with each `"…"` and `` `…` `` span replaced by a redacted one, unless it is about
/// keys (an unknown, missing or repeated key), which are names, not values.
fn mask_quoted(message: &str) -> String {
    let about_keys = ["unknown field", "missing field", "duplicate key"];
    if about_keys.iter().any(|start| message.starts_with(start)) {
        return message.to_owned();
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        let Some(len) = rest[open + 1..].find(quote) else {
            break;
        };
        out.push_str(&rest[..=open]);
        out.push_str(REDACTED);
        out.push(quote);
        rest = &rest[open + 1 + len + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::describe;
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
    fn other_lines_keep_the_parsers_full_message() {
        let text = "[sink]\nkind = \"carrier-pigeon\"\n";
        let error = error_of(text);
        assert!(error.contains("kind = \"carrier-pigeon\""), "{error}");
        assert!(
            error.contains("unknown variant `carrier-pigeon`"),
            "{error}"
        );
        let parsed = toml::from_str::<toml::Value>("a = ").unwrap_err();
        assert_eq!(describe("a = ", &parsed), parsed.to_string());
    }

    #[test]
    fn a_masked_reason_keeps_what_was_expected_and_the_names_of_keys() {
        let error = error_of("[consumer_opt]\nauth_secret = 5\n");
        assert!(error.contains("expected a string"), "{error}");
        let error = error_of("[consumer_opt]\nauth_secrets = \"hunter2\"\n");
        assert!(error.contains("unknown field `auth_secrets`"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }
}
