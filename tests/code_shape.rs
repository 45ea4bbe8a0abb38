//! The source's shape, kept readable: no function under src/ longer than `MAX_FN_LINES` and no
//! file longer than `MAX_FILE_LINES` before its unit tests, except the few in `ALLOWED`, each
//! with the reason it is not split yet.
//!
//! Lines are counted as rustfmt lays the code out: a function runs from its `fn` line to the
//! `}` at the `fn`'s indentation, and a file's unit tests start at a `#[cfg(test)]` module at
//! the top level. `#[cfg(test)]` modules inside a file are skipped too.

use std::path::{Path, PathBuf};

/// The longest a function may be, counting its signature and closing brace.
const MAX_FN_LINES: usize = 100;

/// The longest a file may be before its unit tests.
const MAX_FILE_LINES: usize = 700;

/// What may stay over the limits for now: a file (`"src/x.rs"`) or a function in it
/// (`"src/x.rs fn name"`), and why. An entry that is no longer over its limit fails the test
/// until it is removed, so the list only shrinks.
const ALLOWED: &[(&str, &str)] = &[];

/// A stretch of source over its limit: a whole file (`name` is `None`) or one function.
#[derive(Debug, PartialEq)]
struct Over {
    name: Option<String>,
    /// The first line (from 1).
    line: usize,
    lines: usize,
}

/// The files and functions of one file's text that are over the limits.
fn over_limits(text: &str) -> Vec<Over> {
    let lines: Vec<&str> = text.lines().collect();
    let body = lines
        .iter()
        .enumerate()
        .position(|(i, line)| {
            *line == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|next| is_mod(next))
        })
        .unwrap_or(lines.len());
    let mut over = Vec::new();
    if body > MAX_FILE_LINES {
        over.push(Over {
            name: None,
            line: 1,
            lines: body,
        });
    }
    let mut i = 0;
    while i < body {
        let line = lines[i];
        if line.trim() == "#[cfg(test)]" && i + 1 < body && is_mod(lines[i + 1]) {
            i = closing(&lines[..body], i + 1, indent(lines[i + 1])).unwrap_or(body) + 1;
            continue;
        }
        if let Some(name) = fn_name(line) {
            if let Some(end) = fn_end(&lines[..body], i) {
                let length = end - i + 1;
                if length > MAX_FN_LINES {
                    over.push(Over {
                        name: Some(name.to_owned()),
                        line: i + 1,
                        lines: length,
                    });
                }
            }
        }
        i += 1;
    }
    over
}

/// Whether a line opens a module (`mod tests {` or `mod tests;`).
fn is_mod(line: &str) -> bool {
    let rest = line.trim_start();
    let rest = rest
        .strip_prefix("pub(crate) ")
        .or_else(|| rest.strip_prefix("pub "))
        .unwrap_or(rest);
    rest.starts_with("mod ")
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The index of the first line after `from` that is `}` at `indent`.
fn closing(lines: &[&str], from: usize, indent: &str) -> Option<usize> {
    (from + 1..lines.len()).find(|&k| lines[k].strip_prefix(indent) == Some("}"))
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.peek() {
        let qualifier = word.starts_with("pub")
            || matches!(
                *word,
                "const" | "async" | "unsafe" | "default" | "extern" | "\"C\""
            );
        if !qualifier {
            break;
        }
        words.next();
    }
    if words.next() != Some("fn") {
        return None;
    }
    let rest = words.next()?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The index of the line that closes the function declared at `start`, or `None` for a
/// declaration without a body.
fn fn_end(lines: &[&str], start: usize) -> Option<usize> {
    let header_end = (start..lines.len()).find(|&k| {
        let line = lines[k].trim_end();
        line.ends_with('{') || line.ends_with(';') || line.ends_with('}')
    })?;
    let header = lines[header_end].trim_end();
    if header.ends_with(';') {
        return None;
    }
    if header.ends_with('}') {
        return Some(header_end);
    }
    closing(lines, header_end, indent(lines[start]))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn no_function_or_file_in_src_is_over_its_limit_unless_allowed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for path in rust_files(&root.join("src")) {
        let text = std::fs::read_to_string(&path).unwrap();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_str()
            .unwrap()
            .replace('\\', "/");
        for over in over_limits(&text) {
            let (key, limit) = match &over.name {
                Some(name) => (format!("{relative} fn {name}"), MAX_FN_LINES),
                None => (relative.clone(), MAX_FILE_LINES),
            };
            found.push((
                key,
                format!(
                    "{}:{}: {} lines (limit {limit})",
                    relative, over.line, over.lines
                ),
            ));
        }
    }
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(key, _)| !ALLOWED.iter().any(|(allowed, _)| allowed == key))
        .map(|(key, at)| format!("  {key} at {at}"))
        .collect();
    let stale: Vec<&str> = ALLOWED
        .iter()
        .filter(|(allowed, _)| !found.iter().any(|(key, _)| key == allowed))
        .map(|(allowed, _)| *allowed)
        .collect();
    assert!(
        unexpected.is_empty(),
        "over the limit (split it into named steps, or by responsibility for a file):\n{}",
        unexpected.join("\n")
    );
    assert!(
        stale.is_empty(),
        "within the limits now, so remove from ALLOWED in tests/code_shape.rs: {stale:?}"
    );
}

/// A function of `body_lines` lines between its signature and its closing brace.
fn function(indent: &str, name: &str, body_lines: usize) -> String {
    let mut text =
        format!("{indent}pub(crate) async fn {name}(\n{indent}    x: u8,\n{indent}) -> u8 {{\n");
    for _ in 0..body_lines {
        text.push_str(&format!("{indent}    let _ = x;\n"));
    }
    text.push_str(&format!("{indent}}}\n"));
    text
}

#[test]
fn the_count_finds_a_long_function_and_skips_declarations_and_unit_tests() {
    // 96 body lines + signature (3) + closing brace = 100: at the limit, not over it.
    let at_limit = function("", "fits", 96);
    let over = function("    ", "grew", 97);
    let declaration = "trait T {\n    fn declared(&self) -> u8;\n    fn short(&self) {}\n}\n";
    let unit_tests = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n",
        function("    ", "test_helper", 200)
    );
    let text = format!("impl S {{\n{over}}}\n{at_limit}{declaration}{unit_tests}");
    assert_eq!(
        over_limits(&text),
        vec![Over {
            name: Some("grew".to_owned()),
            line: 2,
            lines: 101
        }]
    );

    let long_file = "// a line\n".repeat(MAX_FILE_LINES + 1);
    let with_tests = format!("{long_file}#[cfg(test)]\nmod tests;\n");
    assert_eq!(
        over_limits(&with_tests),
        vec![Over {
            name: None,
            line: 1,
            lines: MAX_FILE_LINES + 1
        }]
    );
    let short = "// a line\n".repeat(MAX_FILE_LINES);
    assert_eq!(
        over_limits(&format!(
            "{short}#[cfg(test)]\nmod tests {{\n{long_file}}}\n"
        )),
        vec![]
    );
}
