//! Configuration files: every example of `config/` and of the docs loads, malformed ones are
//! refused naming the key, and `nsq-dedupe run` reports a bad file or flags.

use std::path::Path;
use std::process::Command;

use nsq_dedupe::config::{ConfigError, RawConfig};

use crate::sidecar::sidecar_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let raw =
                RawConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            raw.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "expected at least 3 example configs in config/, found {n}"
    );
    // The TOML examples of the README and docs/ too.
    let mut blocks = 0;
    for (page, text) in crate::docs::pages() {
        for block in crate::docs::code_blocks(&text, "toml") {
            RawConfig::from_toml(block, &page.display().to_string())
                .and_then(|raw| raw.validate())
                .unwrap_or_else(|e| panic!("{}: example: {e}\n{block}", page.display()));
            blocks += 1;
        }
    }
    assert!(blocks > 0, "the documentation has no TOML example");
}

fn bad_config(text: &str) -> String {
    match RawConfig::from_toml(text, "bad.toml").and_then(|raw| raw.validate()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const SOURCE: &str = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n";

#[test]
fn malformed_configs_are_rejected_with_the_key_named() {
    let e = bad_config("[source]\ntopic = \"t\"\nnsqd_tcp_adresses = [\"a:1\"]\n");
    assert!(
        e.starts_with("invalid config file bad.toml: TOML parse error at line 3"),
        "{e}"
    );
    assert!(e.contains("unknown field `nsqd_tcp_adresses`"), "{e}");
    let e = bad_config(&format!("{SOURCE}[store]\nbuckets = \"many\"\n"));
    assert!(
        e.contains("buckets") && e.contains("invalid type: string \"many\""),
        "{e}"
    );
    let e = bad_config(&format!("{SOURCE}[store]\nkind = \"valkey\"\n"));
    assert!(
        e.contains("unknown variant `valkey`") && e.contains("redis"),
        "{e}"
    );
    let e = bad_config(
        "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\nmsg_timeout = \"10 parsecs\"\n",
    );
    assert!(
        e.contains(
            "(`source.msg_timeout`): invalid value: string \"10 parsecs\", expected a duration \
             such as 30s"
        ) && !e.contains("msg_timeout = "),
        "{e}"
    );
    // A duration written as a bare number says how to write one, quotes included.
    let e = bad_config(&format!("{SOURCE}[shutdown]\ngrace = 10\n"));
    assert!(
        e.contains(
            "(`shutdown.grace`): invalid type: integer `10`, expected a duration in quotes, \
             such as \"30s\""
        ),
        "{e}"
    );
    assert_eq!(
        bad_config(&format!(
            "{SOURCE}[sink]\nkind = \"http\"\npost = [\"http://a/\", \"ftp://example.com/x\"]\n"
        )),
        "invalid `sink.post` = \"ftp://example.com/x\": expected an http:// or https:// URL"
    );
    // (the text after the minimal [source], or a whole file when it starts with [source]; the error)
    let cases: &[(&str, &str)] = &[
        ("[source]\ntopic = \"t\"\n", "`source.nsqd_tcp_addresses` is required: set it in the config file or with `Settings::builder()`"),
        ("[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"localhost\"]\n", "invalid `source.nsqd_tcp_addresses` = \"localhost\": expected host:port such as 127.0.0.1:4150"),
        ("[sink]\nkind = \"http\"\n", "`sink.post` is required: set it in the config file or with `Settings::builder()`"),
        ("[sink]\nkind = \"nsq\"\ndestination_nsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n", "`sink.destination_topic` is required: set it in the config file or with `Settings::builder()`"),
        ("[store]\nbuckets = 1000\nprobability = 0.9\n", "invalid `store.probability` = 0.9: give either `store.buckets` or `store.probability` with `store.rate` and `store.window`, not both"),
        ("[store]\nmemory = \"1MiB\"\nbuckets = 1000\n", "invalid `store.memory` = \"1MiB\": give one of `store.buckets`, `store.memory` or `store.probability`, not two"),
        ("[store]\nmemory = \"lots\"\n", "invalid `store.memory` = \"lots\": expected a size such as 64MiB, 1GiB, 500MB or 4096 (bytes)"),
        ("[store]\nkind = \"memcached\"\nmemory = \"1MiB\"\n", "invalid `store.memory` = \"1MiB\": sizes the in-process table; size a shared table with `store.buckets` or `store.probability`"),
        // Without a rate, only the in-process table sizes itself.
        ("[store]\nprobability = 0.9\nmax_memory = \"lots\"\n", "invalid `store.max_memory` = \"lots\": expected a size such as 64MiB, 1GiB, 500MB or 4096 (bytes)"),
        ("[store]\nbuckets = 1000\nmax_memory = \"1MiB\"\n", "`store.max_memory` is used only with `store.probability` without `store.rate`: remove it, or set that too"),
        ("[store]\nkind = \"redis\"\nmax_memory = \"1MiB\"\n", "`store.max_memory` is used only with `store.probability` without `store.rate`: remove it, or set that too"),
        ("[store]\nkind = \"none\"\nmax_memory = \"1MiB\"\n", "`store.max_memory` is used only with a table, `store.kind = \"memory\"`, `store.kind = \"memcached\"` or `store.kind = \"redis\"`: remove it, or set that too"),
        ("[store]\nprobability = 1.5\nrate = 10\nwindow = \"1h\"\n", "invalid `store.probability` = 1.5: `probability` must be between 0 and 1 exclusive (0 < p < 1), got 1.5"),
        ("[store]\nkind = \"memcached\"\nlease = \"5s\"\n", "invalid `store.lease` = 5s: must be at least `source.msg_timeout` (60s), or another delivery may take over a claim whose handler is still running"),
        ("[dedupe]\nkey = \"id\"\n", "invalid `dedupe.key` = \"id\": expected `body` or `json:<JSON pointer>` such as `json:/id`"),
        ("[metrics]\naddress = \"localhost\"\n", "invalid `metrics.address` = \"localhost\": invalid socket address; expected host:port such as 127.0.0.1:9150, localhost:9150 or :9150 (every IPv4 interface), or \"off\""),
        ("[dead_letter]\nkind = \"file\"\n", "`dead_letter.path` is required with `dead_letter.kind = \"file\"`: set it in the config file"),
        ("[source]\ntopic = \"t\"\nlookupd_http_addresses = [\"https://x:4161\"]\n", "invalid `source.lookupd_http_addresses` = \"https://x:4161\": https is not supported; use http://host:port"),
        ("[store]\nkind = \"memcached\"\nfleet_interval = \"0s\"\n", "invalid `store.fleet_interval` = 0s: must be at least 1ms (the fleet's counters are named by the millisecond)"),
        ("[store]\nfleet_interval = \"1s\"\n", "`store.fleet_interval` is used only with a shared table, `store.kind = \"memcached\"` or `store.kind = \"redis\"`: remove it, or set that too"),
        ("[store]\nkind = \"memcached\"\nnamespace = \"my table\"\n", "invalid `store.namespace` = \"my table\": must be 1 to 160 printable ASCII characters without spaces"),
        ("[sink]\nkind = \"nsq\"\ndestination_nsqd_tcp_addresses = [\"127.0.0.1:4150\"]\ndestination_topic = \"bad topic!\"\n", "invalid `sink.destination_topic` = \"bad topic!\": NSQ topic names are 1 to 64 of letters, digits, '.', '_' and '-', optionally ending in #ephemeral"),
    ];
    for (text, expected) in cases {
        let text = if text.starts_with("[source]") {
            (*text).to_owned()
        } else {
            format!("{SOURCE}{text}")
        };
        assert_eq!(bad_config(&text), *expected, "config:\n{text}");
    }
    assert!(matches!(
        RawConfig::from_file(Path::new("/nonexistent/nsq-dedupe.toml")),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn run_reports_bad_config_files_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[source]\ntopic = \"t\"\n[stor]\nkind = \"memory\"\n",
    )
    .unwrap();
    let out = Command::new(sidecar_binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `stor`"), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");

    let out = Command::new(sidecar_binary())
        .args([
            "run",
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "127.0.0.1:1",
            "--sink",
            "nsq",
            "--metrics-address",
            "off",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`sink.destination_nsqd_tcp_addresses` is required"),
        "{stderr}"
    );

    let out = Command::new(sidecar_binary())
        .args(["run", "--topic", "t"])
        .env("NSQ_DEDUPE_CONFIG", dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read config file") && stderr.contains("missing.toml"),
        "{stderr}"
    );
}
