//! docs/design.md's "Layout" section names every file: each file under src/, tests/support/
//! and bench/, and each top-level file and directory. A file added without its line there
//! fails here, naming the file, so the list a reader finds a file's purpose in stays whole.
//!
//! The section is one `text` block of entries: a path at the start of a line (a file, or a
//! directory ending in `/`), then what it holds, on that line and the indented lines below.
//! A file is named by an entry of its own path, or by its path relative to the nearest
//! directory entry above it, written in that entry's text (`set.rs` under `src/dedup/table/`,
//! `run/section.rs` under `src/cli/`).

use std::path::{Path, PathBuf};

/// The directories whose every file the layout names.
const LISTED_DIRS: &[&str] = &["src", "tests/support", "bench"];

/// One entry of the layout: its path and the text that describes it.
#[derive(Debug)]
struct Entry {
    path: String,
    text: String,
}

/// The entries of the "Layout" section's `text` block.
fn entries(design: &str) -> Vec<Entry> {
    let section = design
        .split("\n## Layout\n")
        .nth(1)
        .expect("docs/design.md has a \"## Layout\" section");
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the Layout section has a ```text block");
    let mut entries: Vec<Entry> = Vec::new();
    for line in block.lines() {
        match (line.starts_with(' '), entries.last_mut()) {
            (true, Some(entry)) => {
                entry.text.push('\n');
                entry.text.push_str(line);
            }
            _ => {
                let (path, text) = line.split_once(' ').unwrap_or((line, ""));
                entries.push(Entry {
                    path: path.to_owned(),
                    text: text.to_owned(),
                });
            }
        }
    }
    entries
}

/// Whether `text` holds `name` as a whole path: not as part of a longer name or path (a
/// full stop may follow it, ending a sentence).
fn mentions(text: &str, name: &str) -> bool {
    let in_name = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '/');
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let mut after = text[at + name.len()..].chars();
        let continues = match after.next() {
            Some('.') => after.next().is_some_and(in_name),
            next => next.is_some_and(in_name),
        };
        !before.is_some_and(|c| in_name(c) || c == '.') && !continues
    })
}

/// Whether the layout names `file` (a path from the repository's root).
fn names(entries: &[Entry], file: &str) -> bool {
    if entries.iter().any(|entry| entry.path == file) {
        return true;
    }
    let nearest = entries
        .iter()
        .filter(|entry| entry.path.ends_with('/') && file.starts_with(&entry.path))
        .max_by_key(|entry| entry.path.len());
    nearest.is_some_and(|entry| mentions(&entry.text, &file[entry.path.len()..]))
}

/// Every file under `dir`, as paths from `root`, sorted.
fn files_under(root: &Path, dir: &Path) -> Vec<String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(files_under(root, &path));
        } else {
            let relative = path.strip_prefix(root).unwrap();
            files.push(relative.to_str().unwrap().replace('\\', "/"));
        }
    }
    files
}

#[test]
fn the_layout_names_every_source_file_and_every_top_level_entry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let entries = entries(&design);
    let mut missing: Vec<String> = LISTED_DIRS
        .iter()
        .flat_map(|dir| files_under(root, &root.join(dir)))
        .filter(|file| !names(&entries, file))
        .collect();
    let mut top: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|entry| entry.unwrap())
        // Hidden entries (git's, CI's) and the build's output are not the project's layout.
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_str().unwrap();
            !name.starts_with('.') && name != "target"
        })
        .map(|entry| {
            let name = entry.file_name().into_string().unwrap();
            if entry.path().is_dir() {
                format!("{name}/")
            } else {
                name
            }
        })
        .collect();
    top.sort();
    missing.extend(top.into_iter().filter(|name| {
        !entries.iter().any(|entry| {
            entry.path == *name || (name.ends_with('/') && entry.path.starts_with(name.as_str()))
        })
    }));
    assert!(
        missing.is_empty(),
        "docs/design.md's Layout section does not name these; add each with what it is for:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn a_file_is_named_by_its_path_from_the_nearest_directory_entry() {
    let design = "# Design\n\n## Layout\n\n```text\nbuild.rs    the commit\nsrc/cli/    \
                  flags: mod.rs; run's (run/section.rs)\nsrc/dedup/table/  set.rs, not \
                  subset.rs\n                  nor line.rs.bak\n```\n";
    let entries = entries(design);
    assert!(names(&entries, "build.rs"));
    assert!(names(&entries, "src/cli/mod.rs"));
    assert!(names(&entries, "src/cli/run/section.rs"));
    assert!(names(&entries, "src/dedup/table/set.rs"));
    // Named only as part of another name, or under another directory.
    assert!(!names(&entries, "src/cli/section.rs"));
    assert!(!names(&entries, "src/dedup/table/line.rs"));
    assert!(!names(&entries, "src/dedup/table/mod.rs"));
    assert!(!names(&entries, "src/lib.rs"));
}
