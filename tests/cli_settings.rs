//! Settings as users write them: listen addresses in the forms NSQ's tools and Prometheus
//! exporters take, output file names that ask for a format we do not write, and every missing
//! setting named at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nsq_dedupe::Settings;

use crate::cli_errors::run_refused;
use crate::support::child::Child;

const SOURCE: &str = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n";

fn metrics_address(typed: &str) -> Result<Option<SocketAddr>, String> {
    Settings::from_toml(&format!("{SOURCE}[metrics]\naddress = {typed:?}\n"))
        .map(|settings| settings.metrics_address)
        .map_err(|error| error.to_string())
}

#[test]
fn the_metrics_address_takes_every_listen_form_of_nsqs_tools() {
    for (typed, listens) in [
        (":4151", "0.0.0.0:4151"),
        ("0.0.0.0:4151", "0.0.0.0:4151"),
        ("127.0.0.1:4151", "127.0.0.1:4151"),
        ("localhost:4151", "127.0.0.1:4151"),
        ("[::1]:4151", "[::1]:4151"),
        ("[::]:4151", "[::]:4151"),
    ] {
        assert_eq!(
            metrics_address(typed),
            Ok(Some(listens.parse().unwrap())),
            "{typed}"
        );
    }
    assert_eq!(metrics_address("off"), Ok(None));
    for wrong in ["4151", "127.0.0.1", ":", "[::1]", "127.0.0.1:99999"] {
        let error = metrics_address(wrong).unwrap_err();
        assert!(
            error.starts_with(&format!("invalid `metrics.address` = {wrong:?}: ")),
            "{wrong}: {error}"
        );
        assert!(
            error.ends_with(
                "expected host:port such as 127.0.0.1:9150, localhost:9150 or :9150 (every \
                 IPv4 interface), or \"off\""
            ),
            "{wrong}: {error}"
        );
    }
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /ping` on `addr`: the answer's status line, if it answered.
fn ping(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.lines().next().map(str::to_owned)
}

#[test]
fn run_serves_metrics_on_a_port_given_without_a_host() {
    let port = free_port();
    let metrics = format!(":{port}");
    let mut child = Child::bin([
        "run",
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        &metrics,
        "--sink",
        "null",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        if let Some(answer) = ping(SocketAddr::from(([127, 0, 0, 1], port))) {
            break Some(answer);
        }
        if Instant::now() > deadline || child.has_exited() {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(answer.as_deref(), Some("HTTP/1.1 200 OK"));
    let line = child
        .line_on_stderr("Serving /metrics", Duration::from_secs(10))
        .expect("the metrics line is logged");
    assert!(line.contains(&format!("addr=0.0.0.0:{port}")), "{line}");
}

/// `run` with a topic and an nsqd, and `extra`: its exit code and stderr once refused.
fn refused(extra: &[&str]) -> (i32, String) {
    let source = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    run_refused(&[], &[&source[..], extra].concat())
}

#[test]
fn a_file_name_asking_for_a_format_we_do_not_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().to_str().unwrap();
    let file_sink = ["--sink", "file", "--output-dir", output];
    assert_eq!(
        refused(
            &[
                &file_sink[..],
                &["--filename-format", "<TOPIC><REV>.log.gz"]
            ]
            .concat()
        ),
        (
            78,
            "error: invalid `--filename-format` = \"<TOPIC><REV>.log.gz\": a name ending in .gz \
             asks for gzip, which is off: set `--gzip`, or end the name otherwise\n"
                .to_owned()
        )
    );
    for (format, ending, compression) in [
        ("<TOPIC><REV>.log.zst", ".zst", "zstd"),
        ("<TOPIC>.<DATETIME>.ndjson.bz2<REV>", ".bz2", "bzip2"),
        ("<TOPIC><REV>.XZ", ".XZ", "xz"),
    ] {
        for gzip in [&[][..], &["--gzip"]] {
            assert_eq!(
                refused(&[&file_sink[..], &["--filename-format", format], gzip].concat()),
                (
                    78,
                    format!(
                        "error: invalid `--filename-format` = {format:?}: a name ending in \
                         {ending} asks for {compression}, which the file sink does not write \
                         (it writes plain lines, or gzip with `--gzip`)\n"
                    )
                ),
                "{format} {gzip:?}"
            );
        }
    }
    assert_eq!(
        refused(&["--dead-letter-file", &format!("{output}/dead.ndjson.gz")]),
        (
            78,
            format!(
                "error: invalid `--dead-letter-file` = \"{output}/dead.ndjson.gz\": a name \
                 ending in .gz asks for gzip, which the dead-letter file is not (it is plain \
                 JSON lines)\n"
            )
        )
    );
    assert_eq!(
        refused(&["--table-file", &format!("{output}/table.zst")]),
        (
            78,
            format!(
                "error: invalid `--table-file` = \"{output}/table.zst\": a name ending in .zst \
                 asks for zstd, which the table file is not (it is nsq-dedupe's own snapshot)\n"
            )
        )
    );
    // What is written is accepted: gzip named .gz (or not: .gz is appended), plain lines
    // named otherwise; and a name from the config file is named by its key.
    let file = |extra: &str| {
        Settings::from_toml(&format!(
            "{SOURCE}[sink]\nkind = \"file\"\noutput_dir = {output:?}\n{extra}"
        ))
        .map(|_| ())
        .map_err(|error| error.to_string())
    };
    assert_eq!(
        file("filename_format = \"<TOPIC><REV>.log.gz\"\ngzip = true\n"),
        Ok(())
    );
    assert_eq!(
        file("filename_format = \"<TOPIC><REV>.log\"\ngzip = true\n"),
        Ok(())
    );
    assert_eq!(file("filename_format = \"<TOPIC><REV>.ndjson\"\n"), Ok(()));
    assert_eq!(
        file("filename_format = \"<TOPIC><REV>.gz\"\n"),
        Err(
            "invalid `sink.filename_format` = \"<TOPIC><REV>.gz\": a name ending in .gz asks \
             for gzip, which is off: set `sink.gzip`, or end the name otherwise"
                .to_owned()
        )
    );
}

#[test]
fn every_missing_setting_of_a_sink_is_named_at_once() {
    assert_eq!(
        refused(&["--sink", "nsq"]),
        (
            78,
            "error: `sink.destination_nsqd_tcp_addresses` is required: set it in the config \
             file or pass `--destination-nsqd-tcp-address`; `sink.destination_topic` is \
             required: set it in the config file or pass `--destination-topic`\n"
                .to_owned()
        )
    );
    // With the source's own missing settings.
    assert_eq!(
        run_refused(&[], &["--sink", "nsq"]),
        (
            78,
            "error: `source.topic` is required: set it in the config file or pass `--topic`; \
             `source.nsqd_tcp_addresses` is required: set it in the config file or pass \
             `--nsqd-tcp-address` or `--lookupd-http-address`; \
             `sink.destination_nsqd_tcp_addresses` is required: set it in the config file or \
             pass `--destination-nsqd-tcp-address`; `sink.destination_topic` is required: set \
             it in the config file or pass `--destination-topic`\n"
                .to_owned()
        )
    );
}
