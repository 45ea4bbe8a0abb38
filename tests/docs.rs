//! The documentation as a reader follows it: the README is a front page, and every relative
//! link of the README and of `docs/*.md` leads to a file that exists, and to a heading of it
//! when it names one. The commands they show are run by `doc_commands`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The longest the README may grow and still read as a front page; the rest belongs in docs/.
const README_MAX_LINES: usize = 250;

/// The documentation pages: the README, then every Markdown file under docs/, with their text.
pub fn pages() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, text)
        })
        .collect()
}

/// The code blocks of a Markdown text fenced with "```" and `lang`: their contents.
pub fn code_blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let opening = format!("```{lang}\n");
    text.split(opening.as_str())
        .skip(1)
        .map(|block| block.split("```").next().unwrap())
        .collect()
}

/// The text outside fenced code blocks, line by line, each with its line number (from 1).
pub fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut in_code = false;
    text.lines()
        .enumerate()
        .filter(move |(_, line)| {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                return false;
            }
            !in_code
        })
        .map(|(index, line)| (index + 1, line))
}

/// The targets of the inline links and images of a Markdown text: `[text](target)`.
pub fn link_targets(text: &str) -> Vec<String> {
    // A link's text may wrap onto the next line, so the prose is searched as one string.
    let prose: Vec<&str> = prose_lines(text).map(|(_, line)| line).collect();
    let prose = prose.join("\n");
    prose
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &prose[at + 2..];
            rest.find(')').map(|end| rest[..end].to_string())
        })
        .collect()
}

/// The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as `-`.
fn anchors(text: &str) -> HashSet<String> {
    prose_lines(text)
        .map(|(_, line)| line)
        .filter(|line| line.starts_with('#'))
        .map(|line| {
            line.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let pages = pages();
    assert!(pages.len() >= 5, "README.md and the four pages of docs/");
    let mut broken = Vec::new();
    let mut checked = 0;
    for (page, text) in &pages {
        let dir = page.parent().unwrap();
        for target in link_targets(text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            checked += 1;
            if !linked.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let heading_text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&heading_text).contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = &pages()[0].1;
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move details to docs/"
    );
    for page in [
        "docs/guide.md",
        "docs/operations.md",
        "docs/design.md",
        "docs/benchmarks.md",
    ] {
        assert!(
            readme.contains(&format!("]({page})")),
            "the README does not link {page}"
        );
    }
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let text = "# Sizing: `nsq-dedupe size`\n## Time-bounded memory: `--max-age`\n```sh\n# not a heading\n```\n";
    let found = anchors(text);
    let expected: HashSet<String> = ["sizing-nsq-dedupe-size", "time-bounded-memory---max-age"]
        .map(String::from)
        .into();
    assert_eq!(found, expected);
}
