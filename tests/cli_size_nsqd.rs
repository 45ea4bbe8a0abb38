//! `nsq-dedupe size --nsqd-http-address`: the rate measured from stubs of nsqd's `/stats`,
//! the figures printed, the table sized as `--rate` sizes it, and each way it can go wrong.

use std::process::Output;
use std::time::Duration;

use crate::support::nsqd_stats::{NsqdStub, TcpPortStub};
use crate::util::bin;

/// Runs `nsq-dedupe size` with `args` (and `env`) off the test's runtime, so the stubs answer.
async fn size(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = bin();
    // Bounds a run that would wait for a sample it should not take.
    command.timeout(Duration::from_secs(60));
    command.arg("size").args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The sizing `size --rate 5000 -p 0.99 --window 1h` prints: what a measured 5,000 distinct
/// messages a second must size.
async fn sized_at_5000() -> String {
    let text = stdout(&size(&["--rate", "5000", "-p", "0.99", "--window", "1h"], &[]).await);
    assert!(
        text.starts_with(
            "Table:        49,550,840 buckets (6,193,855 sets of 8 ways)\n\
             Memory:       378.0 MiB in-process; about 453.4 MiB in Memcached, 550.8 MiB in Redis or Valkey\n\
             Window:       1h at 5000 msg/s = 18,000,000 distinct messages\n"
        ),
        "{text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_nsqd_rate_sizes_the_table_as_rate_does() {
    let nsqd = NsqdStub::topic("events", &[1000, 2000]).await;
    let addr = nsqd.addr.to_string();
    let out = stdout(
        &size(
            &[
                "--nsqd-http-address",
                &addr,
                "--topic",
                "events",
                "--sample",
                "200ms",
                "-p",
                "0.99",
                "--window",
                "1h",
            ],
            &[],
        )
        .await,
    );
    let w = addr.len();
    let expected = format!(
        "Measured:     topic events over 200ms, from each nsqd's /stats\n\
         \x20 {addr:<w$}  {:>20}  {:>10} msg/s\n\
         \x20 {:<w$}  {:>20}  {:>10} msg/s\n\
         \x20 {:<w$}  {:>20}  {:>10} msg/s (the total: --copies 1, each message is published \
         to one of these nsqd)\n\n{}",
        "1,000 messages",
        "5000.0",
        "total",
        "1,000 messages",
        "5000.0",
        "distinct",
        "",
        "5000.0",
        sized_at_5000().await
    );
    assert_eq!(out, expected);
    assert_eq!(nsqd.reads(), 2, "one read at each end of the sample");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_nsqd_count_each_copy_and_copies_divides_them_out() {
    // Both nsqd receive every message: 1,000 each in 200 ms, 5,000 distinct a second.
    let a = NsqdStub::topic("events", &[1000, 2000]).await;
    let b = NsqdStub::topic("events", &[40, 1040]).await;
    let both = format!("{},{}", a.addr, b.addr);
    let sizing = sized_at_5000().await;
    let out = stdout(
        &size(
            &[
                "--nsqd-http-address",
                &both,
                "--topic",
                "events",
                "--sample",
                "200ms",
                "--copies",
                "2",
                "-p",
                "0.99",
                "--window",
                "1h",
            ],
            &[],
        )
        .await,
    );
    let (measured, sized) = out.split_once("\n\n").unwrap();
    assert_eq!(sized, sizing);
    let lines: Vec<&str> = measured.lines().collect();
    assert_eq!(lines.len(), 5, "{measured}");
    for (line, (name, figures)) in lines[1..].iter().zip([
        (a.addr.to_string(), "1,000 messages      5000.0 msg/s"),
        (b.addr.to_string(), "1,000 messages      5000.0 msg/s"),
        ("total".to_owned(), "2,000 messages     10000.0 msg/s"),
        ("distinct".to_owned(), "5000.0 msg/s (the total / 2: --copies 2, each message is published to 2 of these nsqd)"),
    ]) {
        let line = line.trim_start();
        assert!(line.starts_with(&name), "{line}");
        assert!(line.ends_with(figures), "{line:?} should end with {figures:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_carries_the_measured_figures_and_the_rate_it_sized_for() {
    // Two nsqd that each receive part of the topic: their sum is the distinct rate.
    let a = NsqdStub::topic("events", &[0, 300]).await;
    let b = NsqdStub::topic("events", &[0, 700]).await;
    let out = size(
        &[
            "--topic", "events", "--sample", "200ms", "-p", "0.99", "--window", "1h", "--json",
        ],
        &[(
            "NSQ_DEDUPE_NSQD_HTTP_ADDRESS",
            &format!("{},{}", a.addr, b.addr),
        )],
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let measured = &json["measured"];
    assert_eq!(measured["topic"], "events");
    assert_eq!(measured["sample_seconds"], 0.2);
    assert_eq!(measured["copies"], 1);
    assert_eq!(measured["nsqd"][0]["address"], a.addr.to_string());
    assert_eq!(measured["nsqd"][0]["messages"], 300);
    assert_eq!(measured["nsqd"][1]["message_count_end"], 700);
    assert_eq!(measured["total_rate"], 5000.0);
    assert_eq!(measured["distinct_rate"], 5000.0);
    assert_eq!(json["rate"], 5000.0);
    assert_eq!(json["buckets"], 49_550_840);
}

/// Runs `size` with `args`, expects exit status 1, nothing on stdout and `stderr` exactly.
async fn fails(args: &[&str], stderr: &str) {
    let out = size(args, &[]).await;
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(1), "", stderr),
        "size {args:?}"
    );
}

const FIX: &str = "give nsqd's HTTP address (nsqd --http-address, port 4151 by default)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_nsqd_is_named_before_the_sample() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let up = NsqdStub::topic("events", &[0, 100]).await;
    let both = format!("{},{closed}", up.addr);
    fails(
        &[
            "--nsqd-http-address",
            &both,
            "--topic",
            "events",
            "--sample",
            "1h",
            "-p",
            "0.99",
            "--window",
            "1h",
        ],
        &format!(
            "error: cannot reach nsqd at `{closed}` (http://{closed}/stats?format=json&\
             include_clients=false&include_mem=false&topic=events): Connection refused (os \
             error 111): check that nsqd runs there; {FIX}\n"
        ),
    )
    .await;
    // The failure ends the run at once: the other nsqd is read at most at the start, and the
    // hour-long sample is never waited for (`size` times out after a minute).
    assert!(up.reads() <= 1, "{} reads", up.reads());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsqds_tcp_port_is_named_as_not_http() {
    let tcp = TcpPortStub::start().await;
    let addr = tcp.addr.to_string();
    let out = size(
        &[
            "--nsqd-http-address",
            &addr,
            "--topic",
            "events",
            "-p",
            "0.99",
            "--window",
            "1h",
        ],
        &[],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let prefix = format!("error: `{addr}` accepts connections but does not answer HTTP (");
    let suffix = format!("): is it nsqd's TCP address? {FIX}\n");
    assert!(
        stderr.starts_with(&prefix) && stderr.ends_with(&suffix),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_not_nsqds_json_is_named() {
    let other = NsqdStub::text("OK").await;
    let addr = other.addr.to_string();
    fails(
        &[
            "--nsqd-http-address",
            &addr,
            "--topic",
            "events",
            "-p",
            "0.99",
            "--window",
            "1h",
        ],
        &format!(
            "error: `{addr}` answered http://{addr}/stats?format=json&include_clients=false&\
             include_mem=false&topic=events with something other than nsqd's stats JSON \
             (expected value at line 1 column 1; the answer begins \"OK\"): is it nsqd? {FIX}\n"
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_is_named_with_the_topics_nsqd_has() {
    let nsqd = NsqdStub::topic("events", &[0, 100]).await;
    let addr = nsqd.addr.to_string();
    fails(
        &[
            "--nsqd-http-address",
            &addr,
            "--topic",
            "event",
            "-p",
            "0.99",
            "--window",
            "1h",
        ],
        &format!(
            "error: nsqd at `{addr}` has no topic `event` (its topics: events): check \
             `--topic`, and that this nsqd receives the topic (nsqd creates a topic at its \
             first message)\n"
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_topic_or_a_restart_is_no_rate() {
    let quiet = NsqdStub::topic("events", &[42, 42]).await;
    let addr = quiet.addr.to_string();
    let args = |addr: &str| {
        [
            "--nsqd-http-address",
            addr,
            "--topic",
            "events",
            "--sample",
            "200ms",
            "-p",
            "0.99",
            "--window",
            "1h",
        ]
        .map(str::to_owned)
    };
    let quiet_args = args(&addr);
    let quiet_args: Vec<&str> = quiet_args.iter().map(String::as_str).collect();
    fails(
        &quiet_args,
        &format!(
            "error: no message was published to topic `events` on `{addr}` during the 200ms \
             sample: sample for longer with `--sample`, at a busier time, or give the rate with \
             `--rate`\n"
        ),
    )
    .await;
    let restarted = NsqdStub::topic("events", &[5000, 10]).await;
    let addr = restarted.addr.to_string();
    let restarted_args = args(&addr);
    let restarted_args: Vec<&str> = restarted_args.iter().map(String::as_str).collect();
    fails(
        &restarted_args,
        &format!(
            "error: nsqd at `{addr}` restarted during the sample, or its topic `events` was \
             deleted and created again (its message count went from 5000 to 10): run `size` \
             again\n"
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradicting_or_missing_flags_are_refused_before_any_read() {
    let nsqd = NsqdStub::topic("events", &[0, 100]).await;
    let addr = nsqd.addr.to_string();
    let twice = format!("{addr},http://{addr}/");
    let cases: &[(&[&str], String)] = &[
        (
            &[
                "--nsqd-http-address",
                &addr,
                "--topic",
                "events",
                "--rate",
                "100",
                "-p",
                "0.9",
                "--window",
                "1h",
            ],
            "error: `--rate` and `--nsqd-http-address` (or NSQ_DEDUPE_NSQD_HTTP_ADDRESS) both \
             give the rate: give `--rate` alone to size for a rate you know, or \
             `--nsqd-http-address` with `--topic` alone to measure it\n"
                .to_owned(),
        ),
        (
            &["--nsqd-http-address", &addr, "-p", "0.9", "--window", "1h"],
            "error: `--nsqd-http-address` measures the rate of a topic: name it with \
             `--topic`, such as `--topic events`\n"
                .to_owned(),
        ),
        (
            &[
                "--nsqd-http-address",
                &addr,
                "--topic",
                "events",
                "-p",
                "0.9",
            ],
            "error: give exactly two of `--probability`, the table size (`--buckets` or \
             `--memory`) and the window (`--window` with `--rate`, or `--messages`); the third \
             is computed\n"
                .to_owned(),
        ),
        (
            &[
                "--nsqd-http-address",
                &addr,
                "--topic",
                "events",
                "--copies",
                "2",
                "-p",
                "0.9",
                "--window",
                "1h",
            ],
            "error: `--copies 2` with 1 nsqd given: a message can be on at most as many of \
             them as are given; give every nsqd that receives the topic, or a smaller \
             `--copies`\n"
                .to_owned(),
        ),
        (
            &[
                "--nsqd-http-address",
                &twice,
                "--topic",
                "events",
                "-p",
                "0.9",
                "--window",
                "1h",
            ],
            format!(
                "error: `--nsqd-http-address` gives the same nsqd twice (`{addr}` and \
                 `http://{addr}/`): its messages would count twice; give each nsqd once\n"
            ),
        ),
        (
            &[
                "--nsqd-http-address",
                "tcp://127.0.0.1:4150",
                "--topic",
                "events",
                "-p",
                "0.9",
                "--window",
                "1h",
            ],
            "error: invalid `--nsqd-http-address` \"tcp://127.0.0.1:4150\": tcp:// is not \
             HTTP; expected nsqd's HTTP address as host:port or an http:// URL, such as \
             127.0.0.1:4151\n"
                .to_owned(),
        ),
        (
            &[
                "--rate", "100", "--sample", "1s", "-p", "0.9", "--window", "1h",
            ],
            "error: `--sample` applies to a measured rate: give `--nsqd-http-address` and \
             `--topic` too, or leave `--sample` out\n"
                .to_owned(),
        ),
    ];
    for (args, stderr) in cases {
        fails(args, stderr).await;
    }
    assert_eq!(nsqd.reads(), 0);
}
