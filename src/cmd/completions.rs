//! `nsq-dedupe completions SHELL`: the shell completion script, generated from the flag
//! definitions (the package ships the same scripts, see pkg/generate-assets.sh).

use clap_complete::Shell;

/// The name the scripts complete: the binary's.
const BIN_NAME: &str = "nsq-dedupe";

/// Prints the completion script of `shell` for `definition`.
pub(crate) fn run(shell: Shell, mut definition: clap::Command) -> anyhow::Result<()> {
    // Generated in memory, then written with a fallible write: clap_complete panics when its
    // writer fails, and a closed stdout is an error, not a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut definition, BIN_NAME, &mut script);
    if shell == Shell::Bash {
        script = relabel_bash_states(&String::from_utf8_lossy(&script)).into_bytes();
    }
    Ok(crate::cmd::output::write_stdout(&script)?)
}

/// clap_complete's bash script spells a subcommand's state two ways when the binary's name
/// has a `-`: the loop over the typed words sets `cmd` to `nsq__dedupe__subcmd__run`, but the
/// case arms that offer the subcommand's flags are labelled `nsq__subcmd__dedupe__subcmd__run`
/// (the `-` replaced after the separator was added). No arm matches, so nothing after a
/// subcommand completes. We label the arms as the loop spells the state; should clap_complete
/// spell them alike one day, there is nothing left to replace.
/// See: https://github.com/clap-rs/clap/issues/6421
fn relabel_bash_states(script: &str) -> String {
    const SEPARATOR: &str = "__subcmd__";
    let wrong = format!("{}{SEPARATOR}", BIN_NAME.replace('-', SEPARATOR));
    let right = format!("{}{SEPARATOR}", BIN_NAME.replace('-', "__"));
    script.replace(&wrong, &right)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Every state the bash loop can set (`cmd="..."`) has an arm of that label.
    #[test]
    fn every_bash_state_has_its_case_arm() {
        let mut script = Vec::new();
        clap_complete::generate(
            Shell::Bash,
            &mut crate::cli::Cli::definition(),
            BIN_NAME,
            &mut script,
        );
        let script = relabel_bash_states(&String::from_utf8(script).unwrap());
        let states: BTreeSet<&str> = script
            .split("cmd=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter(|state| !state.is_empty())
            .collect();
        let arms: BTreeSet<&str> = script
            .lines()
            .filter_map(|line| line.trim().strip_suffix(')'))
            .collect();
        assert!(states.len() > 5, "{states:?}");
        let missing: Vec<&&str> = states.difference(&arms).collect();
        assert!(missing.is_empty(), "states without an arm: {missing:?}");
    }
}
