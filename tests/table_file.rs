//! The sidecar stopped and started again on its table file (`--table-file`): copies of what
//! it saw before are not delivered again, after a graceful stop and after a kill -9 (for what
//! the last snapshot held), and nothing is lost either way.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cli_errors::run_refused;
use crate::support::broker::{Broker, BrokerConfig};
use crate::util::wait_until;

const TOPIC: &str = "events";
const CHANNEL: &str = "dedupe";

fn body(i: usize) -> Bytes {
    Bytes::from(format!("{{\"id\":{i},\"v\":\"payload {i}\"}}"))
}

/// A running sidecar, killed when dropped.
pub(crate) struct Sidecar(pub(crate) Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Sidecar {
    /// Starts `run` against `broker` with the table in `table`, appending its stdout (the
    /// sink) to `out` and its log to `log`.
    fn start(broker: &Broker, table: &Path, out: &Path, log: &Path, extra: &[&str]) -> Sidecar {
        Sidecar::start_sized(broker, table, out, log, "131072", extra)
    }

    /// [`Sidecar::start`] with a table of `buckets`.
    fn start_sized(
        broker: &Broker,
        table: &Path,
        out: &Path,
        log: &Path,
        buckets: &str,
        extra: &[&str],
    ) -> Sidecar {
        let append = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap()
        };
        let child = Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .args(["run", "--topic", TOPIC, "--channel", CHANNEL])
            .args(["--nsqd-tcp-address", &broker.tcp_addr().to_string()])
            .args(["--metrics-address", "off", "--buckets", buckets])
            .arg("--table-file")
            .arg(table)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(append(out))
            .stderr(append(log))
            .spawn()
            .unwrap();
        Sidecar(child)
    }

    fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }

    /// Sends `signal`, waits for the process to exit, then for `broker` to see its connection
    /// close. Until nsqd sees that, it still counts the consumer's RDY and sends it messages
    /// published meanwhile; those, like any in flight to a consumer that went away, nsqd
    /// redelivers only after the message timeout (60 s), long after the next process started.
    async fn stop(&mut self, signal: &str, broker: &Broker) -> std::process::ExitStatus {
        self.signal(signal);
        let status = self.wait();
        wait_until(
            "nsqd to see the consumer's connection close",
            Duration::from_secs(60),
            || broker.clients().is_empty(),
        )
        .await;
        status
    }
}

/// The bodies `range` as the stdout sink writes them, sorted.
fn sorted_bodies(range: std::ops::Range<usize>) -> Vec<String> {
    let mut bodies: Vec<String> = range
        .map(|i| String::from_utf8(body(i).to_vec()).unwrap())
        .collect();
    bodies.sort();
    bodies
}

/// Stops `sidecar` gracefully and returns the lines of `out`, sorted.
fn stopped_with_sorted_output(mut sidecar: Sidecar, out: &Path) -> Vec<String> {
    sidecar.signal("-TERM");
    assert!(sidecar.wait().success());
    let mut delivered = lines(out);
    delivered.sort();
    delivered
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until `n` messages of `broker` are finished. On a loaded machine the sidecar may
/// take long for them all, but each FIN moves the count on: the wait fails when none has been
/// finished for 30 s (the sidecar stalled), not after a time fixed for all of them.
async fn finished(broker: &Broker, n: usize, log: &Path) {
    const STALL: Duration = Duration::from_secs(30);
    let mut last = (usize::MAX, Instant::now());
    loop {
        let count = broker.finished(TOPIC, CHANNEL).len();
        if count == n {
            return;
        }
        if count != last.0 {
            last = (count, Instant::now());
        }
        assert!(
            last.1.elapsed() < STALL,
            "{count} of {n} messages finished, and none for {STALL:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_stop_no_copy_is_delivered() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish_many(TOPIC, (0..500).map(body));
    let mut first = Sidecar::start(&broker, &table, &out, &log, &[]);
    finished(&broker, 500, &log).await;
    assert!(first.stop("-TERM", &broker).await.success());
    assert_eq!(lines(&out).len(), 500);

    // The copies, and 100 new bodies, to a new process on the same file.
    broker.publish_many(TOPIC, (0..600).map(body));
    let mut second = Sidecar::start(&broker, &table, &out, &log, &[]);
    finished(&broker, 1100, &log).await;
    second.signal("-TERM");
    assert!(second.wait().success());
    let delivered = lines(&out);
    assert_eq!(
        delivered.len(),
        600,
        "600 distinct bodies, delivered once each"
    );
    let expected: Vec<String> = (0..600)
        .map(|i| String::from_utf8(body(i).to_vec()).unwrap())
        .collect();
    let mut sorted = delivered.clone();
    sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(sorted, expected_sorted, "each body once, across both runs");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("Table loaded from its file.") && log.contains("entries=500"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_copies_older_than_the_last_snapshot_are_not_delivered() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish_many(TOPIC, (0..500).map(body));
    let snapshots = ["--snapshot-interval", "200ms"];
    let mut first = Sidecar::start(&broker, &table, &out, &log, &snapshots);
    finished(&broker, 500, &log).await;
    // Two intervals: a snapshot was written after the last message was claimed.
    tokio::time::sleep(Duration::from_millis(600)).await;
    first.stop("-KILL", &broker).await;

    broker.publish_many(TOPIC, (0..500).map(body));
    broker.publish_many(TOPIC, (500..550).map(body));
    let mut second = Sidecar::start(&broker, &table, &out, &log, &snapshots);
    finished(&broker, 1050, &log).await;
    second.signal("-TERM");
    assert!(second.wait().success());
    let mut delivered = lines(&out);
    assert_eq!(
        delivered.len(),
        550,
        "550 distinct bodies, delivered once each"
    );
    delivered.sort();
    let mut expected: Vec<String> = (0..550)
        .map(|i| String::from_utf8(body(i).to_vec()).unwrap())
        .collect();
    expected.sort();
    assert_eq!(delivered, expected, "each body once: no copy, nothing lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_right_after_the_last_commit_no_copy_is_delivered() {
    killed_right_after_the_last_write(&[]).await;
}

/// The null sink's messages are claimed done at once, with no commit after: the journal
/// records each such claim as a commit, so a kill -9 right after forgets none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_the_null_sinks_messages_are_still_known() {
    killed_right_after_the_last_write(&["--sink", "null"]).await;
}

/// A sidecar run with `first_args` over 500 bodies, killed (-9) as soon as all are finished,
/// with no snapshot written meanwhile (the default interval is 10 s); then a second one (the
/// stdout sink) over their copies and 50 new bodies: only the new ones are delivered, and it
/// replays 500 commits from the journal.
async fn killed_right_after_the_last_write(first_args: &[&str]) {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish_many(TOPIC, (0..500).map(body));
    let mut first = Sidecar::start(&broker, &table, &out, &log, first_args);
    finished(&broker, 500, &log).await;
    // Every FIN arrived, so every commit (or claim done) was journalled; kill at once.
    first.stop("-KILL", &broker).await;
    let mut expected = lines(&out);
    let written = if first_args.contains(&"null") { 0 } else { 500 };
    assert_eq!(expected.len(), written, "what the first run's sink wrote");

    broker.publish_many(TOPIC, (0..550).map(body));
    let second = Sidecar::start(&broker, &table, &out, &log, &[]);
    finished(&broker, 1050, &log).await;
    expected.extend(sorted_bodies(500..550));
    expected.sort();
    assert_eq!(
        stopped_with_sorted_output(second, &out),
        expected,
        "none of the 500 copies delivered again, the 50 new ones once: no copy, nothing lost"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("journal_commits=500"), "{log}");
}

/// A table file written at 262,144 buckets, `run` again at 1,048,576: the file's table is
/// resized, not refused or emptied. The 5,000 messages it saw, sent again, give no delivery,
/// and 2,000 new ones are delivered once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_file_of_fewer_buckets_is_resized_and_forgets_nothing() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish_many(TOPIC, (0..5000).map(body));
    let mut first = Sidecar::start_sized(&broker, &table, &out, &log, "262144", &[]);
    finished(&broker, 5000, &log).await;
    assert!(first.stop("-TERM", &broker).await.success());
    assert_eq!(lines(&out).len(), 5000);

    broker.publish_many(TOPIC, (0..7000).map(body));
    let second = Sidecar::start_sized(&broker, &table, &out, &log, "1048576", &[]);
    finished(&broker, 12000, &log).await;
    assert_eq!(
        stopped_with_sorted_output(second, &out),
        sorted_bodies(0..7000),
        "the 5,000 copies not delivered again, the 2,000 new ones once each"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("Table file resized from 262144 to 1048576 slots"),
        "{log}"
    );
}

/// A kill -9 of `run` mid-resize: the snapshot written at its start holds both generations
/// and the journal what followed, so a restart delivers no copy of what either held (the
/// 5,000 of the file's old table, the 2,000 of the new one) and every new message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_a_resize_forgets_neither_generation() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish_many(TOPIC, (0..5000).map(body));
    let mut first = Sidecar::start_sized(&broker, &table, &out, &log, "262144", &[]);
    finished(&broker, 5000, &log).await;
    assert!(first.stop("-TERM", &broker).await.success());

    broker.publish_many(TOPIC, (0..7000).map(body));
    // No snapshot but the one at the start: what follows it is in the journal alone.
    let no_snapshot = ["--snapshot-interval", "1h"];
    let mut second = Sidecar::start_sized(&broker, &table, &out, &log, "1048576", &no_snapshot);
    finished(&broker, 12000, &log).await;
    // Every FIN arrived, so every commit was journalled; no snapshot since the start.
    second.stop("-KILL", &broker).await;
    assert_eq!(lines(&out).len(), 7000);

    broker.publish_many(TOPIC, (0..8000).map(body));
    let third = Sidecar::start_sized(&broker, &table, &out, &log, "1048576", &[]);
    finished(&broker, 20000, &log).await;
    assert_eq!(
        stopped_with_sorted_output(third, &out),
        sorted_bodies(0..8000),
        "no copy of either generation delivered, the 1,000 new ones once each"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("journal_commits=2000"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_file_is_refused() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (table, out, log) = files(&dir);
    broker.publish(TOPIC, body(1));
    let mut first = Sidecar::start(&broker, &table, &out, &log, &[]);
    finished(&broker, 1, &log).await;
    let second = Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
        .args(["run", "--topic", TOPIC, "--nsqd-tcp-address", "127.0.0.1:1"])
        .args([
            "--metrics-address",
            "off",
            "--buckets",
            "131072",
            "--table-file",
        ])
        .arg(&table)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&second.stderr)
            .lines()
            .last()
            .unwrap(),
        format!(
            "error: table file {} is in use by process {} (its lock {}.lock is held); stop it, \
             or give this process another file",
            table.display(),
            first.0.id(),
            table.display()
        )
    );
    first.signal("-TERM");
    assert!(first.wait().success());
}

/// A table file of 8192 slots in `dir`, written by `filter`.
fn table_of_8192_slots(dir: &Path) -> std::path::PathBuf {
    let table = dir.join("table");
    crate::util::bin()
        .args(["filter", "--buckets", "8192", "--table-file"])
        .arg(&table)
        .write_stdin("a\n")
        .assert()
        .success();
    table
}

/// A table file written for another table, or in a directory that does not exist, is a
/// setting error: `run` stops at once with status 78 (which the service does not restart)
/// and says what to change.
#[test]
fn a_table_file_for_other_settings_or_without_its_directory_is_a_setting_error() {
    let dir = tempfile::tempdir().unwrap();
    let table = table_of_8192_slots(dir.path());
    let run = |table: &Path, extra: &[&str]| {
        let mut args = vec!["--topic", TOPIC, "--nsqd-tcp-address", "127.0.0.1:1"];
        args.extend(["--metrics-address", "off", "--table-file"]);
        args.push(table.to_str().unwrap());
        args.extend_from_slice(extra);
        let (code, stderr) = run_refused(&[], &args);
        (code, stderr.lines().last().unwrap_or_default().to_owned())
    };
    let start_fresh = "start fresh by moving the file away (the table starts empty) or with \
                       `--table-file-on-mismatch recreate`";
    assert_eq!(
        run(
            &table,
            &["--buckets", "16384", "--table-file-on-mismatch", "error"]
        ),
        (
            78,
            format!(
                "error: table file {} was written for 8192 slots in sets of 8 ways, not 16384 \
                 in sets of 8; {start_fresh}",
                table.display()
            )
        )
    );
    assert_eq!(
        run(&table, &["--buckets", "8192", "--key", "json:/id"]),
        (
            78,
            format!(
                "error: table file {} was written for digests of \"body xxh3\", not \
                 \"json:/id xxh3\"; {start_fresh}",
                table.display()
            )
        )
    );
    let missing = dir.path().join("missing");
    assert_eq!(
        run(&missing.join("table"), &["--buckets", "8192"]),
        (
            78,
            format!(
                "error: table file {}: its directory {} does not exist; create it, or give \
                 another `--table-file`",
                missing.join("table").display(),
                missing.display()
            )
        )
    );
}

/// From a config file, the table file's settings keep their keys in `run`'s errors; the flags
/// that gave them are named instead, and a variable by its name.
#[test]
fn a_table_file_error_names_its_settings_as_they_were_given() {
    let dir = tempfile::tempdir().unwrap();
    let table = table_of_8192_slots(dir.path());
    let config = dir.path().join("events.toml");
    let missing = dir.path().join("missing").join("table");
    let write_config = |table: &Path| {
        std::fs::write(
            &config,
            format!(
                "[source]\ntopic = \"{TOPIC}\"\nnsqd_tcp_addresses = [\"127.0.0.1:1\"]\n\
                 [metrics]\naddress = \"off\"\n\
                 [store]\nbuckets = 16384\ntable_file = {:?}\n\
                 table_file_on_mismatch = \"error\"\n",
                table.display().to_string()
            ),
        )
        .unwrap();
    };
    let run = |env: &[(&str, &str)]| {
        let (code, stderr) = run_refused(env, &["--config", config.to_str().unwrap()]);
        (code, stderr.lines().last().unwrap_or_default().to_owned())
    };
    let mismatch = |recreate: &str| {
        (
            78,
            format!(
                "error: table file {} was written for 8192 slots in sets of 8 ways, not 16384 \
                 in sets of 8; start fresh by moving the file away (the table starts empty) or \
                 with {recreate}",
                table.display()
            ),
        )
    };
    write_config(&table);
    assert_eq!(
        run(&[]),
        mismatch("`store.table_file_on_mismatch = \"recreate\"`")
    );
    assert_eq!(
        run(&[("NSQ_DEDUPE_TABLE_FILE_ON_MISMATCH", "error")]),
        mismatch("`NSQ_DEDUPE_TABLE_FILE_ON_MISMATCH=recreate`")
    );
    write_config(&missing);
    assert_eq!(
        run(&[]),
        (
            78,
            format!(
                "error: table file {}: its directory {} does not exist; create it, or give \
                 another `store.table_file`",
                missing.display(),
                missing.parent().unwrap().display()
            )
        )
    );
}

/// What the table file costs: the time to write and to load a 512 MiB table (2^26 slots), and
/// `contains_and_add` single-thread throughput while snapshots are written back to back,
/// against none, in the same run (medians of 3).
///
/// `cargo test --release --test integration table_file::cost -- --ignored --nocapture`
#[test]
#[ignore = "benchmark; run explicitly in release mode"]
fn cost() {
    use nsq_dedupe::dedup::table_file::{OnMismatch, TableFile};
    use nsq_dedupe::{DigestAlgorithm, Geometry};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let geometry = Geometry::new(1 << 26, 8).unwrap();
    let (file, table, _) =
        TableFile::open(&path, geometry, "body xxh3", OnMismatch::Error, None).unwrap();
    table.prefault();
    let digests: Vec<_> = (0u64..4_000_000)
        .map(|i| DigestAlgorithm::default().digest(&i.to_le_bytes()))
        .collect();
    let rate = |table: &nsq_dedupe::Table| {
        let started = Instant::now();
        for d in &digests {
            std::hint::black_box(table.contains_and_add(*d));
        }
        digests.len() as f64 / started.elapsed().as_secs_f64()
    };
    rate(&table);
    let mut saves = Vec::new();
    let (mut quiet, mut busy) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        quiet.push(rate(&table));
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    saves.push(file.save(&table).unwrap().took);
                }
            });
            busy.push(rate(&table));
            stop.store(true, Ordering::Relaxed);
        });
    }
    drop((file, table));
    let started = Instant::now();
    let (_file, _table, report) =
        TableFile::open(&path, geometry, "body xxh3", OnMismatch::Error, None).unwrap();
    let load = started.elapsed();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    saves.sort();
    let (quiet, busy) = (median(&mut quiet), median(&mut busy));
    println!(
        "table file, 2^26 slots (512 MiB): snapshot written in {:?} (median of {}), loaded in \
         {load:?} ({} entries); contains_and_add {:.0}/s alone, {:.0}/s while snapshots run \
         back to back: {:.2}",
        saves[saves.len() / 2],
        saves.len(),
        report.entries,
        quiet,
        busy,
        busy / quiet
    );
}

/// What the journal costs: `contains_and_add` with and without a journal append after it
/// (single thread, medians of 3), the bytes it writes, and the time to start on a 512 MiB table
/// file whose journal holds 5 M commits (a snapshot is asked for early at 8 M): loading,
/// replaying and the snapshot written at start.
///
/// `cargo test --release --test integration table_file::journal_cost -- --ignored --nocapture`
#[test]
#[ignore = "benchmark; run explicitly in release mode"]
fn journal_cost() {
    use nsq_dedupe::dedup::journal::Journal;
    use nsq_dedupe::dedup::table_file::{OnMismatch, TableFile};
    use nsq_dedupe::{DigestAlgorithm, Geometry};
    use std::time::Instant;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let geometry = Geometry::new(1 << 26, 8).unwrap();
    let open = || {
        let (file, table, loaded) =
            TableFile::open(&path, geometry, "body xxh3", OnMismatch::Error, None).unwrap();
        let (journal, report) = Journal::open(&file, loaded.journal, &table, false).unwrap();
        (file, table, journal, report)
    };
    let (file, table, journal, _) = open();
    table.prefault();
    let records = 8u64 << 20;
    let digests: Vec<_> = (0..records)
        .map(|i| DigestAlgorithm::default().digest(&i.to_le_bytes()))
        .collect();
    let chunk = digests.len() / 8;
    let (mut plain, mut journalled) = (Vec::new(), Vec::new());
    for round in 0..3 {
        // Distinct digests in each pass, so that every one is new to the table.
        let part = &digests[2 * round * chunk..(2 * round + 1) * chunk];
        let started = Instant::now();
        for d in part {
            std::hint::black_box(table.contains_and_add(*d));
        }
        plain.push(part.len() as f64 / started.elapsed().as_secs_f64());
        let part = &digests[(2 * round + 1) * chunk..(2 * round + 2) * chunk];
        let started = Instant::now();
        for d in part {
            std::hint::black_box(table.contains_and_add(*d));
            journal.commit(*d);
        }
        journalled.push(part.len() as f64 / started.elapsed().as_secs_f64());
    }
    for d in &digests[6 * chunk..] {
        table.contains_and_add(*d);
        journal.commit(*d);
    }
    assert_eq!(journal.unjournalled(), 0);
    // Gone without a snapshot, as after a kill -9.
    drop((file, table, journal));
    let started = Instant::now();
    let (_file, table, _journal, report) = open();
    let start = started.elapsed();
    // The first journalled digest and the last: the plain passes' digests were never journalled.
    assert!(table.contains(digests[chunk]) && table.contains(digests[digests.len() - 1]));
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (plain, journalled) = (median(&mut plain), median(&mut journalled));
    println!(
        "journal, 2^26 slots (512 MiB): contains_and_add {plain:.0}/s alone, {journalled:.0}/s \
         with a journal append: {:.2}; 24 bytes per commit ({:.1} MB/s at 150,000 commits/s); \
         start with {} commits in the journal: {start:?} (load, replay and a snapshot)",
        journalled / plain,
        24.0 * 150_000.0 / 1e6,
        report.commits,
    );
}

/// The table file, the sink's output and the log of a test's runs, in `dir`.
fn files(dir: &tempfile::TempDir) -> (PathBuf, PathBuf, PathBuf) {
    let path = |name| dir.path().join(name);
    (path("table"), path("out"), path("log"))
}
