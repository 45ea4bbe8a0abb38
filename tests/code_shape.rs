//! The source's shape, kept readable: no function under src/ longer than `MAX_FN_LINES` and no
//! file longer than `MAX_FILE_LINES` before its unit tests, except the few in `ALLOWED`, each
//! with the reason it is not split yet; and no two sibling modules that use each other, except
//! those in `ALLOWED_CYCLES`.
//!
//! Lines are counted as rustfmt lays the code out: a function runs from its `fn` line to the
//! `}` at the `fn`'s indentation, and a file's unit tests start at a `#[cfg(test)]` module at
//! the top level. `#[cfg(test)]` modules inside a file are skipped too.
//!
//! A module uses another when its code (not its comments or unit tests) names a path through
//! it, `crate::sink::Handler` or `super::sink::RawSink`. Only siblings count (`serve` and
//! `sink`, `config::serve` and `config::sink`): a module and the modules inside it are one
//! room, as a sink's own module and the `Handler` trait of its parent are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be, counting its signature and closing brace.
const MAX_FN_LINES: usize = 100;

/// The longest a file may be before its unit tests.
const MAX_FILE_LINES: usize = 700;

/// What may stay over the limits for now: a file (`"src/x.rs"`) or a function in it
/// (`"src/x.rs fn name"`), and why. An entry that is no longer over its limit fails the test
/// until it is removed, so the list only shrinks.
const ALLOWED: &[(&str, &str)] = &[];

/// Sibling modules that use each other for now, as `("a::b", "a::c")` in order, and why. An
/// entry that is no longer a cycle fails the test until it is removed.
const ALLOWED_CYCLES: &[(&str, &str, &str)] = &[
    (
        "dedup::fleet",
        "dedup::shared",
        "the fleet's clock is the shared stores' clock, and their settings check its interval",
    ),
    (
        "dedup::table::line",
        "dedup::table::set",
        "the SSE2 insert of an 8-way set is the set's fast path and decides with its functions",
    ),
];

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

/// The module a file under src/ defines, as its path of names (`src/sink/mod.rs`: `["sink"]`,
/// `src/lib.rs`: none).
fn module_of(relative: &Path) -> Vec<String> {
    let mut names: Vec<String> = relative
        .iter()
        .map(|part| part.to_str().unwrap().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(
        names.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        names.pop();
    }
    names
}

/// The code of a file without its comments and its top-level unit tests.
fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .enumerate()
        .position(|(i, line)| {
            *line == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|next| is_mod(next))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .filter(|line| !line.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths, from the crate's root, that `code` of module `module` names through `crate::` or
/// `super::` (one level of braces: `super::{sink::RawSink, invalid}` gives both).
fn paths_named(module: &[String], code: &str) -> Vec<Vec<String>> {
    let is_name = |c: char| c.is_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("::") {
        let start = code[..at].rfind(|c: char| !is_name(c)).map_or(0, |i| i + 1);
        let first = &code[start..at];
        let continues_path = code[..start].ends_with("::");
        let mut base: Vec<String> = match first {
            "crate" if !continues_path => Vec::new(),
            "super" if !continues_path => module[..module.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        let mut rest = &code[at + 2..];
        if first == "super" {
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
        }
        let tails: Vec<&str> = match rest.strip_prefix('{') {
            Some(inner) => inner.split('}').next().unwrap_or("").split(',').collect(),
            None => vec![rest],
        };
        for tail in tails {
            let mut path = base.clone();
            let mut tail = tail.trim_start();
            loop {
                let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
                if end == 0 {
                    break;
                }
                path.push(tail[..end].to_owned());
                match tail[end..].strip_prefix("::") {
                    Some(next) => tail = next,
                    None => break,
                }
            }
            paths.push(path);
        }
    }
    paths
}

/// The sibling modules each module uses: `a::b` naming `a::c::x` uses `a::c`. Names that are
/// not modules (`super::invalid`, a function) are left out.
fn sibling_uses(files: &[(Vec<String>, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(module, _)| module.clone()).collect();
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in files {
        for path in paths_named(module, code) {
            let common = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
            if common == module.len() || common == path.len() {
                continue;
            }
            let (from, to) = (&module[..=common], &path[..=common]);
            if modules.contains(to) {
                uses.entry(from.join("::"))
                    .or_default()
                    .insert(to.join("::"));
            }
        }
    }
    uses
}

/// Every pair of sibling modules each of which reaches the other through the uses of their
/// siblings, in order.
fn cycles(uses: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<(String, String)> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.to_owned()];
        while let Some(module) = next.pop() {
            for used in uses.get(&module).into_iter().flatten() {
                if seen.insert(used.clone()) {
                    next.push(used.clone());
                }
            }
        }
        seen
    };
    let mut found = BTreeSet::new();
    for from in uses.keys() {
        for to in reach(from) {
            if *from < to && reach(&to).contains(from) {
                found.insert((from.clone(), to));
            }
        }
    }
    found
}

#[test]
fn no_two_sibling_modules_in_src_use_each_other_unless_allowed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let files: Vec<(Vec<String>, String)> = rust_files(&src)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (module_of(path.strip_prefix(&src).unwrap()), code_of(&text))
        })
        .collect();
    let found = cycles(&sibling_uses(&files));
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(a, b)| {
            !ALLOWED_CYCLES
                .iter()
                .any(|(x, y, _)| *x == a.as_str() && *y == b.as_str())
        })
        .map(|(a, b)| format!("  {a} and {b}"))
        .collect();
    let stale: Vec<(&str, &str)> = ALLOWED_CYCLES
        .iter()
        .filter(|(x, y, _)| !found.contains(&((*x).to_owned(), (*y).to_owned())))
        .map(|(x, y, _)| (*x, *y))
        .collect();
    assert!(
        unexpected.is_empty(),
        "sibling modules that use each other (make it one way: move the shared part to a \
         module both use, or one module inside the other):\n{}",
        unexpected.join("\n")
    );
    assert!(
        stale.is_empty(),
        "no longer a cycle, so remove from ALLOWED_CYCLES in tests/code_shape.rs: {stale:?}"
    );
}

#[test]
fn the_uses_found_are_those_between_siblings_through_crate_and_super() {
    let module = |path: &str| path.split("::").map(str::to_owned).collect::<Vec<_>>();
    let files = vec![
        (
            module("serve"),
            "use crate::sink::{Delivery, Handler};".to_owned(),
        ),
        (module("sink"), "Serve(crate::serve::ServeSink),".to_owned()),
        (
            module("sink::http"),
            "use super::Handler; use crate::sink::batcher::X;".to_owned(),
        ),
        (module("sink::batcher"), String::new()),
        (
            module("config::serve"),
            "use super::{invalid, sink::RawSink};\nuse super::super::nsq::X;".to_owned(),
        ),
        (
            module("config::sink"),
            "x = super::serve::validate(raw);".to_owned(),
        ),
        (module("config"), "use crate::sink::X;".to_owned()),
        (module("nsq"), String::new()),
    ];
    let uses = sibling_uses(&files);
    let named = |m: &str| uses.get(m).map(|s| s.iter().cloned().collect::<Vec<_>>());
    assert_eq!(named("serve"), Some(vec!["sink".to_owned()]));
    assert_eq!(named("sink::http"), Some(vec!["sink::batcher".to_owned()]));
    assert_eq!(
        named("config::serve"),
        Some(vec!["config::sink".to_owned()])
    );
    assert_eq!(
        named("config"),
        Some(vec!["nsq".to_owned(), "sink".to_owned()])
    );
    assert_eq!(
        cycles(&uses).into_iter().collect::<Vec<_>>(),
        vec![
            ("config::serve".to_owned(), "config::sink".to_owned()),
            ("serve".to_owned(), "sink".to_owned())
        ]
    );
    let comments = code_of(
        "//! crate::sink\nuse crate::nsq;\n#[cfg(test)]\nmod tests {\n    use crate::x;\n}\n",
    );
    assert_eq!(comments, "use crate::nsq;");
}
