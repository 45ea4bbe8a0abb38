//! Records the commit the binary is built from, for `nsq-dedupe --version`.
//!
//! Sets `NSQ_DEDUPE_COMMIT` for the crate's code: the abbreviated commit hash, with `-dirty`
//! when tracked files differ from it, or `unknown` when it cannot be found. In order:
//!
//! 1. `NSQ_DEDUPE_BUILD_COMMIT` from the environment, for builds from an export without
//!    history (a distribution's source package).
//! 2. `.cargo_vcs_info.json`, which `cargo package` writes into a crate tarball.
//! 3. `git`, when the crate's directory is the top of a git checkout (not a crate unpacked
//!    inside some other project's repository), and `git` is installed.
//!
//! Nothing here fails the build: a missing commit is reported, not fatal.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hex digits of the hash shown, as `git log --oneline` shows them in a large repository.
const SHORT_HASH: usize = 12;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-env-changed=NSQ_DEDUPE_BUILD_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = from_environment()
        .or_else(|| from_cargo_vcs_info(&manifest_dir))
        .or_else(|| from_git(&manifest_dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=NSQ_DEDUPE_COMMIT={commit}");
}

fn from_environment() -> Option<String> {
    let commit = std::env::var("NSQ_DEDUPE_BUILD_COMMIT").ok()?;
    let commit = commit.trim();
    (!commit.is_empty()).then(|| commit.to_owned())
}

/// `{"git": {"sha1": "…", "dirty": true}, "path_in_vcs": ""}`, read without a JSON parser: the
/// build script has no dependencies.
fn from_cargo_vcs_info(manifest_dir: &Path) -> Option<String> {
    let path = manifest_dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    watch(&path);
    let after = &text[text.find("\"sha1\"")? + "\"sha1\"".len()..];
    let start = after.find('"')? + 1;
    let hash: String = after[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    if hash.len() < SHORT_HASH {
        return None;
    }
    let dirty = text.contains("\"dirty\": true") || text.contains("\"dirty\":true");
    Some(format!(
        "{}{}",
        &hash[..SHORT_HASH],
        if dirty { "-dirty" } else { "" }
    ))
}

fn from_git(manifest_dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git")
            .args(args)
            .current_dir(manifest_dir)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    if !same_dir(Path::new(&top), manifest_dir) {
        return None;
    }
    // Rebuild when HEAD moves (a commit, a checkout) or the index changes (staging, which
    // `git status` also refreshes), and when the sources change, which may make the tree dirty.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "index", "packed-refs"]
        .into_iter()
        .chain(branch.as_deref())
    {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            watch(&manifest_dir.join(path));
        }
    }
    for tracked in ["src", "Cargo.toml", "Cargo.lock"] {
        watch(&manifest_dir.join(tracked));
    }
    let hash = git(&["rev-parse", &format!("--short={SHORT_HASH}"), "HEAD"])?;
    // Without optional locks, `git status` leaves the index as it found it: a refreshed index
    // would be a change to it, and the next cargo command would run this script and rebuild
    // the crate again.
    let dirty = git(&[
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
    ])
    .is_some_and(|changes| !changes.is_empty());
    Some(format!("{hash}{}", if dirty { "-dirty" } else { "" }))
}

/// Reruns the script when `path` changes. Only existing paths: cargo reruns the script on every
/// build for a missing one, which would rebuild the crate each time.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
