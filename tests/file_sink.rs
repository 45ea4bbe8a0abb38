//! The file sink (`--sink file`, as `nsq_to_file`) end to end from the test broker: exact
//! records across rotations, gzip files that decompress to the same bytes, the move from the
//! work directory to the output directory, and a write error that requeues without loss.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::RawConfig;
use nsq_dedupe::sidecar::Sidecar;
use tokio::sync::oneshot;

use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;
use crate::util::wait_until_or;

const TOPIC: &str = "archive";
const CHANNEL: &str = "dedupe";

fn record(i: usize) -> Bytes {
    Bytes::from(format!(
        "{{\"id\":{i},\"text\":\"record number {i} \\u00e9\"}}"
    ))
}

fn settings(broker: SocketAddr, sink: &str) -> nsq_dedupe::Settings {
    let sink = format!("kind = \"file\"\nhost_identifier = \"testhost\"\n{sink}");
    RawConfig::from_toml(&settings_text(broker, &sink), "<test>")
        .unwrap()
        .validate()
        .unwrap()
}

fn settings_text(broker: SocketAddr, sink: &str) -> String {
    format!(
        r#"
[source]
nsqd_tcp_addresses = ["{broker}"]
topic = "{TOPIC}"
channel = "{CHANNEL}"
msg_timeout = "5s"
heartbeat_interval = "1s"
backoff = "20ms"
max_backoff = "100ms"

[store]
buckets = 65536

[sink]
{sink}

[metrics]
address = "off"

[shutdown]
grace = "2s"
"#
    )
}

/// A sidecar running in a task.
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<
        Result<nsq_dedupe::sidecar::RunReport, nsq_dedupe::sidecar::RunError>,
    >,
}

impl Running {
    async fn start(settings: nsq_dedupe::Settings) -> Running {
        let sidecar = Sidecar::new(settings).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sidecar.run(async move {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    /// Stops the sidecar; it must end cleanly within 10 s.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// Runs a sidecar with `settings` until `n` messages are finished, then stops it.
async fn archive(broker: &Broker, settings: nsq_dedupe::Settings, n: usize) {
    let running = Running::start(settings).await;
    wait_until_or(
        "every message finished",
        Duration::from_secs(20),
        || broker.finished(TOPIC, CHANNEL).len() == n,
        || format!("{} finished", broker.finished(TOPIC, CHANNEL).len()),
    )
    .await;
    running.stop().await;
}

/// The files of `dir`, sorted by name, with their bytes (gunzipped when `.gz`).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            let raw = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = if name.ends_with(".gz") {
                let mut text = Vec::new();
                flate2::read::MultiGzDecoder::new(&raw[..])
                    .read_to_end(&mut text)
                    .unwrap();
                text
            } else {
                raw
            };
            (name, bytes)
        })
        .collect();
    out.sort();
    out
}

/// Every line of every file, sorted.
fn lines(files: &[(String, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for (name, bytes) in files {
        assert!(
            bytes.ends_with(b"\n") || bytes.is_empty(),
            "{name} ends inside a record"
        );
        lines.extend(
            bytes
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    lines.sort();
    lines
}

fn expected(n: usize) -> Vec<Vec<u8>> {
    let mut all: Vec<Vec<u8>> = (0..n).map(|i| record(i).to_vec()).collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_land_once_across_size_rotations_and_move_to_the_output_dir() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let (out, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // 400 distinct records, each published twice (a replicated stream).
    broker.publish_many(TOPIC, (0..400).map(record));
    broker.publish_many(TOPIC, (0..400).map(record));
    let sink = format!(
        "output_dir = {:?}\nwork_dir = {:?}\nrotate_size = \"2KiB\"",
        out.path().display().to_string(),
        work.path().display().to_string()
    );
    archive(&broker, settings(broker.tcp_addr(), &sink), 800).await;
    let written = files(out.path());
    assert!(written.len() >= 5, "2 KiB files: {} of them", written.len());
    assert_eq!(
        lines(&written),
        expected(400),
        "each record once, byte for byte"
    );
    let names: Vec<&String> = written.iter().map(|(name, _)| name).collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(&format!("{TOPIC}.testhost.")) && n.ends_with(".log")),
        "{names:?}"
    );
    assert!(
        written.iter().any(|(name, _)| name.contains("testhost-1.")),
        "later files of the same hour get a revision: {:?}",
        written.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert!(
        files(work.path()).is_empty(),
        "closed files left the work dir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_file_rotates_by_interval_and_each_burst_gets_its_own_file() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let (out, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sink = format!(
        "output_dir = {:?}\nwork_dir = {:?}\nrotate_interval = \"200ms\"",
        out.path().display().to_string(),
        work.path().display().to_string()
    );
    let running = Running::start(settings(broker.tcp_addr(), &sink)).await;
    for burst in 0..3 {
        let records = burst * 100..(burst + 1) * 100;
        broker.publish_many(TOPIC, records.clone().map(record));
        // The burst's file closes once it is older than the interval, with no new record to
        // trigger it, and moves to the output directory.
        wait_until_or(
            "the burst's file closed and moved",
            Duration::from_secs(10),
            || lines(&files(out.path())) == expected((burst + 1) * 100),
            || {
                format!(
                    "{:?}",
                    files(out.path()).iter().map(|(n, _)| n).collect::<Vec<_>>()
                )
            },
        )
        .await;
        assert!(
            files(work.path()).is_empty(),
            "nothing left open while idle"
        );
        let written = files(out.path());
        for (name, bytes) in &written {
            let ids: Vec<usize> = bytes
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let text = std::str::from_utf8(l).unwrap();
                    text[6..text.find(',').unwrap()].parse().unwrap()
                })
                .collect();
            let bursts: std::collections::HashSet<usize> = ids.iter().map(|id| id / 100).collect();
            assert_eq!(
                bursts.len(),
                1,
                "{name} holds records of one burst only: {bursts:?}"
            );
        }
    }
    running.stop().await;
    assert!(files(out.path()).len() >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_files_decompress_to_the_records() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let out = tempfile::tempdir().unwrap();
    broker.publish_many(TOPIC, (0..300).map(record));
    let sink = format!(
        "output_dir = {:?}\ngzip = true\ngzip_level = 9\nrotate_size = \"1KiB\"\nsync_interval = \"5ms\"",
        out.path().display().to_string()
    );
    archive(&broker, settings(broker.tcp_addr(), &sink), 300).await;
    let written = files(out.path());
    assert!(written.len() >= 2);
    assert!(written.iter().all(|(name, _)| name.ends_with(".log.gz")));
    assert_eq!(lines(&written), expected(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_error_requeues_and_nothing_is_lost() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let out = tempfile::tempdir().unwrap();
    let work = out.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let sink = format!(
        "output_dir = {:?}\nwork_dir = {:?}\nrotate_interval = \"200ms\"",
        out.path().display().to_string(),
        work.display().to_string()
    );
    let running = Running::start(settings(broker.tcp_addr(), &sink)).await;
    broker.publish_many(TOPIC, (0..50).map(record));
    wait_until_or(
        "the first 50",
        Duration::from_secs(10),
        || broker.finished(TOPIC, CHANNEL).len() == 50,
        String::new,
    )
    .await;
    // The work directory vanishes: no file can be opened, every write fails.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    std::fs::remove_dir_all(&work).unwrap();
    broker.publish_many(TOPIC, (50..100).map(record));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        broker.finished(TOPIC, CHANNEL).len(),
        50,
        "nothing finished unwritten"
    );
    std::fs::create_dir(&work).unwrap();
    wait_until_or(
        "the rest",
        Duration::from_secs(20),
        || broker.finished(TOPIC, CHANNEL).len() == 100,
        || format!("{}", broker.finished(TOPIC, CHANNEL).len()),
    )
    .await;
    running.stop().await;
    let written: Vec<_> = files(out.path())
        .into_iter()
        .filter(|(name, _)| name != "work")
        .collect();
    assert_eq!(lines(&written), expected(100), "each record once");
}

/// Sets how large a file of process `pid` may grow (`RLIMIT_FSIZE`'s soft limit; the hard
/// limit stays unlimited, so that it can be raised again): past it a write fails with `EFBIG`
/// as on a full disk, for a process that ignores `SIGXFSZ`.
fn limit_file_size(pid: u32, bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `limit` lives across the call, which only reads it; no old limit is asked for.
    let status = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// A disk that fills mid-stream and is freed again, plain and with gzip: every file left in
/// the output directory reads cleanly (a gzip stream `flate2` decompresses to whole records),
/// none is empty, and every record is in them exactly once: a write that failed is cut off
/// its file before its records are requeued, and each batch is written whole into one file
/// (no `rotate_size` to split it), so nothing is written twice. Once the disk takes writes
/// again, the log says so once, and no warning of a handler failure follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_leaves_only_files_that_read_cleanly_and_loses_nothing() {
    for gzip in [false, true] {
        let broker = Broker::start(BrokerConfig::default()).await;
        let out = tempfile::tempdir().unwrap();
        let nsqd = broker.tcp_addr().to_string();
        let mut args = vec![
            "run",
            "--topic",
            TOPIC,
            "--channel",
            CHANNEL,
            "--nsqd-tcp-address",
            &nsqd,
            "--metrics-address",
            "off",
            "--sink",
            "file",
            "--output-dir",
            out.path().to_str().unwrap(),
            "--rotate-interval",
            "200ms",
            "--backoff",
            "20ms",
            "--max-backoff",
            "200ms",
        ];
        if gzip {
            args.push("--gzip");
        }
        // SIGXFSZ ignored (and so ignored in the program `exec` starts): a write past the
        // limit fails instead of killing the process.
        let running = Child::spawn(
            std::process::Command::new("sh")
                .arg("-c")
                .arg(r#"trap "" XFSZ; exec "$0" "$@""#)
                .arg(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
                .args(&args)
                .env("RUST_LOG", "info")
                .stdin(std::process::Stdio::null()),
        );
        let finished = |n: usize| {
            let broker = &broker;
            move || broker.finished(TOPIC, CHANNEL).len() == n
        };
        broker.publish_many(TOPIC, (0..300).map(record));
        wait_until_or(
            "300 archived",
            Duration::from_secs(20),
            finished(300),
            || running.stderr(),
        )
        .await;

        // The disk fills: no file may grow past one byte.
        limit_file_size(running.id(), 1);
        broker.publish_many(TOPIC, (300..600).map(record));
        let failed_writes = |log: &str| log.matches("Writing the archive file failed").count();
        wait_until_or(
            "five failed writes",
            Duration::from_secs(10),
            || failed_writes(&running.stderr()) >= 5,
            || running.stderr(),
        )
        .await;
        assert_eq!(
            broker.finished(TOPIC, CHANNEL).len(),
            300,
            "nothing finished unwritten"
        );

        // Freed again, with the stream going on for a while.
        limit_file_size(running.id(), libc::RLIM_INFINITY);
        for chunk in 0..30 {
            let first = 600 + chunk * 10;
            broker.publish_many(TOPIC, (first..first + 10).map(record));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_until_or(
            "900 archived",
            Duration::from_secs(30),
            finished(900),
            || running.stderr(),
        )
        .await;
        running.signal("TERM");
        let stopped = running.finish_within(Duration::from_secs(20)).await;
        assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);

        let mut all = Vec::new();
        for entry in std::fs::read_dir(out.path()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let raw = std::fs::read(&path).unwrap();
            assert!(!raw.is_empty(), "gzip {gzip}: {name} is empty");
            let text = if gzip {
                assert!(name.ends_with(".log.gz"), "{name}");
                let mut text = Vec::new();
                flate2::read::MultiGzDecoder::new(&raw[..])
                    .read_to_end(&mut text)
                    .unwrap_or_else(|error| panic!("{name} does not decompress: {error}"));
                text
            } else {
                raw
            };
            all.push((name, text));
        }
        assert_eq!(lines(&all), expected(900), "gzip {gzip}: each record once");

        let log: Vec<&str> = stopped.stderr.lines().collect();
        let last_failure = (0..log.len())
            .rev()
            .find(|&i| log[i].contains("Writing the archive file failed"))
            .unwrap();
        let back: Vec<usize> = (0..log.len())
            .filter(|&i| log[i].contains("Handler succeeds again."))
            .collect();
        assert_eq!(back.len(), 1, "said once: {}", stopped.stderr);
        assert!(
            back[0] > last_failure && log[back[0]].contains(" INFO "),
            "{}",
            stopped.stderr
        );
        let warned: Vec<&&str> = log[back[0]..]
            .iter()
            .filter(|line| line.contains(" WARN ") || line.contains("Handler failed"))
            .collect();
        assert!(warned.is_empty(), "after the disk came back: {warned:#?}");
    }
}

/// The file sink against the `null` sink: 200,000 distinct 100-byte bodies from the test
/// broker, max-in-flight 2500, plain and gzip, as ratios to `null` in the same run (medians of
/// 3 interleaved rounds).
///
/// `cargo test --release --test integration file_sink::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 200_000;
    let body = |i: usize| {
        let mut text = format!(
            "{{\"id\":{i},\"sensor\":\"s-{}\",\"value\":{},\"pad\":\"",
            i % 97,
            i * 7 % 1009
        );
        while text.len() < 98 {
            text.push('x');
        }
        text.push_str("\"}");
        Bytes::from(text)
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for _round in 0..3 {
        for (variant, rates) in rates.iter_mut().enumerate() {
            let broker = Broker::start(BrokerConfig {
                record_messages: false,
                ..BrokerConfig::default()
            })
            .await;
            broker.publish_many(TOPIC, (0..N).map(body));
            let out = tempfile::tempdir().unwrap();
            let sink = match variant {
                0 => "kind = \"null\"".to_owned(),
                1 => format!("output_dir = {:?}", out.path().display().to_string()),
                _ => format!(
                    "output_dir = {:?}\ngzip = true",
                    out.path().display().to_string()
                ),
            };
            let mut raw = RawConfig::from_toml(
                &settings_text(broker.tcp_addr(), &sink).replace(
                    "kind = \"file\"\n",
                    if variant == 0 {
                        ""
                    } else {
                        "kind = \"file\"\n"
                    },
                ),
                "<bench>",
            )
            .unwrap();
            raw.source.max_in_flight = Some(2500);
            let started = std::time::Instant::now();
            archive(&broker, raw.validate().unwrap(), N).await;
            rates.push(N as f64 / started.elapsed().as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = rates.iter_mut().map(median).collect();
    for (name, rate) in ["null", "file", "file+gzip"].iter().zip(&medians) {
        println!(
            "sink {name:>10}: {rate:>8.0} msgs/s, {:.2} of null",
            rate / medians[0]
        );
    }
}
