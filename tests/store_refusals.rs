//! A wrong store setting is a refusal, not an outage: a Redis that refuses the password (or
//! wants one) or a Memcached address that is another service stops `run` at start with exit
//! status 78 and one error naming the setting (never the password); a store that is not there
//! at start is an outage, which `run` waits out; and a refusal met while running (a password
//! changed) is logged when it appears, with its messages requeued, none lost.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cli_errors::{answering_port, http_port, run_refused};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::{Child, Finished};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::{RedisCluster, RedisServer};
use crate::util::wait_until_or;

/// The server's password, and the wrong one given; neither may appear in any output.
const PASSWORD: &str = "right-pw-7f3a2c";
const WRONG: &str = "wrong-pw-9c1e4b";

/// A run that connects to no nsqd: the store is opened before any nsqd is contacted.
const NO_NSQD: [&str; 6] = [
    "--topic",
    "t",
    "--nsqd-tcp-address",
    "127.0.0.1:1",
    "--metrics-address",
    "off",
];

/// Runs `run` with `env` and `args` after [`NO_NSQD`] and checks that it stops at once with
/// status 78 and the error `expected`, and shows no password.
fn refused_with(env: &[(&str, &str)], args: &[&str], expected: &str) {
    let mut all = NO_NSQD.to_vec();
    all.extend_from_slice(args);
    let (code, stderr) = run_refused(env, &all);
    assert_eq!(
        (code, stderr.lines().last().unwrap_or_default()),
        (78, expected),
        "{stderr}"
    );
    assert!(
        !stderr.contains(PASSWORD) && !stderr.contains(WRONG),
        "a password was shown: {stderr}"
    );
}

/// The error of a Redis at `addr` that does not accept the password from `setting`.
fn wrong_password(addr: &str, setting: &str) -> String {
    format!(
        "error: cannot open the de-duplication store: store at {addr} refused this client: \
         AUTH failed: it does not accept the password from {setting} (a wrong password, or a \
         server without one)"
    )
}

#[test]
fn a_wrong_redis_password_stops_the_run_naming_where_it_was_set() {
    let server = RedisServer::start_with_args(&["--requirepass", PASSWORD]);
    let (addr, url) = (server.addr(), server.url());
    let dir = tempfile::tempdir().unwrap();
    let redis = ["--store", "redis", "--redis-url"];

    let in_url = format!("redis://:{WRONG}@{addr}");
    let mut args = redis.to_vec();
    args.push(&in_url);
    refused_with(&[], &args, &wrong_password(&addr, "`--redis-url`"));

    let file = dir.path().join("redis-password");
    std::fs::write(&file, format!("{WRONG}\n")).unwrap();
    let mut args = redis.to_vec();
    args.extend([&url, "--redis-password-file", file.to_str().unwrap()]);
    refused_with(
        &[],
        &args,
        &wrong_password(&addr, "`--redis-password-file`"),
    );

    let mut args = redis.to_vec();
    args.push(&url);
    refused_with(
        &[("NSQ_DEDUPE_REDIS_PASSWORD", WRONG)],
        &args,
        &wrong_password(&addr, "`NSQ_DEDUPE_REDIS_PASSWORD`"),
    );

    // Set in the config file: named by its key.
    let config = dir.path().join("events.toml");
    std::fs::write(
        &config,
        format!("[store]\nkind = \"redis\"\nredis_urls = [\"redis://:{WRONG}@{addr}\"]\n"),
    )
    .unwrap();
    refused_with(
        &[],
        &["--config", config.to_str().unwrap()],
        &wrong_password(&addr, "`store.redis_urls`"),
    );
}

#[test]
fn a_redis_that_wants_a_password_and_gets_none_stops_the_run() {
    let server = RedisServer::start_with_args(&["--requirepass", PASSWORD]);
    refused_with(
        &[],
        &["--store", "redis", "--redis-url", &server.url()],
        &format!(
            "error: cannot open the de-duplication store: store at {} refused this client: it \
             requires a password and none was given; give it in `--redis-url` \
             (redis://:PASSWORD@host:port), `--redis-password-file` or \
             `NSQ_DEDUPE_REDIS_PASSWORD`",
            server.addr()
        ),
    );
}

#[test]
fn a_redis_that_is_not_what_the_settings_say_stops_the_run() {
    let refused = |addr: &str, detail: &str| {
        format!(
            "error: cannot open the de-duplication store: store at {addr} refused this client: \
             {detail}"
        )
    };
    let (http, stop) = http_port();
    refused_with(
        &[],
        &[
            "--store",
            "redis",
            "--redis-url",
            &format!("redis://{http}"),
        ],
        &refused(
            &http.to_string(),
            "its answer is not in Redis's protocol, so it is not Redis (an HTTP port, say); \
             give Redis's address (port 6379 unless it was started with another) in \
             `--redis-url`",
        ),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    let server = RedisServer::start();
    refused_with(
        &[],
        &[
            "--store",
            "redis",
            "--redis-url",
            &server.url(),
            "--redis-cluster",
        ],
        &refused(
            &server.addr(),
            "it is a standalone server, not a node of a Redis Cluster; turn `--redis-cluster` \
             off",
        ),
    );

    // A node of a Redis Cluster given as a standalone server: the sets of the other masters
    // would answer MOVED for ever.
    let cluster = RedisCluster::start();
    refused_with(
        &[],
        &["--store", "redis", "--redis-url", &cluster.nodes[0].url()],
        &refused(
            &cluster.nodes[0].addr(),
            "it is a node of a Redis Cluster; turn `--redis-cluster` on, with the cluster's \
             nodes as seeds",
        ),
    );
    drop(cluster);

    // A user who may not load scripts.
    server.cli(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "+ping",
    ]);
    let url = format!("redis://app:{PASSWORD}@{}", server.addr());
    refused_with(
        &[],
        &["--store", "redis", "--redis-url", &url],
        &refused(
            &server.addr(),
            "this user has no permissions to run the 'script|load' command; user \"app\" of \
             `--redis-url` needs the right to run EVALSHA and SCRIPT LOAD",
        ),
    );
}

#[test]
fn a_memcached_address_that_is_another_service_stops_the_run() {
    let (addr, stop) = http_port();
    let not_memcached = format!(
        "error: cannot open the de-duplication store: store at {addr} refused this client: it \
         answered `version` with \"HTTP/1.1 400 Bad Request\", so it is not memcached; give \
         the TCP address of a memcached without authentication (port 11211 unless it was \
         started with another) in `--memcached-address`"
    );
    let memcached = ["--store", "memcached", "--memcached-address"];
    let mut args = memcached.to_vec();
    let http = addr.to_string();
    args.push(&http);
    refused_with(&[], &args, &not_memcached);
    // Found behind a server that is down: the outage does not hide it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let both = format!("{closed},{http}");
    let mut args = memcached.to_vec();
    args.push(&both);
    refused_with(&[], &args, &not_memcached);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    // A memcached that requires authentication (`-Y`) answers every command but `set` with
    // a refusal.
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users");
    std::fs::write(&users, format!("app:{PASSWORD}\n")).unwrap();
    let memcached = MemcachedServer::start_with_args(&["-Y", users.to_str().unwrap()]);
    refused_with(
        &[],
        &[
            "--store",
            "memcached",
            "--memcached-address",
            &memcached.addr(),
        ],
        &format!(
            "error: cannot open the de-duplication store: store at {} refused this client: it \
             answered `version` with \"CLIENT_ERROR unauthenticated\": it requires \
             authentication (memcached -Y), which this client does not speak; give the TCP \
             address of a memcached without authentication (port 11211 unless it was started \
             with another) in `--memcached-address`",
            memcached.addr()
        ),
    );
}

/// What Python's `http.server` answers `version`: an error page alone (a one-word request is
/// HTTP/0.9 to it, so no status line or headers), its lines ending in LF, then it closes.
const PYTHON_HTTP_PAGE: &[u8] = b"<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>\n        \
    <meta charset=\"utf-8\">\n        <title>Error response</title>\n    </head>\n    <body>\n\
    \x20       <h1>Error response</h1>\n        <p>Error code: 400</p>\n        <p>Message: Bad \
    request syntax ('version').</p>\n    </body>\n</html>\n";

#[test]
fn a_memcached_address_that_answers_another_protocol_and_closes_stops_the_run() {
    // Any answer that cannot begin memcached's, ended by a close, is another service's: an
    // HTTP server's page, a TLS server's alert, a line longer than the message shows.
    let cases: [(&[u8], String); 3] = [
        (PYTHON_HTTP_PAGE, r#""<!DOCTYPE HTML>""#.to_owned()),
        (
            b"\x15\x03\x01\x00\x02\x02\x32",
            r#""\u{15}\u{3}\u{1}\0\u{2}\u{2}2""#.to_owned(),
        ),
        (&[b'x'; 100], format!("\"{}\"…", "x".repeat(64))),
    ];
    for (answer, quoted) in cases {
        let (addr, stop) = answering_port(answer);
        let address = addr.to_string();
        refused_with(
            &[],
            &["--store", "memcached", "--memcached-address", &address],
            &format!(
                "error: cannot open the de-duplication store: store at {addr} refused this \
                 client: it answered `version` with {quoted}, so it is not memcached; give the \
                 TCP address of a memcached without authentication (port 11211 unless it was \
                 started with another) in `--memcached-address`"
            ),
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Starts `run` with `args`, its stdout (the sink) and its log gathered.
pub(crate) fn start(args: &[&str]) -> Child {
    Child::spawn(
        Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null()),
    )
}

/// Sends SIGTERM to `running` and waits (at most 20 s) for it to exit.
pub(crate) async fn stop(running: Child) -> Finished {
    running.signal("TERM");
    running.finish_within(Duration::from_secs(20)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_not_there_at_start_is_an_outage_that_run_waits_out() {
    // Nothing listens on this port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let url = format!("redis://{closed}");
    // A memcached whose `-c` limit of connections is reached answers a new one with this
    // line and closes it: memcached's own answer, an outage.
    let (busy, busy_stop) = answering_port(b"ERROR Too many open connections\r\n");
    let busy = busy.to_string();
    let busy_said = format!(
        "Memcached is not answering; messages follow `dedupe.on_store_error` until it does. \
         servers={busy} error=store at {busy} is unavailable: memcached refused the connection: \
         too many open connections (its -c limit)"
    );
    for (store, setting, address, said) in [
        (
            "redis",
            "--redis-url",
            url.as_str(),
            "Redis is not answering",
        ),
        (
            "memcached",
            "--memcached-address",
            &closed,
            "Memcached is not answering",
        ),
        ("memcached", "--memcached-address", &busy, &busy_said),
    ] {
        let mut args = NO_NSQD.to_vec();
        args.extend(["--store", store, setting, address]);
        let mut running = start(&args);
        wait_until_or(
            "the warning that the store is not answering",
            Duration::from_secs(10),
            || running.stderr().contains(said),
            || running.stderr(),
        )
        .await;
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !running.has_exited(),
            "{store}: an outage stopped the run: {}",
            running.stderr()
        );
        let stopped = stop(running).await;
        assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
    }
    busy_stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_while_running_is_logged_as_it_appears_and_nothing_is_lost() {
    const TOPIC: &str = "events";
    const SECOND: &str = "second-pw-51d0e8";
    let body = |i: usize| Bytes::from(format!("{{\"id\":{i}}}"));
    let mut server = RedisServer::start_with_args(&["--requirepass", PASSWORD]);
    let broker = Broker::start(BrokerConfig::default()).await;
    let url = format!("redis://:{PASSWORD}@{}", server.addr());
    let nsqd = broker.tcp_addr().to_string();
    let running = start(&[
        "--topic",
        TOPIC,
        "--nsqd-tcp-address",
        &nsqd,
        "--metrics-address",
        "off",
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--buckets",
        "65536",
        "--store-error-requeue-delay",
        "100ms",
    ]);
    let delivered = || running.stdout().lines().count();
    broker.publish_many(TOPIC, (0..20).map(body));
    wait_until_or(
        "the first 20 delivered",
        Duration::from_secs(20),
        || delivered() == 20,
        || running.stderr(),
    )
    .await;

    // Redis goes away (an outage), and comes back with another password (a refusal).
    server.stop();
    broker.publish_many(TOPIC, (20..40).map(body));
    let store_errors = |log: &str| {
        log.lines()
            .filter(|line| line.contains(" ERROR ") && line.contains("Store error."))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    wait_until_or(
        "the outage logged",
        Duration::from_secs(10),
        || !store_errors(&running.stderr()).is_empty(),
        || running.stderr(),
    )
    .await;
    let first_logged = Instant::now();
    server.restart_with_args(&["--requirepass", SECOND]);
    // Logged when it appears, not when the outage's line is 10 s old.
    let refusal = "refused this client: AUTH failed: it does not accept the password from \
                   `store.redis_urls`";
    while !store_errors(&running.stderr())
        .iter()
        .any(|l| l.contains(refusal))
    {
        assert!(
            first_logged.elapsed() < Duration::from_secs(8),
            "the refusal was not logged within 8 s of the outage's line:\n{}",
            running.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(delivered(), 20, "delivered while the store refused us");

    // The password is set back: every message requeued meanwhile is delivered, once.
    server.cli(&[
        "-a",
        SECOND,
        "--no-auth-warning",
        "CONFIG",
        "SET",
        "requirepass",
        PASSWORD,
    ]);
    wait_until_or(
        "all 40 delivered",
        Duration::from_secs(30),
        || delivered() == 40,
        || running.stderr(),
    )
    .await;
    let stopped = stop(running).await;
    assert_eq!(stopped.code(), Some(0), "{}", stopped.stderr);
    let mut lines: Vec<String> = stopped.stdout.lines().map(str::to_owned).collect();
    lines.sort();
    let mut expected: Vec<String> = (0..40)
        .map(|i| String::from_utf8(body(i).to_vec()).unwrap())
        .collect();
    expected.sort();
    assert_eq!(lines, expected, "each message once, none lost");

    let log = stopped.stderr;
    assert!(
        !log.contains(PASSWORD) && !log.contains(SECOND),
        "a password was logged: {log}"
    );
    let counted: u64 = log
        .lines()
        .find(|line| line.contains("Sidecar stopped."))
        .and_then(|line| line.split("store_errors=").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no store_errors in the last status line: {log}"));
    let logged = store_errors(&log).len() as u64;
    println!("{counted} store errors, {logged} logged");
    assert!(
        logged <= 4 && counted >= 5 * logged,
        "{logged} lines for {counted} store errors: {log}"
    );
}
