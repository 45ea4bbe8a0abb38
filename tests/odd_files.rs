//! Odd paths given as table files, archives and their names: only regular files (or nothing)
//! are opened, renamed or replaced, and names never leave their directory.

use crate::util::bin;

/// Runs the binary with `args` and returns its exit code and stderr.
fn status_and_stderr(args: &[&str]) -> (i32, String) {
    let out = bin().args(args).write_stdin("").output().unwrap();
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
            1,
            "error: invalid `--filename-format` = \"../../escape-<TOPIC><REV>.log\": must make a \
             file name, not a path: no `/` (files are written only in the output directory)\n"
        )
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
