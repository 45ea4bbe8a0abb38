//! Odd paths given as table files, archives and their names: only regular files (or nothing)
//! are opened, renamed or replaced, and names never leave their directory.

use crate::util::bin;

/// Runs the binary with `args` and returns its exit code and stderr.
fn status_and_stderr(args: &[&str]) -> (i32, String) {
    let out = bin()
        .args(args)
        .write_stdin("")
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn a_file_name_format_cannot_leave_the_output_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let (code, stderr) = status_and_stderr(&[
        "run",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--sink",
        "file",
        "--output-dir",
        out.to_str().unwrap(),
        "--filename-format",
        "../../escape-<TOPIC><REV>.log",
    ]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            78,
            "error: invalid `--filename-format` = \"../../escape-<TOPIC><REV>.log\": must make a \
             file name, not a path: no `/` (files are written only in the output directory)\n"
        )
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// The names in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_fifo_as_the_table_file_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("table");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let out = bin()
        .args(["filter", "--table-file", fifo.to_str().unwrap()])
        .write_stdin("a\n")
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(1),
            format!(
                "error: {} is a FIFO: a table file, its lock, its temporary file and its \
                 journal are regular files or do not exist yet; give another path\n",
                fifo.display()
            )
        )
    );
    assert_eq!(names(dir.path()), ["table"]);
}

#[test]
fn a_device_as_the_table_file_is_never_moved_aside() {
    // A link to /dev/null stands for a device node (making one needs root): recreating must
    // neither rename it nor put a regular file in its place.
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    std::os::unix::fs::symlink("/dev/null", &table).unwrap();
    let (code, stderr) = status_and_stderr(&[
        "filter",
        "--table-file",
        table.to_str().unwrap(),
        "--table-file-on-mismatch",
        "recreate",
    ]);
    assert_eq!(
        (code, stderr),
        (
            1,
            format!(
                "error: {} is a character device: a table file, its lock, its temporary file \
                 and its journal are regular files or do not exist yet; give another path\n",
                table.display()
            )
        )
    );
    assert_eq!(names(dir.path()), ["table"]);
    assert_eq!(
        std::fs::read_link(&table).unwrap(),
        std::path::Path::new("/dev/null")
    );
}

#[test]
fn a_table_file_leaves_no_lock_behind() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let table = table.to_str().unwrap();
    let out = bin()
        .args(["filter", "--table-file", table, "--memory", "64KiB"])
        .write_stdin("a\nb\na\n")
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &b"a\nb\n"[..])
    );
    assert_eq!(names(dir.path()), ["table"]);
    // A failed attempt (another table size, refused) leaves none either.
    let (code, stderr) = status_and_stderr(&[
        "filter",
        "--table-file",
        table,
        "--memory",
        "128KiB",
        "--table-file-on-mismatch",
        "error",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("was written for"), "{stderr}");
    assert_eq!(names(dir.path()), ["table"]);
}

#[test]
fn a_failed_save_leaves_no_temporary_file() {
    // Files may not grow past 1 KiB: the snapshot's first write fails as on a full disk
    // (SIGXFSZ ignored, so the write returns EFBIG instead of killing the process).
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let binary = assert_cmd::cargo::cargo_bin("nsq-dedupe");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"trap "" XFSZ; ulimit -f 2; exec "$0" filter --table-file "$1" --memory 64KiB"#)
        .arg(&binary)
        .arg(&table)
        .stdin(std::fs::File::open("/dev/null").unwrap())
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(1),
            format!(
                "error: table file {}: File too large (os error 27)\n",
                table.display()
            )
        )
    );
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
}
