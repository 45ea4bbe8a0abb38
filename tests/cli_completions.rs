//! Shell completion as a user meets it: each shell loads the script (`nsq-dedupe completions
//! SHELL`, or the file the package ships) and completes a partly typed flag of a subcommand.
//! Bash is required; zsh and fish are tested where installed, and a test says on its output
//! when it skipped one (a skipped shell was not tested).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::child::Child;

/// A shell with completion scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl Shell {
    fn name(self) -> &'static str {
        match self {
            Shell::Bash => "bash",
            Shell::Zsh => "zsh",
            Shell::Fish => "fish",
        }
    }

    /// Whether the shell is installed (on PATH).
    fn installed(self) -> bool {
        Command::new(self.name())
            .args(["-c", "exit 0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The shell code that loads the completion script: from the binary, or from a file.
    fn load(self, file: Option<&Path>) -> String {
        match (self, file) {
            (Shell::Bash | Shell::Zsh, None) => {
                format!("source <(nsq-dedupe completions {})", self.name())
            }
            (Shell::Fish, None) => "nsq-dedupe completions fish | source".to_owned(),
            (_, Some(file)) => format!("source '{}'", file.display()),
        }
    }
}

/// The directory of the binary under test, put first on PATH so that the shells find it by
/// the name the completion is registered for.
fn path_with_the_binary() -> String {
    let bin = assert_cmd::cargo::cargo_bin("nsq-dedupe");
    let dir = bin.parent().unwrap().display().to_string();
    match std::env::var("PATH") {
        Ok(path) => format!("{dir}:{path}"),
        Err(_) => dir,
    }
}

/// Bash: registers the script, finds the function `complete -p` names, and calls it as
/// readline does for `line` (the cursor at its end).
fn bash_script(load: &str, line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let current = words.len() - 1;
    format!(
        r#"{load} || exit 3
spec=$(complete -p nsq-dedupe) || {{ echo "no completion registered for nsq-dedupe" >&2; exit 4; }}
function=$(sed -E 's/.* -F ([^ ]+) .*/\1/' <<<"$spec")
COMP_LINE='{line}'
COMP_POINT=${{#COMP_LINE}}
COMP_WORDS=({words})
COMP_CWORD={current}
COMP_TYPE=9
COMP_KEY=9
"$function" nsq-dedupe '{cur}' '{prev}'
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        words = words.join(" "),
        cur = words[current],
        prev = words[current - 1],
    )
}

/// Zsh completes only inside its line editor, so the script runs an interactive zsh on a
/// pseudo-terminal (zpty), types `line` and a tab there, and prints each candidate the
/// completion functions add (`compadd`), then a marker when the completion is over. The
/// terminal echoes what is typed: the marker is typed in two halves, so that only its print
/// ends the reading.
fn zsh_script(load: &str, line: &str) -> String {
    format!(
        r#"zmodload zsh/zpty || exit 3
zpty shell zsh -f -i || exit 3
zpty -w shell 'PS1= PROMPT= RPROMPT=; unsetopt zle_bracketed_paste 2>/dev/null'
zpty -w shell 'autoload -U compinit && compinit -u -D'
zpty -w shell '{load}'
zpty -w shell 'compadd() {{ if (( ${{argv[(I)-[OAD]*]}} )); then builtin compadd "$@"; return; fi; local -a hits; builtin compadd -O hits "$@"; local h; for h in $hits; do print -r -- "CANDIDATE:$h"; done; builtin compadd "$@"; }}'
zpty -w shell 'completion_over() {{ print -r -- "COMPLETION""-OVER"; exit 0; }}; comppostfuncs=(completion_over)'
zpty -w shell 'bindkey "^I" complete-word'
zpty -n -w shell $'{line}\t'
zpty -r -m shell output '*COMPLETION-OVER*' || exit 5
print -r -- "$output" | tr -d '\r' | sed -n 's/.*CANDIDATE://p'
"#,
    )
}

/// Fish: its own `complete -C` lists the candidates for a command line.
fn fish_script(load: &str, line: &str) -> String {
    format!("{load}; or exit 3\ncomplete -C '{line}'\n")
}

/// The candidates `shell` offers for `line`, with the script loaded by `load`; `None` when
/// the shell is not installed.
fn candidates(shell: Shell, file: Option<&Path>, line: &str) -> Option<Vec<String>> {
    if !shell.installed() {
        return None;
    }
    let load = shell.load(file);
    let (args, script): (&[&str], String) = match shell {
        Shell::Bash => (&["--norc", "--noprofile", "-c"], bash_script(&load, line)),
        Shell::Zsh => (&["-f", "-c"], zsh_script(&load, line)),
        Shell::Fish => (&["--no-config", "-c"], fish_script(&load, line)),
    };
    let finished = Child::spawn(
        Command::new(shell.name())
            .args(args)
            .arg(&script)
            .env("PATH", path_with_the_binary())
            .env("TERM", "dumb")
            .stdin(Stdio::null()),
    )
    .wait_within(Duration::from_secs(60));
    let (status, out, err) = (finished.status, finished.stdout, finished.stderr);
    assert!(
        status.success(),
        "{shell:?} completing {line:?}: {status}\n{err}\n{out}"
    );
    // Fish prints `candidate<TAB>description`.
    Some(
        out.lines()
            .map(|line| line.split('\t').next().unwrap_or_default().to_owned())
            .filter(|word| !word.is_empty())
            .collect(),
    )
}

/// `shell` completes a subcommand's partly typed flags, from the script in `file` (else the
/// binary's own); prints and returns false when the shell is not installed.
fn completes_subcommand_flags(shell: Shell, file: Option<&Path>) -> bool {
    for (line, expected) in [
        ("nsq-dedupe run --sto", "--store"),
        ("nsq-dedupe size --prob", "--probability"),
        ("nsq-dedupe ru", "run"),
    ] {
        let Some(words) = candidates(shell, file, line) else {
            println!(
                "SKIPPED: {} is not installed; its completion was not tested",
                shell.name()
            );
            return false;
        };
        assert!(
            words.iter().any(|word| word == expected),
            "{shell:?} offers {words:?} for {line:?}, not {expected:?}"
        );
    }
    true
}

#[test]
fn bash_completes_a_subcommands_flags() {
    assert!(
        completes_subcommand_flags(Shell::Bash, None),
        "bash is required"
    );
}

#[test]
fn zsh_completes_a_subcommands_flags() {
    completes_subcommand_flags(Shell::Zsh, None);
}

#[test]
fn fish_completes_a_subcommands_flags() {
    completes_subcommand_flags(Shell::Fish, None);
}

/// The files pkg/generate-assets.sh writes are the ones the package installs.
#[test]
fn the_packaged_completions_complete_a_subcommands_flags() {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("pkg/generate-assets.sh"))
        .arg(env!("CARGO_BIN_EXE_nsq-dedupe"))
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success(), "pkg/generate-assets.sh: {status}");
    let dir = out.path().join("completions");
    assert!(completes_subcommand_flags(
        Shell::Bash,
        Some(&dir.join("nsq-dedupe.bash"))
    ));
    completes_subcommand_flags(Shell::Zsh, Some(&dir.join("_nsq-dedupe")));
    completes_subcommand_flags(Shell::Fish, Some(&dir.join("nsq-dedupe.fish")));
}
