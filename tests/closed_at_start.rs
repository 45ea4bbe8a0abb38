//! A standard descriptor closed when the program starts (`>&-`, `<&-`, `2>&-`): a command that
//! needs it refuses to start before it takes anything, instead of writing into the
//! `/dev/null` Rust's runtime puts in its place. One redirected to `/dev/null` on purpose is
//! used as asked.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::closed_output::input;
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;

/// `args` run with `redirect` (such as `>&-`) applied by the shell; stdin empty unless
/// redirected, stdout and stderr gathered unless redirected. Killed after 20 s.
fn run_with(redirect: &str, args: &[impl AsRef<OsStr>]) -> Output {
    let finished = Child::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec \"$0\" \"$@\" {redirect}"))
            .arg(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .args(args)
            .stdin(Stdio::null()),
    )
    .wait_within(Duration::from_secs(20));
    Output {
        status: finished.status,
        stdout: finished.stdout.into_bytes(),
        stderr: finished.stderr.into_bytes(),
    }
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `run` on `topic` events of `nsqd`, metrics off, with `extra` flags.
fn run_args(nsqd: &str, extra: &[&str]) -> Vec<String> {
    let base = ["run", "--topic", "events", "--nsqd-tcp-address", nsqd];
    base.iter()
        .chain(&["--metrics-address", "off"])
        .chain(extra)
        .map(|arg| (*arg).to_owned())
        .collect()
}

/// `filter` of the records `a b a c` (a file in `dir`) with a table file: the table file's
/// path and the arguments.
fn filter_with_table(dir: &Path) -> (PathBuf, Vec<String>) {
    let file = input(dir);
    let table = dir.join("table");
    let args = ["filter", "--memory", "64KiB", "--table-file"]
        .map(str::to_owned)
        .into_iter()
        .chain([table.to_str().unwrap().to_owned(), file])
        .collect();
    (table, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_its_stdout_sink_closed_takes_no_message() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let bodies: Vec<bytes::Bytes> = (0..1000).map(|i| format!("m{i}").into()).collect();
    broker.publish_many("events", bodies);
    let nsqd = broker.tcp_addr().to_string();
    let output = tokio::task::spawn_blocking(move || run_with(">&-", &run_args(&nsqd, &[])))
        .await
        .unwrap();
    let stderr = stderr_of(&output);
    let stats = broker.stats();
    assert_eq!(
        (output.status.code(), stats.connections, stats.deliveries),
        (Some(78), 0, 0),
        "{stderr}"
    );
    assert!(broker.finished("events", "nsq-dedupe").is_empty());
    assert_eq!(
        stderr,
        "error: standard output (descriptor 1) was closed when nsq-dedupe started, and `run` \
         writes the unique messages of the stdout sink there: the output would go nowhere. \
         Start it with stdout open, or redirect it (`>/dev/null`) to discard the output on \
         purpose\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_its_stderr_closed_does_not_start_without_its_log() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish("events", "one");
    let nsqd = broker.tcp_addr().to_string();
    let output = tokio::task::spawn_blocking(move || {
        run_with("2>&-", &run_args(&nsqd, &["--sink", "null"]))
    })
    .await
    .unwrap();
    let stats = broker.stats();
    assert_eq!(
        (output.status.code(), stats.connections, stats.deliveries),
        (Some(78), 0, 0)
    );
}

/// `--sink null` does not write on stdout: it runs (and stops on SIGTERM) without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_another_sink_runs_with_stdout_closed() {
    let broker = Broker::start(BrokerConfig::default()).await;
    broker.publish("events", "one");
    let nsqd = broker.tcp_addr().to_string();
    let child = Child::spawn(
        Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" >&-")
            .arg(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .args(run_args(&nsqd, &["--sink", "null"]))
            .stdin(Stdio::null()),
    );
    crate::util::wait_until("the message finished", Duration::from_secs(20), || {
        broker.finished("events", "nsq-dedupe").len() == 1
    })
    .await;
    child.signal("TERM");
    let finished = child.finish_within(Duration::from_secs(20)).await;
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
}

/// Otherwise the records would be written nowhere, and the table saved would make the next run
/// drop all of them as copies.
#[test]
fn filter_with_stdout_closed_saves_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let (table, args) = filter_with_table(dir.path());
    let closed = run_with(">&-", &args);
    assert_eq!(
        (closed.status.code(), stderr_of(&closed).as_str()),
        (
            Some(1),
            "error: standard output (descriptor 1) was closed when nsq-dedupe started, and \
             `filter` writes the unique records there: the output would go nowhere. Start it \
             with stdout open, or redirect it (`>/dev/null`) to discard the output on purpose\n"
        )
    );
    assert!(!table.exists());
    let again = run_with("", &args);
    assert_eq!(
        (again.status.code(), again.stdout.as_slice()),
        (Some(0), &b"a\nb\nc\n"[..]),
        "{}",
        stderr_of(&again)
    );
}

#[test]
fn filter_reading_a_closed_stdin_refuses() {
    let closed = run_with("<&-", &["filter"]);
    assert_eq!(
        (closed.status.code(), stderr_of(&closed).as_str()),
        (
            Some(1),
            "error: standard input (descriptor 0) was closed when nsq-dedupe started, and \
             `filter` reads its records from there: the input would be empty. Start it with \
             stdin open, or redirect it (`</dev/null`) for no input on purpose\n"
        )
    );
    // Reading files only, it does not need stdin.
    let dir = tempfile::tempdir().unwrap();
    let file = input(dir.path());
    let files = run_with("<&-", &["filter", &file]);
    assert_eq!(
        (files.status.code(), files.stdout.as_slice()),
        (Some(0), &b"a\nb\nc\n"[..])
    );
}

/// A deliberate `>/dev/null` is used as asked: the records are written there and remembered.
#[test]
fn filter_to_dev_null_runs_and_saves_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let (table, args) = filter_with_table(dir.path());
    let discarded = run_with(">/dev/null", &args);
    assert_eq!(
        discarded.status.code(),
        Some(0),
        "{}",
        stderr_of(&discarded)
    );
    assert!(table.exists());
}

#[test]
fn commands_that_print_refuse_a_closed_stdout() {
    for args in [
        &[
            "size",
            "--probability",
            "0.9",
            "--rate",
            "1",
            "--window",
            "1h",
        ][..],
        &["completions", "bash"],
        &["manpage"],
    ] {
        let closed = run_with(">&-", args);
        let stderr = stderr_of(&closed);
        assert_eq!(closed.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: standard output (descriptor 1) was closed"),
            "{args:?}: {stderr}"
        );
    }
}

/// `--stats` are written on stderr; without `--stats`, `filter` does not need it.
#[test]
fn filter_with_stats_refuses_a_closed_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let file = input(dir.path());
    let closed = run_with("2>&-", &["filter", "--stats", &file]);
    assert_eq!(
        (closed.status.code(), closed.stdout.as_slice()),
        (Some(1), &b""[..])
    );
    let quiet = run_with("2>&-", &["filter", &file]);
    assert_eq!(
        (quiet.status.code(), quiet.stdout.as_slice()),
        (Some(0), &b"a\nb\nc\n"[..])
    );
}
