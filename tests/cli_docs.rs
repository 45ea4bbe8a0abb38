//! `nsq-dedupe --version` and `nsq-dedupe manpage`: what a packager and a reader of `man` get.

use std::process::Command;

use crate::util::bin;

fn stdout(args: &[&str]) -> String {
    let out = bin()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

/// The commit of the checkout the tests run in, when they run in one with git installed.
fn checkout_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    let same = std::fs::canonicalize(top).ok()? == std::fs::canonicalize(dir).ok()?;
    if !same {
        return None;
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}

#[test]
fn version_names_the_release_and_the_commit_built_from() {
    let version = stdout(&["--version"]);
    let prefix = format!("nsq-dedupe {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = version
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("unexpected --version output {version:?}"));
    match checkout_commit() {
        Some(head) => {
            assert!(
                commit == head || commit == format!("{head}-dirty"),
                "--version names commit {commit:?}, the checkout is at {head}"
            );
        }
        None => {
            let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
            assert!(
                commit == "unknown"
                    || (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
                "--version names commit {commit:?}"
            );
        }
    }
    // Every subcommand answers --version with the same release and commit.
    let run = stdout(&["run", "--version"]);
    assert!(run.ends_with(&format!("{commit})\n")), "{run:?}");
}

#[test]
fn manpage_dir_writes_a_page_per_command_with_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let listed = stdout(&["manpage", "--dir", pages.to_str().unwrap()]);
    let mut names: Vec<String> = listed
        .lines()
        .map(|line| {
            let path = std::path::Path::new(line);
            assert_eq!(path.parent(), Some(pages.as_path()), "{line}");
            path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "nsq-dedupe-completions.1",
            "nsq-dedupe-filter.1",
            "nsq-dedupe-manpage.1",
            "nsq-dedupe-resize.1",
            "nsq-dedupe-run.1",
            "nsq-dedupe-size.1",
            "nsq-dedupe.1",
        ]
    );
    let mut written: Vec<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, names, "files in the directory");

    let footer = format!("\"nsq-dedupe {} (commit ", env!("CARGO_PKG_VERSION"));
    for sub in ["run", "size", "filter"] {
        let page = std::fs::read_to_string(pages.join(format!("nsq-dedupe-{sub}.1"))).unwrap();
        assert!(
            page.lines()
                .any(|l| l.starts_with(&format!(".TH nsq-dedupe-{sub} 1 ")) && l.contains(&footer)),
            "title line of {sub}'s page"
        );
        // Every flag `--help` lists (on its lines that start with a flag) has its own entry.
        let help = stdout(&[sub, "--help"]);
        let flags: Vec<&str> = help
            .lines()
            .filter(|line| line.trim_start().starts_with('-'))
            .flat_map(|line| line.split([' ', ',', '=', '<', '[']))
            .filter(|word| word.starts_with("--") && word.len() > 2)
            .collect();
        assert!(flags.len() >= 3, "{sub} --help lists {flags:?}");
        for flag in flags {
            let entry = format!("\\fB{}\\fR", flag.replace('-', "\\-"));
            assert!(
                page.lines()
                    .any(|l| l.starts_with(&entry) || l.contains(&format!("|{entry}"))),
                "{flag} has no entry in nsq-dedupe-{sub}.1"
            );
        }
    }
    // Without --dir, the top-level page on stdout, as before.
    let top = stdout(&["manpage"]);
    assert_eq!(
        top,
        std::fs::read_to_string(pages.join("nsq-dedupe.1")).unwrap()
    );
}

/// `resize --help` lists the store flags a resize uses; those only a running consumer uses
/// (its lease, near table, fleet interval, table file and its snapshots and journal,
/// self-sizing bound) are left out, and refused when given (tests/resize_safety.rs).
#[test]
fn resize_help_leaves_out_the_flags_only_a_running_consumer_uses() {
    let run_only = [
        "--lease <",
        "--near-table <",
        "--fleet-interval <",
        "--table-file <",
        "--table-file-on-mismatch <",
        "--snapshot-interval <",
        "--journal-fsync",
        "--max-memory <",
    ];
    let resize = stdout(&["resize", "--help"]);
    let run = stdout(&["run", "--help"]);
    for flag in run_only {
        assert!(
            !resize.contains(flag),
            "resize --help lists {flag}:\n{resize}"
        );
        assert!(run.contains(flag), "run --help does not list {flag}");
    }
    for flag in [
        "--buckets <",
        "--redis-url <",
        "--memcached-address <",
        "--namespace <",
    ] {
        assert!(
            resize.contains(flag),
            "resize --help does not list {flag}:\n{resize}"
        );
    }
}
