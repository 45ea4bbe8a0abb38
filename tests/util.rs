//! Helpers shared by the integration tests.

use assert_cmd::Command;

/// The `nsq-dedupe` binary under test.
pub fn bin() -> Command {
    Command::cargo_bin("nsq-dedupe").expect("the nsq-dedupe binary is built by cargo test")
}
