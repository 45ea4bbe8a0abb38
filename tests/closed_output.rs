//! Every subcommand ends quietly when its output or its error output goes away (`| head`,
//! `2>&1 >/dev/null | head`), after saving what it must save: no panic, no backtrace.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::{Child, Reading};

/// Which stream the reader closes before the program writes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    Stdout,
    Stderr,
}

fn command(args: &[&str]) -> Command {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `args` with `closed` closed from the start; returns the exit code and what came out
/// on the other stream. Killed after 30 s.
fn run_closed(args: &[&str], closed: Closed) -> (i32, String) {
    let reading = match closed {
        Closed::Stdout => Reading::Stderr,
        Closed::Stderr => Reading::Stdout,
    };
    let finished =
        Child::spawn_reading(&mut command(args), reading).wait_within(Duration::from_secs(30));
    let open = match closed {
        Closed::Stdout => finished.stderr,
        Closed::Stderr => finished.stdout,
    };
    (finished.status.code().unwrap_or(-1), open)
}

/// The records `a b a c`, in a file in `dir`.
pub(crate) fn input(dir: &Path) -> String {
    let path = dir.join("in.ndjson");
    std::fs::write(&path, "a\nb\na\nc\n").unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn size_ends_quietly_when_stdout_is_closed() {
    assert_eq!(
        run_closed(
            &[
                "size",
                "--probability",
                "0.9",
                "--rate",
                "1",
                "--window",
                "1h"
            ],
            Closed::Stdout
        ),
        (0, String::new())
    );
}

#[test]
fn completions_end_quietly_when_stdout_is_closed() {
    assert_eq!(
        run_closed(&["completions", "bash"], Closed::Stdout),
        (0, String::new())
    );
}

#[test]
fn filter_saves_its_table_when_stderr_is_closed_before_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let file = input(dir.path());
    let table = dir.path().join("table");
    let args = [
        "filter",
        "--stats",
        "--memory",
        "64KiB",
        "--table-file",
        table.to_str().unwrap(),
        file.as_str(),
    ];
    assert_eq!(
        run_closed(&args, Closed::Stderr),
        (0, "a\nb\nc\n".to_owned())
    );
    // The table was saved: the same records again are all copies.
    let again = command(&args).output().unwrap();
    assert_eq!(
        (again.status.code(), again.stdout.as_slice()),
        (Some(0), &b""[..])
    );
}

/// Every subcommand, and the flags that print and exit, with stdout closed and then with
/// stderr closed: each exits with the status it would have with both open, and none panics.
#[test]
fn no_subcommand_panics_when_its_output_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let file = input(dir.path());
    let table = dir.path().join("table");
    let table = table.to_str().unwrap();
    let plot = dir.path().join("plot.svg");
    let plot = plot.to_str().unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["--help"], 0),
        (&["--version"], 0),
        (&["size", "--help"], 0),
        (&["filter", "--help"], 0),
        (&["run", "--help"], 0),
        (
            &[
                "size",
                "--probability",
                "0.9",
                "--rate",
                "1",
                "--window",
                "1h",
            ],
            0,
        ),
        (
            &[
                "size",
                "--probability",
                "0.9",
                "--rate",
                "1",
                "--window",
                "1h",
                "--json",
            ],
            0,
        ),
        (
            &[
                "size",
                "--memory",
                "1MiB",
                "--messages",
                "1000",
                "--plot",
                plot,
            ],
            0,
        ),
        (&["size", "--memory", "1", "--messages", "5"], 1),
        (&["size", "--no-such-flag"], 2),
        (&["filter", &file], 0),
        (&["filter", "--stats", &file], 0),
        (
            &[
                "filter",
                "--stats",
                "--table-file",
                table,
                "--memory",
                "64KiB",
                &file,
            ],
            0,
        ),
        (&["filter", "/nonexistent/input"], 1),
        (&["completions", "bash"], 0),
        (&["completions", "zsh"], 0),
        (&["completions", "fish"], 0),
        (&["manpage"], 0),
        (&["run"], 78),
        (
            &[
                "run",
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--heartbeat-interval",
                "2m",
            ],
            78,
        ),
    ];
    for closed in [Closed::Stdout, Closed::Stderr] {
        for (args, expected) in cases {
            let (code, other) = run_closed(args, closed);
            assert_eq!(code, *expected, "{args:?} with {closed:?} closed: {other}");
            assert!(
                !other.contains("panicked"),
                "{args:?} with {closed:?} closed: {other}"
            );
        }
    }
}

/// `run` with its stdout sink's reader gone stops (its messages requeued, status 0); with
/// stderr gone it keeps running and delivering, and stops on SIGTERM with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ends_quietly_when_its_output_goes_away() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let nsqd = broker.tcp_addr().to_string();
    let args = [
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        &nsqd,
        "--metrics-address",
        "off",
    ]
    .map(str::to_owned);
    broker.publish("events", "one");
    let stdout_closed = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_closed(&args, Closed::Stdout)
        })
    }
    .await
    .unwrap();
    assert_eq!(stdout_closed.0, 0, "{}", stdout_closed.1);
    assert!(!stdout_closed.1.contains("panicked"), "{}", stdout_closed.1);
    // The message was requeued, not lost: the next run with stderr closed delivers it.
    let (child, line) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = Child::spawn_reading(&mut command(&args), Reading::Stdout);
        let line = child.first_stdout_bytes(4, Duration::from_secs(30));
        (child, line)
    })
    .await
    .unwrap();
    child.signal("TERM");
    let code = child.finish_within(Duration::from_secs(30)).await.code();
    assert_eq!((code, line.as_slice()), (Some(0), &b"one\n"[..]));
}
