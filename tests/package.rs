//! The Debian package's parts, without building it (pkg/build-deb.sh builds it and runs
//! pkg/check.sh on it; tests/run.sh runs pkg/check.sh for the unit): Cargo.toml's asset list
//! against the files pkg/generate-assets.sh writes, the example config, and the unit's settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nsq_dedupe::config::RawConfig;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `[package.metadata.deb] assets`, destination to (source, mode).
fn deb_assets() -> BTreeMap<String, (String, String)> {
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(repo("Cargo.toml")).unwrap()).unwrap();
    let assets = manifest["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .expect("[package.metadata.deb] assets");
    assets
        .iter()
        .map(|asset| {
            let field = |i: usize| asset[i].as_str().unwrap().to_owned();
            (field(1), (field(0), field(2)))
        })
        .collect()
}

/// The unit's `Key=value` lines (repeated keys joined by a space).
fn unit() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo("pkg/nsq-dedupe@.service")).unwrap();
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with(['#', '[']) || line.trim().is_empty() {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {line:?}"));
        keys.entry(key.to_owned())
            .and_modify(|all| {
                all.push(' ');
                all.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    keys
}

/// systemd's time span as this unit writes it: `60s`, `2min`.
fn seconds(span: &str) -> Duration {
    let digits: String = span.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits
        .parse()
        .unwrap_or_else(|_| panic!("time span {span:?}"));
    match &span[digits.len()..] {
        "" | "s" => Duration::from_secs(n),
        "min" => Duration::from_secs(n * 60),
        unit => panic!("time span {span:?}: unit {unit:?}"),
    }
}

#[test]
fn package_installs_the_binary_unit_config_every_man_page_and_completions() {
    let assets = deb_assets();
    let dests: Vec<&str> = assets.keys().map(String::as_str).collect();
    assert_eq!(
        dests,
        [
            "etc/nsq-dedupe/example.toml",
            "usr/bin/",
            "usr/lib/systemd/system/",
            "usr/share/bash-completion/completions/nsq-dedupe",
            "usr/share/doc/nsq-dedupe/",
            "usr/share/doc/nsq-dedupe/docs/",
            "usr/share/fish/vendor_completions.d/",
            "usr/share/man/man1/",
            "usr/share/zsh/vendor-completions/",
        ]
    );
    assert_eq!(
        assets["usr/bin/"],
        ("target/release/nsq-dedupe".to_owned(), "755".to_owned())
    );

    // The generated sources are what pkg/generate-assets.sh writes under target/pkg; the rest
    // are in the repository.
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("bash")
        .arg(repo("pkg/generate-assets.sh"))
        .arg(env!("CARGO_BIN_EXE_nsq-dedupe"))
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success(), "pkg/generate-assets.sh: {status}");
    for (dest, (source, _)) in &assets {
        if dest == "usr/bin/" {
            continue;
        }
        let matched: Vec<String> = match source.strip_prefix("target/pkg/") {
            Some(generated) => files_matching(out.path(), generated),
            None => files_matching(&repo(""), source),
        };
        assert!(
            !matched.is_empty(),
            "asset {source} -> {dest}: no such file"
        );
        if dest == "usr/share/man/man1/" {
            assert_eq!(
                matched,
                [
                    "nsq-dedupe-completions.1.gz",
                    "nsq-dedupe-filter.1.gz",
                    "nsq-dedupe-manpage.1.gz",
                    "nsq-dedupe-resize.1.gz",
                    "nsq-dedupe-run.1.gz",
                    "nsq-dedupe-size.1.gz",
                    "nsq-dedupe.1.gz",
                ]
            );
        }
    }
    let bash = std::fs::read_to_string(out.path().join("completions/nsq-dedupe.bash")).unwrap();
    assert!(
        bash.contains("--shutdown-grace"),
        "bash completion lacks run's flags"
    );
    let fish = std::fs::read_to_string(out.path().join("completions/nsq-dedupe.fish")).unwrap();
    assert!(
        fish.contains("shutdown-grace"),
        "fish completion lacks run's flags"
    );

    let manifest = std::fs::read_to_string(repo("Cargo.toml")).unwrap();
    assert!(manifest.contains("maintainer-scripts = \"pkg/debian/\""));
    for script in ["postinst", "prerm", "postrm"] {
        let text = std::fs::read_to_string(repo(&format!("pkg/debian/{script}"))).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"), "{script}");
        assert!(text.contains("nsq-dedupe@"), "{script} names no instance");
    }
}

/// Names in `dir` matching `pattern` (a path whose last part may hold one `*`), sorted.
fn files_matching(dir: &Path, pattern: &str) -> Vec<String> {
    let path = dir.join(pattern);
    let parent = path.parent().unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let (prefix, suffix) = name.split_once('*').unwrap_or((name, ""));
    let exact = !name.contains('*');
    let mut names: Vec<String> = std::fs::read_dir(parent)
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    if exact {
                        n == name
                    } else {
                        n.starts_with(prefix) && n.ends_with(suffix)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `path` with its `.` and `..` parts resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn package_installs_the_readme_with_every_page_it_links_to() {
    // README.md and docs/ keep the repository's layout under /usr/share/doc/nsq-dedupe, so a
    // link between two documentation pages resolves in the installed copy too.
    let assets = deb_assets();
    assert_eq!(assets["usr/share/doc/nsq-dedupe/"].0, "README.md");
    assert_eq!(assets["usr/share/doc/nsq-dedupe/docs/"].0, "docs/*");
    let mut installed: Vec<PathBuf> = files_matching(&repo(""), "docs/*")
        .into_iter()
        .map(|name| Path::new("docs").join(name))
        .collect();
    installed.push(PathBuf::from("README.md"));

    let root = repo("");
    let mut doc_links = 0;
    let mut missing = Vec::new();
    for (page, text) in crate::docs::pages() {
        let dir = page.parent().unwrap().strip_prefix(&root).unwrap();
        for target in crate::docs::link_targets(&text) {
            let file = target.split('#').next().unwrap();
            if file.is_empty() || file.contains("://") {
                continue;
            }
            let linked = normalize(&dir.join(file));
            // Links into the source tree (src/, config/, examples/) are for readers of the
            // repository; the package carries the documentation pages and their pictures.
            let is_doc = linked
                .extension()
                .is_some_and(|ext| ext == "md" || ext == "svg");
            if !is_doc {
                continue;
            }
            doc_links += 1;
            if !installed.contains(&linked) {
                missing.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(doc_links > 20, "only {doc_links} links between pages found");
    assert!(
        missing.is_empty(),
        "links to pages the package does not install:\n{}",
        missing.join("\n")
    );
}

#[test]
fn unit_runs_one_hardened_instance_per_config_and_outwaits_the_graceful_stop() {
    let unit = unit();
    let assets = deb_assets();
    assert_eq!(assets["usr/bin/"].0, "target/release/nsq-dedupe");
    assert_eq!(
        unit["ExecStart"],
        "/usr/bin/nsq-dedupe run --config /etc/nsq-dedupe/%i.toml"
    );
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("StateDirectory", "nsq-dedupe/%i"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2 78"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(unit.get(key).map(String::as_str), Some(value), "{key}");
    }

    // systemd sends SIGKILL after TimeoutStopSec. The sidecar's stop takes up to the grace
    // period, 5 s more for the consumer to close, 2 s for abandoned handlers, then the sink's
    // flush and the table file's save: 20 s are left for those beyond the grace.
    let timeout = seconds(&unit["TimeoutStopSec"]);
    let example = RawConfig::from_file(&repo("pkg/example.toml"))
        .unwrap()
        .validate()
        .unwrap_or_else(|error| panic!("pkg/example.toml: {error}"));
    let mut minimal = RawConfig::default();
    minimal.source.topic = Some("events".into());
    minimal.source.nsqd_tcp_addresses = Some(vec!["127.0.0.1:4150".into()]);
    let default = minimal.validate().unwrap();
    for (what, grace) in [("default", default.grace), ("example", example.grace)] {
        assert!(
            timeout >= grace + Duration::from_secs(20),
            "TimeoutStopSec={timeout:?} leaves under 20 s after the {what} grace of {grace:?}"
        );
    }
}

#[test]
fn example_config_writes_only_its_instance_state_directory() {
    let text = std::fs::read_to_string(repo("pkg/example.toml")).unwrap();
    let config: toml::Value = toml::from_str(&text).unwrap();
    // Relative paths, in the unit's working directory, which is its state directory: a copy
    // of the example for another instance writes in that instance's directory. (Absolute
    // paths naming the `example` instance's directory made every copy fail to start, and
    // restart every 5 s.)
    let unit = std::fs::read_to_string(repo("pkg/nsq-dedupe@.service")).unwrap();
    assert!(unit.contains("\nStateDirectory=nsq-dedupe/%i\n"), "{unit}");
    assert!(
        unit.contains("\nWorkingDirectory=%S/nsq-dedupe/%i\n"),
        "{unit}"
    );
    let table = config["store"]["table_file"].as_str().unwrap();
    let dead_letter = config["dead_letter"]["path"].as_str().unwrap();
    for path in [table, dead_letter] {
        let path = Path::new(path);
        assert!(
            path.is_relative() && path.components().count() == 1,
            "{} is not a plain name in the working directory",
            path.display()
        );
    }
    assert_eq!(
        config["sink"]["kind"].as_str(),
        Some("nsq"),
        "a service's sink: not stdout, which goes to the journal"
    );
}
