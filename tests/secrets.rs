//! Secrets never leave the process through its output: header values, URL user info and query
//! values, the AUTH secret and the digest key are redacted in logs (at debug), errors,
//! status lines and metrics.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::broker::{Auth, Broker, BrokerConfig};
use crate::support::child::Child;
use crate::support::http::{Answer, HttpServer};
use crate::util::bin;

/// 64 hex digits, so that it can also be the digest key.
const SENTINEL: &str = "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7";

/// SIGTERM to a running `nsq-dedupe`, then its exit code, stdout and stderr; panics if it does
/// not stop within 10 s.
fn stop(run: Child) -> (i32, String, String) {
    let finished = run.stop_within("TERM", Duration::from_secs(10));
    (
        finished.code().unwrap_or(-1),
        finished.stdout,
        finished.stderr,
    )
}

/// The metrics page at `addr`, as plain HTTP/1.0.
fn metrics_page(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page
}

#[test]
fn the_startup_line_summarises_the_sink_without_its_secrets() {
    let post = format!("https://user:{SENTINEL}@127.0.0.1:1/ingest?token={SENTINEL}");
    let header = format!("Authorization: Bearer {SENTINEL}");
    let mut run = Child::bin([
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        "off",
        "--sink",
        "http",
        "--post",
        &post,
        "--post",
        "http://127.0.0.1:2/b",
        "--header",
        &header,
    ]);
    let started = run.line_on_stderr("Sidecar started.", Duration::from_secs(10));
    assert!(started.is_some(), "no startup line: {}", run.stderr());
    let (code, _, stderr) = stop(run);
    assert_eq!(code, 0, "{stderr}");
    let started = stderr
        .lines()
        .find(|line| line.contains("Sidecar started."))
        .unwrap();
    assert!(
        started.contains(
            "sink=http POST https://<redacted>@127.0.0.1:1/ingest?token=<redacted> \
             (2 URLs, round-robin; headers content-type, authorization)"
        ),
        "{started}"
    );
    assert!(!stderr.contains(SENTINEL), "{stderr}");
}

#[test]
fn a_file_sink_is_summarised_by_its_directory_and_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let mut run = Child::bin([
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        "off",
        "--sink",
        "file",
        "--output-dir",
        out,
    ]);
    let started = run.line_on_stderr("Sidecar started.", Duration::from_secs(10));
    assert!(started.is_some(), "no startup line: {}", run.stderr());
    let (code, _, stderr) = stop(run);
    assert_eq!(code, 0, "{stderr}");
    let expected = format!("sink=file dir={out} format=<TOPIC>.<HOST><REV>.<DATETIME>.log");
    assert!(stderr.contains(&expected), "{stderr}");
}

/// Every secret-bearing setting holds the sentinel; the service runs (AUTH, POSTs that fail
/// and are retried, lookups that fail, metrics) with logs at debug, and nothing it prints
/// holds the sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_any_setting_never_appears_in_the_output() {
    let broker = Broker::start(BrokerConfig {
        auth: Some(Auth {
            secret: SENTINEL.to_owned(),
            identity: "tester".to_owned(),
            topics: vec!["events".to_owned()],
        }),
        ..BrokerConfig::default()
    })
    .await;
    // 500: every POST fails and is retried, so the URL is in the handler's errors.
    let server = HttpServer::start(Answer {
        status: 500,
        ..Answer::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("digest.key");
    std::fs::write(&key_file, format!("{SENTINEL}\n")).unwrap();
    let post = format!(
        "http://user:{SENTINEL}@{}/ingest?token={SENTINEL}#{SENTINEL}",
        server.addr
    );
    let header = format!("Authorization: Bearer {SENTINEL}");
    let lookupd = format!("http://user:{SENTINEL}@127.0.0.1:1");
    let nsqd = broker.tcp_addr().to_string();
    let key_path = key_file.to_str().unwrap().to_owned();
    let args: Vec<String> = [
        "--log-level",
        "debug",
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        &nsqd,
        "--lookupd-http-address",
        &lookupd,
        "--lookupd-poll-interval",
        "1s",
        "--metrics-address",
        "127.0.0.1:0",
        "--auth-secret",
        SENTINEL,
        "--digest-key-file",
        &key_path,
        "--sink",
        "http",
        "--post",
        &post,
        "--header",
        &header,
        "--status-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = tokio::task::spawn_blocking(move || Child::bin(args))
        .await
        .unwrap();
    broker.publish("events", "one");
    broker.publish("events", "two");
    wait_until_or_dump(&run, "two POSTs with the header", || {
        server.received().len() >= 2
    })
    .await;
    // The settings were used: the header went out whole.
    let sent = server.received()[0].headers["authorization"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(sent, format!("Bearer {SENTINEL}"));
    wait_until_or_dump(&run, "a failed lookup and a status line", || {
        let stderr = run.stderr();
        stderr.contains("nsqlookupd query failed") && stderr.contains("Status.")
    })
    .await;
    let stderr = run.stderr();
    let metrics_addr = stderr
        .lines()
        .find(|line| line.contains("Serving /metrics"))
        .and_then(|line| line.split("addr=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no metrics address: {stderr}"));
    let page = tokio::task::spawn_blocking(move || metrics_page(&metrics_addr))
        .await
        .unwrap();
    assert!(page.contains("nsq_dedupe"), "{page}");
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || stop(run))
        .await
        .unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("Handler failed; requeued."), "{stderr}");
    for (what, text) in [("stderr", &stderr), ("stdout", &stdout), ("metrics", &page)] {
        assert!(!text.contains(SENTINEL), "{what} holds the secret:\n{text}");
    }
}

async fn wait_until_or_dump(run: &Child, what: &str, cond: impl FnMut() -> bool) {
    crate::util::wait_until_or(what, Duration::from_secs(20), cond, || run.stderr()).await;
}

/// Settings refused at start: the error names the setting, not the secret in it.
#[test]
fn errors_about_secret_bearing_settings_do_not_repeat_the_secret() {
    let bad_post = format!("https://user:{SENTINEL}@/x");
    let bad_header = format!("X-Token: {SENTINEL}\u{1}");
    let base = [
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--sink",
        "http",
    ];
    let cases: [(&[&str], &str); 2] = [
        (
            &["--post", &bad_post],
            "error: invalid `--post` = \"https://<redacted>@/x\": not a URL (invalid authority)\n",
        ),
        (
            &["--post", "http://127.0.0.1:1/", "--header", &bad_header],
            "error: invalid `--header` = \"X-Token\" = \"<redacted>\": header names are \
             letters, digits, '-' and '_'; values have no line breaks\n",
        ),
    ];
    for (extra, expected) in cases {
        let out = bin().args(base).args(extra).output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!((out.status.code(), stderr.as_str()), (Some(78), expected));
    }
    // A header without its colon is refused by the flag parser, which shows no value either.
    let out = bin()
        .args(base)
        .args(["--header", &format!("Authorization Bearer {SENTINEL}")])
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(2),
            "error: invalid value for '--header <HEADER>' (not shown: it may hold a secret): \
             expected \"Name: value\", such as \"Authorization: Bearer abc\"\n"
                .to_owned()
        )
    );
}

/// `run --config` with `text` written at `config`: the exit status and stderr.
fn run_config(config: &std::path::Path, text: &str) -> (Option<i32>, String) {
    std::fs::write(config, text).unwrap();
    let out = bin()
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_config_file_that_does_not_parse_shows_no_secret_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("events.toml");
    // The closing quote is missing.
    let (code, stderr) = run_config(
        &config,
        &format!("[source]\ntopic = \"events\"\n\n[consumer_opt]\nauth_secret = \"{SENTINEL}\n"),
    );
    assert_eq!(code, Some(78), "{stderr}");
    assert!(!stderr.contains(&SENTINEL[..8]), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: invalid config file {}: TOML parse error at line 5, column ",
            config.display()
        )),
        "{stderr}"
    );
}

/// An array left open (the closing `]` missing) makes TOML point past the line that opened
/// it; whatever the place, the error gives the parser's hint and the line and column, and
/// quotes no line of the file.
#[test]
fn a_config_file_with_an_open_array_shows_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("events.toml");
    let cases = [
        (
            "store",
            format!("redis_urls = [\"redis://:{SENTINEL}@127.0.0.1:6379\""),
        ),
        (
            "sink",
            format!("post = [\"http://u:{SENTINEL}@127.0.0.1:1/in\""),
        ),
        ("consumer_opt", format!("auth_secret = [\"{SENTINEL}\"")),
    ];
    for (table, line) in &cases {
        // At the end of the file, and followed by more settings.
        for rest in ["\n", "\n\n[metrics]\naddress = \"off\"\n"] {
            let text = format!("[source]\ntopic = \"events\"\n\n[{table}]\n{line}{rest}");
            let (code, stderr) = run_config(&config, &text);
            assert_eq!(code, Some(78), "{text:?}: {stderr}");
            assert!(stderr.contains("expected `]`"), "{text:?}: {stderr}");
            assert!(
                stderr.contains("TOML parse error at line ") && stderr.contains(", column "),
                "{text:?}: {stderr}"
            );
            assert!(!stderr.contains(&SENTINEL[..8]), "{text:?}: {stderr}");
            for quoted in text.lines().filter(|l| l.contains('=')) {
                assert!(
                    !stderr.contains(quoted),
                    "{text:?} quotes {quoted:?}: {stderr}"
                );
            }
        }
    }
}

/// The cause of a failing sink (the status and the URL without its secrets) is logged at the
/// default level, at most once a second for one cause, with the count of failures not logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sink_is_logged_with_its_cause_once_a_second() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let server = HttpServer::start(Answer {
        status: 500,
        ..Answer::default()
    })
    .await;
    let post = format!(
        "http://user:{SENTINEL}@{}/ingest?token={SENTINEL}",
        server.addr
    );
    let nsqd = broker.tcp_addr().to_string();
    let args: Vec<String> = [
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        &nsqd,
        "--metrics-address",
        "off",
        "--sink",
        "http",
        "--post",
        &post,
        "--backoff",
        "100ms",
        "--max-backoff",
        "200ms",
        "--max-attempts",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let started = Instant::now();
    let run = tokio::task::spawn_blocking(move || Child::bin(args))
        .await
        .unwrap();
    for i in 0..20 {
        broker.publish("events", format!("m{i}"));
    }
    let cause = format!(
        "cause=http://<redacted>@{}/ingest?token=<redacted> answered HTTP 500 Internal Server \
         Error",
        server.addr
    );
    let logged = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter(|line| line.contains("Handler failed; messages requeued."))
            .map(str::to_owned)
            .collect()
    };
    // A second line comes at least a second after the first, with the failures in between.
    wait_until_or_dump(&run, "a second line about the failures", || {
        logged(&run.stderr()).len() >= 2 && server.received().len() >= 40
    })
    .await;
    let (_, _, stderr) = tokio::task::spawn_blocking(move || stop(run))
        .await
        .unwrap();
    let elapsed = started.elapsed().as_secs() + 1;
    let lines = logged(&stderr);
    assert!(lines.len() as u64 <= elapsed, "{elapsed} s: {stderr}");
    let mut suppressed = 0;
    for line in &lines {
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains(&cause), "{line}");
        let count = line.rsplit("suppressed=").next().unwrap();
        suppressed += count.trim().parse::<usize>().unwrap();
    }
    assert!(suppressed > 0, "{stderr}");
    assert!(
        lines.len() + suppressed <= server.received().len(),
        "{} POSTs: {stderr}",
        server.received().len()
    );
    assert!(!stderr.contains(SENTINEL), "{stderr}");
}
