//! Helpers shared by the integration tests.

use std::time::{Duration, Instant};

use assert_cmd::Command;

/// The `nsq-dedupe` binary under test.
pub fn bin() -> Command {
    Command::cargo_bin("nsq-dedupe").expect("the nsq-dedupe binary is built by cargo test")
}

/// Polls `cond` every 10 ms until it holds, or panics after `limit` naming `what`.
pub async fn wait_until(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    wait_until_or(what, limit, cond, String::new).await;
}

/// As [`wait_until`], and the panic message adds `detail()`, such as the counts so far.
pub async fn wait_until_or(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
    detail: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}: {}",
            detail()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
