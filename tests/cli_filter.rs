//! `nsq-dedupe filter`: exact output, counts, odd input and a closed stdout.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use predicates::prelude::*;

use crate::util::bin;

#[test]
fn writes_first_copies_in_order_byte_for_byte() {
    let input: &[u8] = b"one\ntwo\none\n\xff\x00bin\r\ntwo\n\xff\x00bin\r\nthree";
    bin()
        .arg("filter")
        .write_stdin(input)
        .assert()
        .success()
        .stdout(&b"one\ntwo\n\xff\x00bin\r\nthree"[..])
        .stderr("");
}

#[test]
fn empty_input_and_a_last_record_without_newline() {
    bin()
        .arg("filter")
        .write_stdin("")
        .assert()
        .success()
        .stdout("");
    bin()
        .arg("filter")
        .write_stdin("a\na")
        .assert()
        .success()
        .stdout("a\n");
    bin()
        .arg("filter")
        .write_stdin("\n\n\n")
        .assert()
        .success()
        .stdout("\n");
}

#[test]
fn very_long_lines_pass_whole() {
    let long = "x".repeat(3 << 20);
    let input = format!("{long}\nshort\n{long}\n{long}y\n");
    let out = bin()
        .arg("filter")
        .write_stdin(input)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(out, format!("{long}\nshort\n{long}y\n").into_bytes());
}

#[test]
fn reads_files_and_stdin_in_order_with_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.txt");
    let second = dir.path().join("second.txt");
    std::fs::write(&first, "a\nb\n").unwrap();
    std::fs::write(&second, "b\nc\n").unwrap();
    bin()
        .arg("filter")
        .arg(&first)
        .arg("-")
        .arg(&second)
        .write_stdin("a\nd\n")
        .assert()
        .success()
        .stdout("a\nb\nd\nc\n");
}

#[test]
fn stats_report_counts_table_and_probability() {
    bin()
        .args(["filter", "--stats", "--buckets", "1024", "--ways", "8"])
        .write_stdin("a\nb\na\nc\nb\na\n")
        .assert()
        .success()
        .stdout("a\nb\nc\n")
        .stderr(
            "\
records in:          6
records out:         3
duplicates dropped:  3
keyless (passed):    0
table:               1,024 buckets in sets of 8 (8.0 KiB), 3 occupied
catch probability:   1 for a copy arriving after all 3 distinct records
",
        );
}

#[test]
fn json_keys_pass_keyless_records_or_stop_on_them() {
    let input =
        "{\"id\":\"a\",\"n\":1}\nplain text\n{\"id\":\"a\",\"n\":2}\n{\"n\":3}\nplain text\n";
    bin()
        .args(["filter", "--key", "json:/id", "--stats"])
        .write_stdin(input)
        .assert()
        .success()
        .stdout("{\"id\":\"a\",\"n\":1}\nplain text\n{\"n\":3}\nplain text\n")
        .stderr(predicate::str::contains("keyless (passed):    3\n"));
    bin()
        .args(["filter", "--key", "json:/id", "--on-missing-key", "error"])
        .write_stdin(input)
        .assert()
        .failure()
        .stdout("{\"id\":\"a\",\"n\":1}\n")
        .stderr(
            "error: while filtering stdin: record 2 has no key: body is not valid JSON \
             (expected value at line 1 column 1), so key `json:/id` cannot be read; \
             pass `--on-missing-key pass` to let such records through\n",
        );
}

#[test]
fn md5_and_seeded_digests_give_the_same_answer() {
    for digest in ["md5", "xxh3:12345"] {
        bin()
            .args(["filter", "--digest", digest])
            .write_stdin("x\ny\nx\n")
            .assert()
            .success()
            .stdout("x\ny\n");
    }
}

#[test]
fn a_keyed_digest_gives_the_same_answer_and_a_bad_key_file_is_named() {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), [9u8; 32]).unwrap();
    bin()
        .args(["filter", "--digest-key-file"])
        .arg(key.path())
        .write_stdin("x\ny\nx\n")
        .assert()
        .success()
        .stdout("x\ny\n");
    let short = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(short.path(), b"0123").unwrap();
    bin()
        .args(["filter", "--digest-key-file"])
        .arg(short.path())
        .write_stdin("x\n")
        .assert()
        .code(1)
        .stdout("")
        .stderr(format!(
            "error: invalid `--digest-key-file` = {:?}: expected 32 bytes or 64 hexadecimal \
             digits, found 4 hexadecimal digits; make a key with `head -c 32 /dev/urandom > FILE`\n",
            short.path().display().to_string()
        ));
}

#[test]
fn a_hex_key_file_counts_its_digits_and_names_what_is_not_hex() {
    let key = tempfile::NamedTempFile::new().unwrap();
    let refused = |contents: String| {
        std::fs::write(key.path(), contents).unwrap();
        let out = bin()
            .args(["filter", "--digest-key-file"])
            .arg(key.path())
            .write_stdin("x\n")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    let prefix = format!(
        "error: invalid `--digest-key-file` = {:?}: ",
        key.path().display().to_string()
    );
    assert_eq!(
        refused(format!("{}\n", "a".repeat(63))),
        (
            Some(1),
            format!(
                "{prefix}expected 32 bytes or 64 hexadecimal digits, found 63 hexadecimal \
                 digits; make a key with `head -c 32 /dev/urandom > FILE`\n"
            )
        )
    );
    assert_eq!(
        refused(format!("0x{}g\n", "a".repeat(61))),
        (
            Some(1),
            format!(
                "{prefix}expected 32 bytes or 64 hexadecimal digits (0-9, a-f), found 64 \
                 characters of which 2 are not hexadecimal (characters 2, 64); make a key with \
                 `head -c 32 /dev/urandom > FILE`\n"
            )
        )
    );
}

#[test]
fn bad_flags_and_missing_files_are_reported() {
    bin()
        .args(["filter", "--digest", "sha1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "invalid value 'sha1' for '--digest <DIGEST>': expected `xxh3`, `xxh3:<seed>`, `md5`, or `blake3` with a digest key file",
        ));
    bin()
        .args(["filter", "--memory", "10"])
        .write_stdin("a\n")
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "invalid `--memory`: a budget of 10 B holds no complete set of 8 slots",
        ));
    bin()
        .args(["filter", "/nonexistent/input.txt"])
        .assert()
        .failure()
        .stderr("error: cannot open input file `/nonexistent/input.txt`: No such file or directory (os error 2)\n");
}

#[test]
fn a_closed_stdout_ends_quietly_with_success() {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
        .arg("filter")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // Enough distinct records to overflow the pipe and the output buffer; ignore the
        // error once the child has exited.
        for i in 0..2_000_000u32 {
            if writeln!(stdin, "record {i}").is_err() {
                break;
            }
        }
    });
    let mut first = [0u8; 9];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    assert_eq!(&first, b"record 0\n");
    // stdout is dropped here: the child's next write fails with a broken pipe.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "filter did not exit after stdout closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    writer.join().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "exit status {status}, stderr: {stderr}");
    assert_eq!(stderr, "");
}

#[test]
fn a_file_without_a_last_newline_is_not_glued_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.txt");
    let second = dir.path().join("second.txt");
    std::fs::write(&first, "a").unwrap();
    std::fs::write(&second, "b\nc").unwrap();
    bin()
        .arg("filter")
        .arg(&first)
        .arg(&second)
        .assert()
        .success()
        .stdout("a\nb\nc");
    // The same record with and without its newline is one key.
    std::fs::write(&second, "a\nb").unwrap();
    bin()
        .arg("filter")
        .arg(&first)
        .arg(&second)
        .arg("-")
        .write_stdin("b\nd")
        .assert()
        .success()
        .stdout("a\nb\nd");
}

#[test]
fn a_table_file_remembers_across_runs_and_is_resized_to_another_size() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let run = |input: &'static str, memory: &str, extra: &[&str]| {
        bin()
            .args(["filter", "--memory", memory, "--table-file"])
            .arg(&table)
            .args(extra)
            .write_stdin(input)
            .assert()
    };
    run("a\nb\na\n", "64KiB", &[]).success().stdout("a\nb\n");
    run("b\nc\nd\n", "64KiB", &[]).success().stdout("c\nd\n");
    run("a\nd\ne\n", "64KiB", &[]).success().stdout("e\n");
    run("x\n", "64KiB", &["--key", "json:/id"])
        .code(1)
        .stdout("")
        .stderr(format!(
            "error: table file {} was written for digests of \"body xxh3\", not \"json:/id xxh3\"; \
             start fresh by moving the file away (the table starts empty) or with \
             `--table-file-on-mismatch recreate`\n",
            table.display()
        ));
    // Another size: the file's table is kept behind the new one, and what it held is seen.
    run("a\ng\n", "128KiB", &[])
        .success()
        .stdout("g\n")
        .stderr(predicate::str::contains(
            "Table file resized from 8192 to 16384 slots",
        ));
    run("a\n", "256KiB", &["--table-file-on-mismatch", "error"])
        .code(1)
        .stderr(predicate::str::contains(
            "was written for 16384 slots in sets of 8 ways, not 32768 in sets of 8",
        ));
    // What the refused runs saw was not remembered; back at the first size, nothing is lost.
    run("e\nf\ng\nx\n", "64KiB", &[]).success().stdout("f\nx\n");
}

/// A table file written at 262,144 buckets, read at 1,048,576: the 5,000 records it held are
/// not written again, 2,000 new ones are written once each, and a third run at the new size
/// still holds all 7,000 (the file kept both generations).
#[test]
fn a_table_file_resized_to_more_buckets_forgets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let records = |range: std::ops::Range<usize>| -> String {
        range.map(|i| format!("{{\"id\":{i}}}\n")).collect()
    };
    let run = |buckets: &str, input: String| {
        bin()
            .args(["filter", "--buckets", buckets, "--table-file"])
            .arg(&table)
            .write_stdin(input)
            .assert()
            .success()
    };
    run("262144", records(0..5000)).stdout(records(0..5000));
    run("1048576", records(0..7000))
        .stdout(records(5000..7000))
        .stderr(predicate::str::contains(
            "Table file resized from 262144 to 1048576 slots",
        ));
    run("1048576", records(0..7000)).stdout("");
}

#[test]
fn max_age_lets_a_key_pass_again_once_it_is_older() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let run = |input: &'static str| {
        bin()
            .args([
                "filter",
                "--memory",
                "64KiB",
                "--max-age",
                "1s",
                "--table-file",
            ])
            .arg(&table)
            .write_stdin(input)
            .assert()
    };
    run("a\nb\na\n").success().stdout("a\nb\n");
    run("a\n").success().stdout("");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    run("a\nc\n").success().stdout("a\nc\n");
    run("a\nb\n").success().stdout("b\n");
}

#[test]
fn a_record_without_an_end_is_refused_not_held_without_bound() {
    // `/dev/zero` never ends a record: the run stops at 64 MiB, after writing the records
    // before it, instead of growing until the allocator aborts (here at 1 GiB of address
    // space, so that a failure is quick and spares the machine).
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    std::fs::write(&first, "a\nb\na\n").unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 1048576; exec "$0" filter --memory 64KiB "$1" /dev/zero"#)
        .arg(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
        .arg(&first)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            out.stdout.as_slice(),
            String::from_utf8(out.stderr).unwrap()
        ),
        (
            Some(1),
            &b"a\nb\n"[..],
            "error: while filtering `/dev/zero`: record 4 has no newline within its first 64.0 \
             MiB: records are at most that long, their newline included; split longer records, \
             or check that the input is newline-delimited\n"
                .to_owned()
        )
    );
}

#[test]
fn a_record_without_its_field_names_the_key_not_a_config_setting() {
    bin()
        .args(["filter", "--key", "json:/id", "--on-missing-key", "error"])
        .write_stdin("{\"n\":1}\n")
        .assert()
        .code(1)
        .stdout("")
        .stderr(
            "error: while filtering stdin: record 1 has no key: body has no field at JSON \
             pointer `/id` of the key `json:/id`; pass `--on-missing-key pass` to let such \
             records through\n",
        );
}

#[test]
fn a_recreated_table_file_is_logged_under_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    std::fs::write(&table, b"not a table file").unwrap();
    let out = bin()
        .args([
            "filter",
            "--memory",
            "64KiB",
            "--table-file-on-mismatch",
            "recreate",
        ])
        .arg("--table-file")
        .arg(&table)
        .write_stdin("a\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("Starting with an empty table (`--table-file-on-mismatch recreate`)."),
        "{stderr}"
    );
    assert!(!stderr.contains("store."), "{stderr}");
}

#[test]
fn filter_takes_blake3_with_its_key_as_run_does() {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), [9u8; 32]).unwrap();
    bin()
        .args(["filter", "--digest", "blake3", "--digest-key-file"])
        .arg(key.path())
        .write_stdin("x\ny\nx\n")
        .assert()
        .success()
        .stdout("x\ny\n");
    bin()
        .args(["filter", "--digest", "blake3"])
        .write_stdin("x\n")
        .assert()
        .code(1)
        .stdout("")
        .stderr(
            "error: `--digest blake3` needs its key: pass `--digest-key-file`, a file of 32 \
             bytes such as `head -c 32 /dev/urandom > FILE` makes\n",
        );
    bin()
        .args(["filter", "--digest", "md5", "--digest-key-file"])
        .arg(key.path())
        .write_stdin("x\n")
        .assert()
        .code(1)
        .stdout("")
        .stderr(
            "error: invalid `--digest` = \"md5\": a digest key file selects keyed BLAKE3; set \
             `--digest` to \"blake3\" or leave it out\n",
        );
}

#[test]
fn a_table_file_whose_lock_cannot_be_made_names_the_table_file() {
    bin()
        .args([
            "filter",
            "--memory",
            "64KiB",
            "--table-file",
            "/proc/version",
        ])
        .write_stdin("a\n")
        .assert()
        .code(1)
        .stdout("")
        .stderr(
            "error: table file /proc/version: cannot create its lock file /proc/version.lock \
             beside it: No such file or directory (os error 2); the table file's directory must \
             be writable\n",
        );
}
