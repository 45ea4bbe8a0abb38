//! `nsq-dedupe run` configured by flags alone into the stdout sink: the flags that set the sink
//! apply, a closed stdout stops the run with nothing finished unwritten, and the status line
//! warns of a table too small for the rate, naming the size that would do.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nsq_dedupe::config::SinkKind;

use crate::sidecar::{payload, sidecar_binary, ChildGuard, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::util::wait_until_or;

/// The binary consuming `broker` into the stdout sink, configured by flags alone (no file):
/// a 4,096-bucket table, no metrics server, `extra` flags; stdout piped, stderr as given.
fn stdout_sidecar(broker: &Broker, extra: &[&str], stderr: Stdio) -> ChildGuard {
    ChildGuard(Some(
        Command::new(sidecar_binary())
            .args([
                "run",
                "--topic",
                TOPIC,
                "--channel",
                CHANNEL,
                "--nsqd-tcp-address",
            ])
            .arg(broker.tcp_addr().to_string())
            .args([
                "--buckets",
                "4096",
                "--sink",
                "stdout",
                "--metrics-address",
                "off",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_too_small_for_the_rate_warns_and_names_the_size_that_would_do() {
    // 2,000 distinct messages in a second or two, into 4,096 slots that should hold an hour:
    // too many for the table to keep the default target.
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..2000).map(payload));
    let mut child = stdout_sidecar(&a, &["--status-interval", "1s"], Stdio::piped());
    let mut c = child.0.take().unwrap();
    let mut stdout = c.stdout.take().unwrap();
    let drain = std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    wait_until_or(
        "2,000 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 2000,
        || format!("{:?}", a.stats()),
    )
    .await;
    // Stopped at once: the line logged as it stops counts every message, whenever the last
    // status interval ended.
    assert!(Command::new("kill")
        .args(["-INT", &c.id().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(c.wait().unwrap().success());
    drain.join().unwrap().unwrap();
    let mut log = String::new();
    c.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    // The last one, logged as it stopped: every message decided by then.
    let warning = log
        .lines()
        .rfind(|l| l.contains("The table is too small for its window"))
        .unwrap_or_else(|| panic!("no warning in\n{log}"));
    // The figures are the messages the window brought: 2,000 in the seconds since the start,
    // not those seconds' rate for an hour.
    assert!(
        warning.contains(
            "The table is too small for its window: after the 2000 distinct messages since the \
             start "
        ) && warning.contains(
            " ago (this consumer's count), a copy one window (1h) late is caught with \
             probability "
        ),
        "{warning}"
    );
    // No `--probability` was given: the target is the default one, and said to be.
    assert!(
        warning.contains("below the default target 0.99 (no --probability was given); --buckets ")
            && warning.contains(" or --memory ")
            && warning.contains(
                "(with --ways 8) would meet it, or --probability 0.99 --window 1h with no \
                 --rate, --buckets or --memory lets the table size itself (a restart at a new \
                 size keeps what the table holds only with --table-file)."
            ),
        "{warning}"
    );
    let suggested: u64 = warning
        .split("--buckets ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no suggested size in {warning}"));
    // Enough for 2,000 messages, not for an hour at the burst's rate (over 400,000 slots).
    assert!(suggested > 4096 && suggested < 4096 * 4, "{warning}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_kind_flag_overrides_are_applied() {
    // The stdout sink through the binary, configured by flags alone (no file).
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, [payload(1), payload(2), payload(1)]);
    let mut child = stdout_sidecar(&a, &["--key", "json:/id", "--ways", "8"], Stdio::null());
    wait_until_or(
        "3 messages decided",
        Duration::from_secs(20),
        || a.stats().fin_ok == 3,
        || format!("{:?}", a.stats()),
    )
    .await;
    let mut c = child.0.take().unwrap();
    let pid = c.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let status = c.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let expected = [payload(1), payload(2)];
    let expected: Vec<&str> = expected
        .iter()
        .map(|b| std::str::from_utf8(b).unwrap())
        .collect();
    assert_eq!(lines, expected);
    let _ = SinkKind::Stdout;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_stops_the_run_and_finishes_nothing_unwritten() {
    let a = Broker::start(BrokerConfig::default()).await;
    a.publish_many(TOPIC, (0..50).map(payload));
    let mut child = stdout_sidecar(&a, &[], Stdio::piped());
    // The reader goes away before anything is written: every write fails with EPIPE.
    drop(child.0.as_mut().unwrap().stdout.take());
    let mut c = child.0.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = c.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "run did not stop after stdout closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    c.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    // Like `filter | head`: a reader that went away is not a failure.
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("The sink's output was closed; stopping."),
        "{stderr}"
    );
    // Nothing was written, so nothing was finished: every message is back in the queue.
    let stats = a.stats();
    assert_eq!(stats.fin_ok, 0, "{stats:?}");
    let (queued, deferred, in_flight) = a.depth(TOPIC, CHANNEL);
    assert_eq!(queued + deferred + in_flight, 50, "{stats:?}");
}
