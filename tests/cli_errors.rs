//! Bad input on the command line: exit codes, and error text that names what the user typed
//! and says each cause once.

use std::collections::BTreeSet;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nsq_dedupe::Settings;

use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::{Child, Reading};
use crate::util::bin;

/// Runs the binary and returns its exit code and stderr.
fn fails(args: &[&str]) -> (i32, String) {
    let out = bin().args(args).write_stdin("a\n").output().unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn a_table_smaller_than_one_set_names_the_flag() {
    let expected = "error: invalid `--memory`: a budget of 1 B holds no complete set of 8 slots \
                    (8 B each); the smallest table of 8 ways takes 64 B\n";
    assert_eq!(
        fails(&["size", "--memory", "1", "--messages", "5"]),
        (1, expected.into())
    );
    assert_eq!(fails(&["filter", "--memory", "1"]), (1, expected.into()));
}

/// The machine's memory as the refusals say it, from `/proc/meminfo`.
fn machine_memory() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("MemTotal in kB");
    // Binary units with one decimal, as the refusal prints them: any test machine has
    // between 1 GiB and 1 TiB.
    format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))
}

/// A table larger than the machine is a setting to change, not a failure to retry: `run`
/// refuses it with 78 (which the systemd unit does not restart) under the flag, variable or
/// key that sized it, before allocating anything. 1 TiB is far beyond any test machine.
#[test]
fn a_table_larger_than_the_machine_is_refused_under_the_setting_that_sized_it() {
    let machine = machine_memory();
    let nsqd = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let refused = |env: &[(&str, &str)], flags: &[&str]| {
        run_refused(
            env,
            &[&nsqd[..], flags, &["--metrics-address", "off"]].concat(),
        )
    };
    let expected = |setting: &str, value: &str, size: &str, fix: &str| {
        format!(
            "error: invalid `{setting}` = {value}: cannot allocate {size} for the table (this \
             machine has {machine} of memory); choose a smaller {fix}\n"
        )
    };
    assert_eq!(
        refused(&[], &["--buckets", "137438953472"]),
        (
            78,
            expected("--buckets", "137438953472", "1.0 TiB", "`--buckets`")
        )
    );
    assert_eq!(
        refused(&[], &["--memory", "1TiB"]),
        (
            78,
            expected("--memory", "\"1TiB\"", "1.0 TiB", "`--memory`")
        )
    );
    assert_eq!(
        refused(&[("NSQ_DEDUPE_MEMORY", "1TiB")], &[]),
        (
            78,
            expected(
                "NSQ_DEDUPE_MEMORY",
                "\"1TiB\"",
                "1.0 TiB",
                "`NSQ_DEDUPE_MEMORY`"
            )
        )
    );
    // With max_age, a time beside every slot: twice the memory.
    assert_eq!(
        refused(&[], &["--memory", "512GiB", "--max-age", "1h"]),
        (
            78,
            expected("--memory", "\"512GiB\"", "1.0 TiB", "`--memory`").replace(
                "for the table (",
                "for the table with a time beside each slot ("
            )
        )
    );
    // A table sized by probability, rate and window names all three (after the line that
    // logs the size they give).
    let (code, stderr) = refused(
        &[],
        &[
            "--probability",
            "0.99",
            "--rate",
            "1000000",
            "--window",
            "7d",
        ],
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.ends_with(&format!(
            "memory=12.1 TiB\n{}",
            expected(
                "--probability",
                "0.99",
                "12.1 TiB",
                "`--probability`, `--rate` or `--window`"
            )
        )),
        "{stderr}"
    );
    // A rate alone sizes for the default target: it is named, with the window.
    let (code, stderr) = refused(&[], &["--rate", "1000000", "--window", "7d"]);
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.ends_with(&format!(
            "memory=12.1 TiB\n{}",
            expected("--rate", "1000000", "12.1 TiB", "`--rate` or `--window`")
        )),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("big.toml");
    std::fs::write(&config, "[store]\nmemory = \"1TiB\"\n").unwrap();
    assert_eq!(
        refused(&[], &["--config", config.to_str().unwrap()]),
        (
            78,
            expected("store.memory", "\"1TiB\"", "1.0 TiB", "`store.memory`")
        )
    );
    // `filter` says it the same way, with the status of its other refusals.
    for (flag, value) in [("--memory", "1TiB"), ("--buckets", "137438953472")] {
        assert_eq!(
            fails(&["filter", flag, value]),
            (
                1,
                format!(
                    "error: invalid `{flag}`: cannot allocate 1.0 TiB for the table (this \
                     machine has {machine} of memory); choose a smaller `{flag}`\n"
                )
            )
        );
    }
}

/// A table the system will not give, below the machine's memory but above the process's
/// limit (`ulimit -v`), is a setting to change as well: 78.
#[test]
fn a_table_the_system_will_not_give_is_refused_as_a_setting() {
    let out = std::process::Command::new("sh")
        .args(["-c", "ulimit -v 4000000 && exec \"$0\" \"$@\""])
        .arg(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
        .args(["run", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"])
        .args(["--metrics-address", "off", "--memory", "16GiB"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("cannot allocate 16.0 GiB for the table"),
        "{stderr}"
    );
}

/// An alias is named as typed: `--n` is `nsq_to_http`'s name of `--http-concurrency`, and a
/// user who typed `--n` looks for `--n` in the message.
#[test]
fn a_flag_typed_by_its_alias_is_named_by_it() {
    let http = [
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--sink",
        "http",
        "--post",
        "http://127.0.0.1:1/",
    ];
    for (flags, named) in [
        (&["--n", "0"][..], "`--n`"),
        (&["--n=0"], "`--n`"),
        (&["--http-concurrency", "0"], "`--http-concurrency`"),
    ] {
        assert_eq!(
            run_refused(&[], &[&http[..], flags].concat()),
            (
                78,
                format!("error: invalid {named} = 0: must be at least 1\n")
            ),
        );
    }
    assert_eq!(
        run_refused(&[("NSQ_DEDUPE_HTTP_CONCURRENCY", "0")], &http),
        (
            78,
            "error: invalid `NSQ_DEDUPE_HTTP_CONCURRENCY` = 0: must be at least 1\n".to_owned()
        ),
    );
    assert_eq!(
        run_refused(
            &[],
            &[
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--n",
                "5"
            ]
        ),
        (
            78,
            "error: `--n` is used only with `--sink http`: remove it, or set that too\n".to_owned()
        ),
    );
}

#[test]
fn a_flag_value_is_reported_under_the_flag_not_the_key() {
    let (code, stderr) = fails(&[
        "run",
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--heartbeat-interval",
        "2m",
    ]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            78,
            "error: invalid `--heartbeat-interval` = 120s: nsqd accepts 1 s to 60 s, got 120s\n"
        )
    );
}

#[test]
fn counts_out_of_range_say_the_range_accepted() {
    for (flag, value, max) in [
        ("--max-in-flight", "999999999999", "4294967295"),
        ("--max-in-flight", "0", "4294967295"),
        ("--max-attempts", "0", "65535"),
    ] {
        let (code, stderr) = run_refused(&[], &["--topic", "t", flag, value]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '{value}' for '{flag} <N>': expected a whole number from 1 \
                 to {max}\n"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn a_lookupd_poll_interval_below_go_nsqs_bound_is_refused() {
    assert_eq!(
        run_refused(
            &[],
            &[
                "--topic",
                "t",
                "--lookupd-http-address",
                "127.0.0.1:1",
                "--lookupd-poll-interval",
                "1ms"
            ]
        ),
        (
            78,
            "error: invalid `--lookupd-poll-interval` = 1ms: must be 10ms to 5m (as go-nsq's), \
             got 1ms\n"
                .to_owned()
        )
    );
}

#[test]
fn a_missing_config_file_says_its_cause_once() {
    let (code, stderr) = fails(&["run", "--config", "/nonexistent/nsq-dedupe.toml"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            78,
            "error: cannot read config file /nonexistent/nsq-dedupe.toml (check `--config` / \
             NSQ_DEDUPE_CONFIG): No such file or directory (os error 2)\n"
        )
    );
}

/// `run`'s settings that cannot be read or are invalid exit with EX_CONFIG (78), which the
/// systemd unit does not restart; a failure met while starting or running exits with 1.
#[test]
fn run_tells_a_bad_configuration_from_a_failure_by_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:1\"]\n[sink]\nkind = \"carrier-pigeon\"\n").unwrap();
    let (code, stderr) = fails(&["run", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("carrier-pigeon"), "{stderr}");
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("pkg/nsq-dedupe@.service"),
    )
    .unwrap();
    assert!(
        unit.lines()
            .any(|line| line == "RestartPreventExitStatus=2 78"),
        "the unit retries configuration errors"
    );
}

#[test]
fn a_metrics_address_in_use_says_its_cause_once() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let (code, stderr) = fails(&[
        "run",
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        &addr,
    ]);
    assert_eq!(code, 1, "{stderr}");
    let error = stderr.lines().last().unwrap();
    assert_eq!(
        error,
        format!(
            "error: cannot listen on metrics address {addr} (change `--metrics-address`, or set \
             it to \"off\"): Address already in use (os error 98)"
        )
    );
}

#[test]
fn the_metrics_address_may_be_a_host_name() {
    let settings = Settings::from_toml(
        "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n\
         [metrics]\naddress = \"localhost:19152\"\n",
    )
    .unwrap();
    let addr = settings.metrics_address.unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_eq!(addr.port(), 19152);
}

#[test]
fn size_reports_the_probability_the_table_achieves() {
    let out = bin()
        .args(["size", "--probability", "0.5", "--messages", "5", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["buckets"], 8);
    assert_eq!(v["probability"], 1.0);
    assert_eq!(v["target_probability"], 0.5);
    let text = bin()
        .args(["size", "--probability", "0.5", "--messages", "5"])
        .output()
        .unwrap()
        .stdout;
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("Table:        8 buckets (1 set of 8 ways)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "Probability:  1 that a copy arriving a whole window late is caught \
             (the target was 0.500000)\n"
        ),
        "{text}"
    );
}

#[test]
fn size_prints_probabilities_near_one_with_enough_digits() {
    let out = bin()
        .args(["size", "-p", "0.999999999", "--messages", "1000"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Probability:"))
        .unwrap();
    assert!(line.starts_with("Probability:  0.999999999"), "{line}");
}

#[test]
fn size_wants_a_whole_count_of_messages() {
    let (code, stderr) = fails(&["size", "--buckets", "8", "--messages", "0.5"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(
            "error: invalid value '0.5' for '--messages <COUNT>': expected a whole count of \
             messages from 1 to 10^18, such as 3600000\n"
        ),
        "{stderr}"
    );
}

/// Every `--flag` of every subcommand, read from `--help`.
fn all_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for command in ["run", "size", "filter", "resize", "manpage"] {
        let help = bin().args([command, "--help"]).output().unwrap().stdout;
        for word in String::from_utf8(help).unwrap().split_whitespace() {
            let word = word.trim_end_matches([',', '.']);
            if let Some(name) = word.strip_prefix("--") {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                flags.insert(format!("--{name}"));
            }
        }
    }
    flags
}

/// Whether `section.key` is a key of the config file: a wrong-typed value for it must fail
/// as a wrong type, not as an unknown field.
fn is_config_key(setting: &str) -> bool {
    let Some((section, key)) = setting.split_once('.') else {
        return false;
    };
    let text = format!("[{section}]\n{key} = [[[]]]\n");
    match nsq_dedupe::config::RawConfig::from_toml(&text, "probe") {
        Ok(_) => true,
        Err(error) => {
            let error = error.to_string();
            !error.contains("unknown field") && !error.contains("unknown variant")
        }
    }
}

/// The `--flag` and `section.key` names that string literals in `dir` put in backquotes, and
/// the keys a message's wording names as settings (`.key("sink.post")`, `.set("sink.kind", …)`).
fn named_settings(dir: &Path, found: &mut BTreeSet<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            named_settings(&path, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for call in [".key(\"", ".set(\""] {
                for (_, after) in line
                    .match_indices(call)
                    .map(|(at, _)| line.split_at(at + call.len()))
                {
                    let quoted = after.split('"').next().unwrap_or_default();
                    if quoted.contains('.') {
                        found.insert((quoted.to_owned(), path.display().to_string()));
                    }
                }
            }
            // Only inside string literals: the odd pieces between double quotes.
            for literal in line.split('"').skip(1).step_by(2) {
                let pieces: Vec<&str> = literal.split('`').collect();
                for (i, quoted) in pieces.iter().enumerate().skip(1).step_by(2) {
                    // nsqd's own flags are named as nsqd's.
                    if pieces[i - 1].ends_with("nsqd's ") {
                        continue;
                    }
                    let is_flag = quoted.starts_with("--")
                        && quoted[2..]
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '-');
                    let is_key = quoted.split_once('.').is_some_and(|(section, key)| {
                        !section.is_empty()
                            && !key.is_empty()
                            && [section, key]
                                .iter()
                                .all(|p| p.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                    });
                    if is_flag || is_key {
                        found.insert(((*quoted).to_owned(), path.display().to_string()));
                    }
                }
            }
        }
    }
}

#[test]
fn every_setting_a_message_names_exists() {
    let flags = all_flags();
    assert!(
        flags.contains("--max-in-flight") && flags.contains("--memory"),
        "{flags:?}"
    );
    let mut named = BTreeSet::new();
    named_settings(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut named,
    );
    assert!(
        named.iter().any(|(s, _)| s == "store.rate"),
        "the scan finds the settings messages name: {named:?}"
    );
    let missing: Vec<_> = named
        .iter()
        .filter(|(setting, _)| {
            if setting.starts_with("--") {
                !flags.contains(setting)
            } else {
                !is_config_key(setting)
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "messages name settings that do not exist: {missing:?}"
    );
}

#[test]
fn size_refuses_windows_beyond_what_it_computes() {
    let (code, stderr) = fails(&["size", "-p", "0.9", "--messages", "1e300"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(
            "error: invalid value '1e300' for '--messages <COUNT>': expected a whole count of \
             messages from 1 to 10^18, such as 3600000\n"
        ),
        "{stderr}"
    );
    assert_eq!(
        fails(&["size", "-p", "0.9", "--rate", "1e308", "--window", "1d"]),
        (
            1,
            "error: `--window` at `--rate` holds inf messages; `size` computes windows of at \
             most 10^18 messages: shorten the window or lower the rate\n"
                .to_owned()
        )
    );
}

#[test]
fn size_parsers_show_the_value_once() {
    let (code, stderr) = fails(&["size", "--memory", "17EiB", "--messages", "5"]);
    assert_eq!(code, 2);
    assert_eq!(stderr.matches("17EiB").count(), 1, "{stderr}");
}

#[test]
fn an_invalid_json_pointer_is_refused_when_read() {
    let (code, stderr) = fails(&["filter", "--key", "json:/a~2"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(
            "error: invalid value 'json:/a~2' for '--key <KEY>': a JSON pointer escapes `~` as \
             `~0` and `/` as `~1`; no other `~` may appear\n"
        ),
        "{stderr}"
    );
}

#[test]
fn json_keys_of_different_types_are_different_messages() {
    bin()
        .args(["filter", "--key", "json:/id"])
        .write_stdin("{\"id\":\"1\"}\n{\"id\":1}\n{\"id\":\"true\"}\n{\"id\":true}\n{\"id\":1}\n")
        .assert()
        .success()
        .stdout("{\"id\":\"1\"}\n{\"id\":1}\n{\"id\":\"true\"}\n{\"id\":true}\n");
}

#[test]
fn an_unwritable_dead_letter_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dl.toml");
    std::fs::write(
        &config,
        "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:1\"]\n\
         [metrics]\naddress = \"off\"\n\
         [dead_letter]\nkind = \"file\"\npath = \"/nonexistent/dir/dead.ndjson\"\n",
    )
    .unwrap();
    let (code, stderr) = fails(&["run", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    let error = stderr.lines().last().unwrap();
    assert_eq!(
        error,
        "error: cannot open the dead-letter: writing dead-letter file \
         /nonexistent/dir/dead.ndjson: No such file or directory (os error 2) (check \
         `dead_letter.path`)"
    );
}

/// Runs `run` against the nsqd at `addrs` with `extra` flags and returns its exit code and
/// stderr once it exits, or panics if it is still running after `limit`.
pub(crate) fn run_until_exit(
    addrs: &[SocketAddr],
    extra: &[&str],
    limit: Duration,
) -> (i32, String) {
    let mut args: Vec<String> = ["run", "--topic", "events", "--metrics-address", "off"]
        .map(str::to_owned)
        .to_vec();
    for addr in addrs {
        args.extend(["--nsqd-tcp-address".to_owned(), addr.to_string()]);
    }
    args.extend(extra.iter().map(|&arg| arg.to_owned()));
    let finished = Child::bin(&args).wait_within(limit);
    (finished.code().unwrap_or(-1), finished.stderr)
}

/// The message `run` ends with when the nsqd at `addr` refuses a message timeout of one hour.
fn msg_timeout_refused(addr: SocketAddr) -> String {
    format!(
        "error: stopped: nsqd {addr} refused IDENTIFY: E_BAD_BODY IDENTIFY msg timeout (3600000) \
         is invalid; set `--msg-timeout` between 1s and nsqd's \
         --max-msg-timeout (15m unless nsqd was started with another)"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_nsqd_refuses_stops_the_run_and_names_the_flag() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let addr = broker.tcp_addr();
    let (code, stderr) = tokio::task::spawn_blocking(move || {
        run_until_exit(&[addr], &["--msg-timeout", "1h"], Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().last().unwrap(), msg_timeout_refused(addr));
    // Reported once by the consumer, once as the exit error: not retried for ever.
    assert_eq!(stderr.matches("refused IDENTIFY").count(), 2, "{stderr}");
}

/// The setting nsqd refused is named as the user gave it: by the environment variable that
/// set it, and from a config file by its flag and its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nsqd_refusal_names_the_setting_as_the_user_gave_it() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let addr = broker.tcp_addr();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("events.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\ntopic = \"events\"\nnsqd_tcp_addresses = [\"{addr}\"]\n\
             msg_timeout = \"1h\"\n[metrics]\naddress = \"off\"\n"
        ),
    )
    .unwrap();
    let refused = |setting: &str| {
        format!(
            "error: stopped: nsqd {addr} refused IDENTIFY: E_BAD_BODY IDENTIFY msg timeout \
             (3600000) is invalid; set {setting} between 1s and nsqd's --max-msg-timeout (15m \
             unless nsqd was started with another)"
        )
    };
    let run = move |args: Vec<String>, env: Vec<(&'static str, &'static str)>| {
        tokio::task::spawn_blocking(move || {
            let finished = Child::spawn_reading(
                std::process::Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
                    .arg("run")
                    .args(args)
                    .envs(env)
                    .stdin(Stdio::null()),
                Reading::Stderr,
            )
            .wait_within(Duration::from_secs(20));
            let last = finished
                .stderr
                .lines()
                .last()
                .unwrap_or_default()
                .to_owned();
            (finished.code().unwrap_or(-1), last)
        })
    };
    let by_variable = run(
        [
            "--topic",
            "events",
            "--metrics-address",
            "off",
            "--nsqd-tcp-address",
            &addr.to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
        vec![("NSQ_DEDUPE_MSG_TIMEOUT", "1h")],
    );
    assert_eq!(
        by_variable.await.unwrap(),
        (1, refused("`NSQ_DEDUPE_MSG_TIMEOUT`"))
    );
    let by_file = run(
        vec!["--config".to_owned(), config.display().to_string()],
        vec![],
    );
    assert_eq!(
        by_file.await.unwrap(),
        (1, refused("`--msg-timeout` (`source.msg_timeout`)"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refusing_nsqd_among_healthy_ones_stops_the_run() {
    // The second nsqd accepts an hour; the first does not. The refusal must not hide behind
    // the healthy connection.
    let refusing = Broker::start(BrokerConfig::default()).await;
    let healthy = Broker::start(BrokerConfig {
        max_msg_timeout: Duration::from_secs(2 * 3600),
        ..BrokerConfig::default()
    })
    .await;
    let addrs = [refusing.tcp_addr(), healthy.tcp_addr()];
    let (code, stderr) = tokio::task::spawn_blocking(move || {
        run_until_exit(&addrs, &["--msg-timeout", "1h"], Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        msg_timeout_refused(addrs[0])
    );
}

#[test]
fn completions_and_the_man_page_generate() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("nsq-dedupe") && script.contains("max-in-flight"),
            "{shell}"
        );
    }
    let out = bin().arg("manpage").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH nsq-dedupe 1"), "{page}");
    assert!(page.contains("completions"), "{page}");
}

/// What `run` logs until its first failed connect, in `--log-format` `format`, into a pipe,
/// while it tries to reach an nsqd that is not there.
fn first_logs(format: &str) -> String {
    let mut child = Child::spawn_reading(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .args(["--log-format", format, "run", "--topic", "t"])
            .args([
                "--metrics-address",
                "off",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
            ])
            .env("TERM", "xterm-256color")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null()),
        Reading::Stderr,
    );
    // Bounded: a busy machine may take longer than the first retry's 700 ms.
    let _ = child.line_on_stderr(
        "Could not connect to nsqd; retrying.",
        Duration::from_secs(10),
    );
    let stderr = child.stop_within("KILL", Duration::from_secs(10)).stderr;
    assert!(
        stderr.contains("Could not connect to nsqd; retrying."),
        "{stderr}"
    );
    stderr
}

#[test]
fn json_logs_are_one_object_per_line() {
    let stderr = first_logs("json");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() >= 2, "{stderr}");
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line).expect(line);
        assert!(
            value["level"].is_string() && value["fields"]["message"].is_string(),
            "{line}"
        );
    }
}

/// Colour codes are for a person at a terminal: logs into a pipe (a file, journald) have none,
/// in either format, whatever the terminal type says.
#[test]
fn logs_into_a_pipe_have_no_colour_codes() {
    for format in ["text", "json"] {
        let stderr = first_logs(format);
        assert!(
            !stderr.contains("\x1b[") && !stderr.contains("\\u001b["),
            "{format}: {stderr:?}"
        );
    }
}

#[test]
fn a_bad_log_level_is_an_error_naming_the_flag() {
    let (code, stderr) = fails(&[
        "--log-level",
        "x=[",
        "size",
        "--buckets",
        "8",
        "--messages",
        "5",
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with("error: invalid `--log-level` \"x=[\": "),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(
            "; expected one of off, error, warn, info, debug, trace, or directives such as \
             info,nsq_dedupe::nsq=debug\n"
        ),
        "{stderr}"
    );
}

#[test]
fn a_word_that_is_not_a_log_level_is_refused_with_the_levels() {
    for (typed, word) in [
        ("verbose", "verbose"),
        ("WARNING", "WARNING"),
        ("info,nsq_dedupe=loud", "loud"),
    ] {
        assert_eq!(
            fails(&[
                "--log-level",
                typed,
                "size",
                "--buckets",
                "8",
                "--messages",
                "5"
            ]),
            (
                2,
                format!(
                    "error: invalid `--log-level` {typed:?}: {word:?} is not a level; expected \
                     one of off, error, warn, info, debug, trace, or directives such as \
                     info,nsq_dedupe::nsq=debug\n"
                )
            )
        );
    }
    // Levels are read in any case, alone or per target.
    for accepted in ["WARN", "info,nsq_dedupe::nsq=debug", "off"] {
        bin()
            .args([
                "--log-level",
                accepted,
                "size",
                "--buckets",
                "8",
                "--messages",
                "5",
            ])
            .assert()
            .success();
    }
}

#[test]
fn nsqd_connection_options_are_checked_before_connecting() {
    let run = |extra: &[&str]| {
        let out = crate::util::bin()
            .args(["run", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        run(&["--tls-root-ca-file", "/nonexistent/ca.pem"]),
        (
            78,
            "error: invalid `--tls-root-ca-file` = \"/nonexistent/ca.pem\": cannot read it: No \
             such file or directory (os error 2)\n"
                .into()
        )
    );
    assert_eq!(
        run(&["--snappy", "--deflate"]),
        (
            78,
            "error: invalid `--snappy` = true: snappy and deflate are exclusive; choose one\n"
                .into()
        )
    );
    assert_eq!(
        run(&["--consumer-opt", "max_in_flight,0"]),
        (
            78,
            "error: invalid `--consumer-opt max_in_flight` = 0: must be at least 1\n".into()
        )
    );
    assert_eq!(
        run(&["--dead-letter-topic", "dl", "--producer-opt", "deflate_level,12"]).1,
        "error: invalid `--producer-opt deflate_level` = 12: expected 1 (fastest) to 9 (smallest); nsqd caps \
         it at its --max-deflate-level\n"
    );
    let (code, stderr) = run(&["--consumer-opt", "tls_v2,true"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(
            "error: invalid value 'tls_v2,true' for '--consumer-opt <KEY,VALUE>': unknown \
             option \"tls_v2\"; known: auth_secret, auth_secret_file, deflate, "
        ),
        "{stderr}"
    );
    let (code, stderr) = run(&["--auth-secret", "  "]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            78,
            "error: invalid `--auth-secret` = <redacted>: the secret is empty\n"
        )
    );
}

/// Runs `run` with `env` set and `args`, and returns its exit code and stderr; the settings
/// are refused before anything connects, so a run still going after 10 s fails the test.
pub(crate) fn run_refused(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let finished = Child::spawn_reading(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .arg("run")
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null()),
        Reading::Stderr,
    )
    .wait_within(Duration::from_secs(10));
    (
        finished.code().expect("exited, not killed by a signal"),
        finished.stderr,
    )
}

/// A store's own rule, checked with the settings, names the settings as the user gave them,
/// as every other setting error does: by the flags typed, and by the keys in a config file.
#[test]
fn a_store_rule_names_its_settings_as_the_user_gave_them() {
    let nsqd = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let urls = [
        "--redis-url",
        "redis://127.0.0.1:1",
        "--redis-url",
        "redis://127.0.0.1:2",
    ];
    let refused = |setting: &str, cluster: &str| {
        format!(
            "error: invalid store configuration: {setting} has 2 URLs but {cluster} is off: \
             give one server, or turn the cluster on to use them as seed nodes of a Redis \
             Cluster\n"
        )
    };
    assert_eq!(
        run_refused(&[], &[&nsqd[..], &["--store", "redis"], &urls].concat()),
        (78, refused("`--redis-url`", "`--redis-cluster`"))
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    let store = "[store]\nkind = \"redis\"\nredis_urls = [\"redis://127.0.0.1:1\", \"redis://127.0.0.1:2\"]\n";
    std::fs::write(file.path(), store).unwrap();
    let config = ["--config", file.path().to_str().unwrap()];
    assert_eq!(
        run_refused(&[], &[&nsqd[..], &config].concat()),
        (78, refused("`store.redis_urls`", "`store.redis_cluster`"))
    );
}

#[test]
fn comma_separated_addresses_are_several_addresses() {
    // The second address is wrong: it is named alone, so the value was split. From the
    // environment, it is named by its variable.
    let expected = "error: invalid `--nsqd-tcp-address` = \"nohost\": expected host:port such \
                    as 127.0.0.1:4150\n";
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_NSQD_TCP_ADDRESS", "127.0.0.1:4150,nohost")],
            &["--topic", "t"]
        ),
        (
            78,
            expected.replace("--nsqd-tcp-address", "NSQ_DEDUPE_NSQD_TCP_ADDRESS")
        )
    );
    assert_eq!(
        run_refused(
            &[],
            &[
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:4150,nohost"
            ]
        ),
        (78, expected.to_owned())
    );
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_MEMCACHED_ADDRESS", "127.0.0.1:11211,nohost")],
            &[
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:4150",
                "--store",
                "memcached"
            ]
        ),
        (
            78,
            "error: invalid `NSQ_DEDUPE_MEMCACHED_ADDRESS` = \"nohost\": expected host:port \
             such as 127.0.0.1:4150\n"
                .to_owned()
        )
    );
}

#[test]
fn a_lookupd_address_with_another_scheme_is_refused() {
    assert_eq!(
        run_refused(&[], &["--topic", "t", "--lookupd-http-address", "ftp://x"]),
        (
            78,
            "error: invalid `--lookupd-http-address` = \"ftp://x\": the scheme \"ftp\" is not \
             supported; use host:port or http://host:port\n"
                .to_owned()
        )
    );
}

#[test]
fn a_setting_another_one_needs_is_named_by_its_flag() {
    let base = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        run_refused(&[], &args)
    };
    assert_eq!(
        with(&["--backoff", "10m", "--max-backoff", "1s"]),
        (
            78,
            "error: invalid `--max-backoff` = 1s: must be at least `--backoff` (600s)\n".into()
        )
    );
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), [3u8; 32]).unwrap();
    let key = key.path().to_str().unwrap();
    assert_eq!(
        with(&["--digest", "md5", "--digest-key-file", key]),
        (
            78,
            "error: invalid `--digest` = \"md5\": a digest key file selects keyed BLAKE3; set \
             `--digest` to \"blake3\" or leave it out\n"
                .into()
        )
    );
}

#[test]
fn an_unwritable_dead_letter_file_is_named_by_its_flag() {
    let (code, stderr) = run_refused(
        &[],
        &[
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "127.0.0.1:1",
            "--metrics-address",
            "off",
            "--dead-letter-file",
            "/nonexistent/x",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        "error: cannot open the dead-letter: writing dead-letter file /nonexistent/x: No such \
         file or directory (os error 2) (check `--dead-letter-file`)"
    );
}

#[test]
fn a_setting_that_would_do_nothing_is_refused_with_what_it_needs() {
    let base = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let cases: &[(&[&str], &str)] = &[
        (
            &["--post", "http://127.0.0.1/"],
            "`--post` is used only with `--sink http`",
        ),
        (
            &["--http-batch-size", "5"],
            "`--http-batch-size` is used only with `--sink http`",
        ),
        (
            &["--http-concurrency", "5"],
            "`--http-concurrency` is used only with `--sink http`",
        ),
        (
            &["--http-idempotency-header", "off"],
            "`--http-idempotency-header` is used only with `--sink http`",
        ),
        (
            &["--gzip-level", "5"],
            "`--gzip-level` is used only with `--sink file`",
        ),
        (
            &["--output-dir", "/tmp"],
            "`--output-dir` is used only with `--sink file`",
        ),
        (
            &["--store", "none", "--buckets", "1024"],
            "`--buckets` is used only with a table, `--store memory`, `--store memcached` or \
             `--store redis`",
        ),
        (
            &[
                "--store",
                "memory",
                "--memcached-address",
                "127.0.0.1:11211",
            ],
            "`--memcached-address` is used only with `--store memcached`",
        ),
        (
            &["--near-table", "16MiB"],
            "`--near-table` is used only with a shared table, `--store memcached` or `--store redis`",
        ),
        (
            &["--snapshot-interval", "1m"],
            "`--snapshot-interval` is used only with `--table-file`",
        ),
        (
            &["--lookupd-poll-interval", "10s"],
            "`--lookupd-poll-interval` is used only with `--lookupd-http-address`",
        ),
        (
            &["--producer-opt", "snappy"],
            "`--producer-opt snappy` is used only with an nsq producer, `--sink nsq` or \
             `--dead-letter-topic`",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_eq!(
            run_refused(&[], &args),
            (
                78,
                format!("error: {expected}: remove it, or set that too\n")
            ),
            "{extra:?}"
        );
    }
    // A dead-letter address alone asks for the dead-letter's topic.
    let mut args = base.to_vec();
    args.extend_from_slice(&["--dead-letter-nsqd-tcp-address", "127.0.0.1:2"]);
    assert_eq!(
        run_refused(&[], &args),
        (
            78,
            "error: `dead_letter.topic` is required with `dead_letter.kind = \"nsq\"`: set it in \
             the config file or pass `--dead-letter-topic`\n"
                .to_owned()
        )
    );
}

#[test]
fn a_dead_letter_address_with_a_dead_letter_file_says_which_flag_to_use_instead() {
    let base = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let mut args = base.to_vec();
    args.extend_from_slice(&[
        "--dead-letter-file",
        "/tmp/dead.ndjson",
        "--dead-letter-nsqd-tcp-address",
        "127.0.0.1:4150",
    ]);
    assert_eq!(
        run_refused(&[], &args),
        (
            78,
            "error: `--dead-letter-nsqd-tcp-address` is used only with a dead-letter topic \
             (`--dead-letter-topic`): remove it, or use `--dead-letter-topic` instead of \
             `--dead-letter-file`\n"
                .to_owned()
        )
    );
    // Given by variables, they are named by them.
    assert_eq!(
        run_refused(
            &[
                ("NSQ_DEDUPE_DEAD_LETTER_FILE", "/tmp/dead.ndjson"),
                ("NSQ_DEDUPE_DEAD_LETTER_NSQD_TCP_ADDRESS", "127.0.0.1:4150"),
            ],
            &base
        ),
        (
            78,
            "error: `NSQ_DEDUPE_DEAD_LETTER_NSQD_TCP_ADDRESS` is used only with a dead-letter \
             topic (`--dead-letter-topic`): remove it, or use `--dead-letter-topic` instead of \
             `NSQ_DEDUPE_DEAD_LETTER_FILE`\n"
                .to_owned()
        )
    );
    // A file that names the kind is answered by its keys.
    let (_, refused) = dead_letter_refused(
        "kind = \"file\"\npath = \"/tmp/dead.ndjson\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n",
    );
    assert_eq!(
        refused,
        (
            78,
            "error: `dead_letter.nsqd_tcp_addresses` is used only with \
             `dead_letter.kind = \"nsq\"`: remove it, or set that too\n"
                .to_owned()
        )
    );
}

/// `run`'s refusal of a config file with a source and `dead_letter` as its `[dead_letter]`,
/// and the file (kept until the directory is dropped).
fn dead_letter_refused(dead_letter: &str) -> (tempfile::TempDir, (i32, String)) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:1\"]\n\
             [dead_letter]\n{dead_letter}"
        ),
    )
    .unwrap();
    let refused = run_refused(&[], &["--config", config.to_str().unwrap()]);
    (dir, refused)
}

#[test]
fn a_dead_letter_section_without_its_kind_lists_the_kinds() {
    let (dir, refused) = dead_letter_refused("path = \"/tmp/dead.ndjson\"\n");
    assert_eq!(
        refused,
        (
            78,
            format!(
                "error: invalid config file {}: TOML parse error at line 4, column 1: missing \
                 field `kind`: set `kind = \"file\"` (with `path`) or `kind = \"nsq\"` (with \
                 `topic`)\n",
                dir.path().join("c.toml").display()
            )
        )
    );
}

/// A server on a free loopback port that answers every connection as an HTTP server answers a
/// request it cannot read, until the returned flag is set (or 30 s pass).
pub(crate) fn http_port() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    answering_port(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
          Connection: close\r\n\r\n400 Bad Request",
    )
}

/// A server on a free loopback port that reads what each connection sends first, writes
/// `answer` and closes it, until the returned flag is set (or 30 s pass).
pub(crate) fn answering_port(
    answer: &'static [u8],
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !stopped.load(Ordering::Relaxed) && Instant::now() < deadline {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
                    let mut request = [0u8; 64];
                    let _ = conn.read(&mut request);
                    let _ = conn.write_all(answer);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    (addr, stop)
}

#[test]
fn an_http_port_given_as_nsqd_is_named_and_not_retried() {
    let (addr, stop) = http_port();
    let (code, stderr) = run_until_exit(&[addr], &[], Duration::from_secs(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!(
            "error: stopped: nsqd {addr} refused the NSQ protocol: it answered in HTTP \
             (\"HTTP\"…), so this is not nsqd's TCP port; give nsqd's TCP address (its \
             --tcp-address, port 4150 unless nsqd was started with another; 4151 is its HTTP \
             port) with `--nsqd-tcp-address`"
        )
    );
    // Reported once by the consumer, once as the exit error: not retried for ever.
    assert_eq!(stderr.matches("answered in HTTP").count(), 2, "{stderr}");
}

#[test]
fn run_names_every_missing_setting_at_once() {
    assert_eq!(
        run_refused(&[], &["--sink", "http"]),
        (
            78,
            "error: `source.topic` is required: set it in the config file or pass `--topic`; \
             `source.nsqd_tcp_addresses` is required: set it in the config file or pass \
             `--nsqd-tcp-address` or `--lookupd-http-address`; `sink.post` is required: set it \
             in the config file or pass `--post`\n"
                .to_owned()
        )
    );
}

#[test]
fn a_negative_value_is_a_value_not_a_flag() {
    let expected = "error: invalid value '-0.5' for '--probability <P>': expected a probability \
                    between 0 and 1 exclusive, such as 0.99\n";
    let (code, stderr) = fails(&["size", "--probability", "-0.5", "--messages", "5"]);
    assert_eq!(code, 2);
    assert!(stderr.starts_with(expected), "{stderr}");
    let (code, stderr) = run_refused(&[], &["--topic", "t", "--probability", "-0.5"]);
    assert_eq!(code, 2);
    assert!(stderr.starts_with(expected), "{stderr}");
    let (code, stderr) = fails(&["size", "--buckets", "8", "--rate", "-1", "--window", "1h"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(
            "error: invalid value '-1' for '--rate <MSG/S>': expected messages per second \
             greater than 0, such as 1000\n"
        ),
        "{stderr}"
    );
}

#[test]
fn the_logging_flags_follow_each_subcommands_own() {
    for command in ["size", "filter", "run"] {
        let help = bin().args([command, "--help"]).output().unwrap().stdout;
        let help = String::from_utf8(help).unwrap();
        let logging = help.find("\nLogging:\n").expect("a Logging section");
        assert!(help.find("--log-level").unwrap() > logging, "{help}");
        assert!(help.find("--log-format").unwrap() > logging, "{help}");
        assert!(help.find("--help").unwrap() < logging, "{help}");
    }
}

/// A duration of 0 is judged by the setting's own rule, the same for its flag and its key:
/// the file sink's `sync_interval` takes 0 (write as soon as the disk is free), its default;
/// the status line's interval does not, and says why under what the user typed.
#[test]
fn a_zero_duration_means_the_same_from_a_flag_and_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().to_str().unwrap();
    let file_sink = ["--sink", "file", "--output-dir", output];
    let from_flag = run_refused(
        &[],
        &[&file_sink[..], &["--sync-interval", "0s", "--topic", "t"]].concat(),
    );
    let config = dir.path().join("zero.toml");
    std::fs::write(&config, "[sink]\nsync_interval = \"0s\"\n").unwrap();
    let config = config.to_str().unwrap();
    let from_file = run_refused(
        &[],
        &[&file_sink[..], &["--config", config, "--topic", "t"]].concat(),
    );
    // Both get past the sync interval: what stops them is the missing source address.
    for (code, stderr) in [from_flag, from_file] {
        assert_eq!(code, 78, "{stderr}");
        assert!(
            stderr.starts_with("error: `source.nsqd_tcp_addresses` is required")
                || stderr.contains("--nsqd-tcp-address"),
            "{stderr}"
        );
        assert!(!stderr.contains("sync"), "{stderr}");
    }
    let refused = "must be more than 0 (how often the status line is logged)\n";
    let source = ["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"];
    let (code, stderr) = run_refused(&[], &[&source[..], &["--status-interval", "0s"]].concat());
    assert_eq!(
        (code, stderr.as_str()),
        (
            78,
            format!("error: invalid `--status-interval` = \"0s\": {refused}").as_str()
        )
    );
    let status = dir.path().join("status.toml");
    std::fs::write(&status, "[metrics]\nstatus_interval = \"0s\"\n").unwrap();
    let config = ["--config", status.to_str().unwrap()];
    let (code, stderr) = run_refused(&[], &[&config[..], &source[..]].concat());
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("`metrics.status_interval` = \"0s\": ") && stderr.ends_with(refused),
        "{stderr}"
    );
}
