//! Settings from the environment (`NSQ_DEDUPE_<FLAG>`): a wrong value is named by its
//! variable, not by the flag the user did not type, and `run` exits with 78 for it as for any
//! invalid setting; `--help` names the variables but never shows their values.

use std::collections::BTreeSet;

use crate::cli_errors::run_refused;
use crate::util::bin;

#[test]
fn a_value_clap_refuses_is_named_by_its_variable() {
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_WAYS", "3")],
            &["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"]
        ),
        (
            78,
            "error: invalid value '3' for `NSQ_DEDUPE_WAYS`: expected 1, 2, 4 or 8\n".to_owned()
        )
    );
    // A flag wins over its variable: the flag's value is the one refused, under the flag.
    let (code, stderr) = run_refused(
        &[("NSQ_DEDUPE_WAYS", "3")],
        &["--topic", "t", "--ways", "5"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("error: invalid value '5' for '--ways <W>': expected 1, 2, 4 or 8\n"),
        "{stderr}"
    );
    // A good flag hides a bad variable: the run goes on to be refused for another setting,
    // as it is without the variable.
    let args = [
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--ways",
        "4",
        "--heartbeat-interval",
        "2m",
    ];
    let (code, stderr) = run_refused(&[("NSQ_DEDUPE_WAYS", "3")], &args);
    assert_eq!((code, &stderr), (78, &run_refused(&[], &args).1));
    assert!(stderr.contains("`--heartbeat-interval`"), "{stderr}");
    // A secret is not shown, and its variable is named.
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_HEADER", "Bearer hunter2")],
            &["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"]
        ),
        (
            78,
            "error: invalid value for `NSQ_DEDUPE_HEADER` (not shown: it may hold a secret): \
             expected \"Name: value\", such as \"Authorization: Bearer abc\"\n"
                .to_owned()
        )
    );
}

#[test]
fn a_value_validation_refuses_is_named_by_its_variable() {
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_HEARTBEAT_INTERVAL", "2m")],
            &["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"]
        ),
        (
            78,
            "error: invalid `NSQ_DEDUPE_HEARTBEAT_INTERVAL` = 120s: nsqd accepts 1 s to 60 s, \
             got 120s\n"
                .to_owned()
        )
    );
    // A setting that would do nothing, and the setting it needs, as each was given.
    assert_eq!(
        run_refused(
            &[
                ("NSQ_DEDUPE_POST", "http://127.0.0.1:1/"),
                ("NSQ_DEDUPE_STORE", "none")
            ],
            &[
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--buckets",
                "64"
            ]
        ),
        (
            78,
            "error: `NSQ_DEDUPE_POST` is used only with `--sink http`: remove it, or set that \
             too\n"
                .to_owned()
        )
    );
}

/// A reason names the other settings it speaks of as each was given: by its variable, by its
/// flag, or (with a config file, when no flag gave it) by its key, and with its value in the
/// form of each.
#[test]
fn settings_a_reason_names_are_named_as_they_were_given() {
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_BACKOFF", "10s")],
            &[
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--max-backoff",
                "1s"
            ]
        ),
        (
            78,
            "error: invalid `--max-backoff` = 1s: must be at least `NSQ_DEDUPE_BACKOFF` (10s)\n"
                .to_owned()
        )
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[dead_letter]\nkind = \"nsq\"\ntopic = \"dead\"\n").unwrap();
    let config = config.to_str().unwrap();
    assert_eq!(
        run_refused(
            &[("NSQ_DEDUPE_STORE", "memcached")],
            &[
                "--config",
                config,
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "127.0.0.1:1",
                "--memory",
                "1MiB"
            ]
        ),
        (
            78,
            "error: invalid `--memory` = \"1MiB\": sizes the in-process table; size a shared \
             table with `store.buckets` or `store.probability`\n"
                .to_owned()
        )
    );
    assert_eq!(
        run_refused(
            &[],
            &["--config", config, "--topic", "t", "--lookupd-http-address", "127.0.0.1:1"]
        ),
        (
            78,
            "error: `dead_letter.nsqd_tcp_addresses` is required with `dead_letter.kind = \"nsq\"` \
             when `source.nsqd_tcp_addresses` is empty: set it in the config file or pass \
             `--dead-letter-nsqd-tcp-address`\n"
                .to_owned()
        )
    );
}

#[test]
fn a_global_flags_variable_is_named_too() {
    let size = ["size", "--buckets", "8", "--messages", "5"];
    let (code, stderr) = {
        let out = bin()
            .args(size)
            .env("NSQ_DEDUPE_LOG_FORMAT", "xml")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: invalid value 'xml' for `NSQ_DEDUPE_LOG_FORMAT`\n"),
        "{stderr}"
    );
    let out = bin()
        .args(size)
        .env("NSQ_DEDUPE_LOG_LEVEL", "verbose")
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stderr).unwrap()),
        (
            Some(2),
            "error: invalid `NSQ_DEDUPE_LOG_LEVEL` \"verbose\": \"verbose\" is not a level; \
             expected one of off, error, warn, info, debug, trace, or directives such as \
             info,nsq_dedupe::nsq=debug\n"
                .to_owned()
        )
    );
    // For `run`, a variable is one of its settings: EX_CONFIG.
    let (code, stderr) = run_refused(
        &[("NSQ_DEDUPE_LOG_LEVEL", "verbose")],
        &["--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1"],
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.starts_with("error: invalid `NSQ_DEDUPE_LOG_LEVEL` \"verbose\""),
        "{stderr}"
    );
}

/// The help of every command, long and short.
fn every_help(env: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut helps = Vec::new();
    for command in [
        &[][..],
        &["run"],
        &["size"],
        &["filter"],
        &["completions"],
        &["manpage"],
    ] {
        for help in ["--help", "-h"] {
            let out = bin()
                .args(command)
                .arg(help)
                .envs(env.iter().copied())
                .output()
                .unwrap();
            assert!(out.status.success(), "{command:?} {help}");
            helps.push((
                format!("{command:?} {help}"),
                String::from_utf8(out.stdout).unwrap(),
            ));
        }
    }
    helps
}

#[test]
fn help_names_each_variable_and_shows_no_value() {
    // The variables help names, each set to a value that must not appear.
    let mut variables = BTreeSet::new();
    for (_, help) in every_help(&[]) {
        for piece in help.split("[env: ").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            variables.insert(name);
        }
    }
    for expected in [
        "NSQ_DEDUPE_LOG_LEVEL",
        "NSQ_DEDUPE_LOG_FORMAT",
        "NSQ_DEDUPE_AUTH_SECRET",
        "NSQ_DEDUPE_TOPIC",
        "NSQ_DEDUPE_NSQD_HTTP_ADDRESS",
    ] {
        assert!(variables.contains(expected), "{expected}: {variables:?}");
    }
    let secret = "s3cret-from-the-environment";
    let env: Vec<(&str, &str)> = variables.iter().map(|v| (v.as_str(), secret)).collect();
    let helps = every_help(&env);
    for (which, help) in &helps {
        assert!(!help.contains(secret), "{which} shows a value:\n{help}");
    }
    // The names stay: the variables are how a deployment sets `run`.
    let run_help = &helps
        .iter()
        .find(|(which, _)| which == "[\"run\"] --help")
        .unwrap()
        .1;
    for named in ["[env: NSQ_DEDUPE_LOG_LEVEL]", "[env: NSQ_DEDUPE_WAYS]"] {
        assert!(run_help.contains(named), "{named}:\n{run_help}");
    }
}

#[test]
fn a_variable_no_flag_reads_is_warned_about() {
    // A misspelt variable sets nothing: the warning names it before the error it leads to.
    let (code, stderr) = run_refused(
        &[("NSQ_DEDUPE_NSQD_TCP_ADRESS", "127.0.0.1:4150")],
        &["--topic", "t"],
    );
    assert_eq!(code, 78, "{stderr}");
    let (warning, error) = stderr.split_once("error: ").expect("an error");
    assert!(
        warning.contains("WARN")
            && warning.contains("variable=NSQ_DEDUPE_NSQD_TCP_ADRESS")
            && warning.contains("is it misspelt?"),
        "{stderr}"
    );
    assert!(
        error.starts_with("`source.nsqd_tcp_addresses` is required"),
        "{stderr}"
    );
    // The variables that are read, a flag's or the Redis password, are not warned about.
    let (code, stderr) = run_refused(
        &[
            ("NSQ_DEDUPE_TOPIC", "t"),
            ("NSQ_DEDUPE_REDIS_PASSWORD", "hunter2"),
        ],
        &[],
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
}
