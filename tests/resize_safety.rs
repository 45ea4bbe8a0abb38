//! `nsq-dedupe resize` against an operator's mistakes: a second resize while the previous
//! size is still read (refused, or with `--force` saying what it forgets), a shrink (said, with
//! its cost), a namespace with no table (refused unless `--create`), a size from `--rate`
//! (said how), flags only a running consumer uses (refused), and a result on stdout with no
//! log lines around it.

use std::process::{Command, Stdio};
use std::time::Duration;

use nsq_dedupe::{
    Claim, Digest, Generation, Generations, Geometry, MemcachedConfig, MemcachedStore, RedisConfig,
    RedisStore, Store,
};

use crate::sidecar::sidecar_binary;
use crate::support::memcached::MemcachedServer;
use crate::support::redis::RedisServer;

/// `nsq-dedupe resize` with `args`: its exit status, stdout and stderr.
fn resize(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(sidecar_binary())
        .arg("resize")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("the nsq-dedupe binary runs");
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `text` with its times made placeholders: each HTTP date (`Sun, 29 Nov 2026 19:53:20 GMT`)
/// `<date>`, the duration before ` ago` and after `(in ` `<t>`.
fn times(text: &str) -> String {
    let mut text = text.to_owned();
    while let Some(end) = text.find(" GMT") {
        let start = end + " GMT".len() - "Sun, 29 Nov 2026 19:53:20 GMT".len();
        text.replace_range(start..end + " GMT".len(), "<date>");
    }
    let mut out = String::new();
    for (i, part) in text.split(" ago").enumerate() {
        if i > 0 {
            out.push_str(" ago");
        }
        match part.rfind(' ') {
            Some(at) if part[at + 1..].chars().all(|c| c.is_ascii_alphanumeric()) => {
                out.push_str(&part[..=at]);
                out.push_str("<t>");
            }
            _ => out.push_str(part),
        }
    }
    let mut text = String::new();
    let mut rest = out.as_str();
    while let Some(at) = rest.find("(in ") {
        text.push_str(&rest[..at + "(in ".len()]);
        rest = &rest[at + "(in ".len()..];
        let close = rest.find(')').unwrap_or(rest.len());
        text.push_str("<t>");
        rest = &rest[close..];
    }
    text.push_str(rest);
    text
}

fn digests(n: u64, seed: u64) -> Vec<Digest> {
    (0..n)
        .map(|i| {
            let bytes = [seed.to_le_bytes(), i.to_le_bytes()].concat();
            Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&bytes))
        })
        .collect()
}

fn geometry(buckets: u64) -> Geometry {
    Geometry::new(buckets, 8).unwrap()
}

/// How many of `digests` a consumer following the store's table (as a sidecar started now
/// does) takes for copies.
async fn caught<S: Generation>(consumer: S, digests: &[Digest]) -> usize {
    let consumer = Generations::new(consumer);
    consumer.follow().await.unwrap();
    let claims = consumer.claim_many(digests).await;
    assert!(claims.iter().all(Result::is_ok), "{claims:?}");
    claims
        .iter()
        .filter(|claim| **claim == Ok(Claim::Duplicate))
        .count()
}

const COPIES: u64 = 1_000;

/// A fleet at 262144 buckets commits 1,000 messages; the table is resized to 1048576, then
/// at once to 524288: the second resize is refused (78), saying until when the 262144-bucket
/// table is read and what `--force` costs, and the 1,000 copies stay caught. With `--force`
/// it is done, says what it forgets, and the copies pass, as it said.
async fn two_resizes_in_a_row<S: Generation>(flags: &[String], open: impl Fn(Geometry) -> S) {
    let fleet = Generations::new(open(geometry(262_144)));
    fleet.follow().await.unwrap();
    let committed = digests(COPIES, 1);
    assert!(fleet
        .claim_many(&committed)
        .await
        .iter()
        .all(|claim| *claim == Ok(Claim::New)));
    assert!(fleet
        .commit_many(&committed)
        .await
        .iter()
        .all(|commit| *commit == Ok(true)));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let args = |extra: &[&'static str]| {
        let mut args = flags.clone();
        args.extend_from_slice(&["--namespace", "twice"]);
        args.extend_from_slice(extra);
        args
    };
    let (status, _, stderr) = resize(&args(&["--buckets", "1048576"]));
    assert_eq!((status, stderr.as_str()), (0, ""));

    let (status, stdout, stderr) = resize(&args(&["--buckets", "524288"]));
    assert_eq!(
        (status, stdout.as_str(), times(&stderr).as_str()),
        (
            78,
            "",
            "error: resizing the table of namespace \"twice\": the table was resized <t> ago \
             (<date>) from 262144 to 1048576 buckets, and its consumers still read the \
             262144-bucket table until one of them has made 1048576 new entries in the \
             1048576-bucket table (as many as it has slots; its status line counts them down \
             as `previous_inserts_left`), or `max_age` has passed since, if they set one; \
             `resize` cannot tell when without their rate (`--rate`) or their `max_age` \
             (`--config` with their file). A resize now would stop that: copies of the \
             messages remembered only in the 262144-bucket table would pass as new. Resize \
             after that, or pass `--force` to resize now (those copies slip through; nothing \
             is lost)\n"
        )
    );
    assert_eq!(
        caught(open(geometry(524_288)), &committed).await,
        COPIES as usize,
        "every copy of a message committed before the two resizes is caught"
    );

    let (status, stdout, stderr) = resize(&args(&["--buckets", "524288", "--force"]));
    assert_eq!(
        (status, times(&stdout).as_str(), stderr.as_str()),
        (
            0,
            "The table of namespace \"twice\" is now 524288 buckets (65536 sets of 8 ways); it \
             was 1048576 buckets (131072 sets of 8 ways), which claims read until it has \
             turned over (or `max_age` has passed). Running consumers follow within one fleet \
             interval.\n\
             Size: 524288 buckets, as `--buckets` gave it.\n\
             This shrinks the table, from 1048576 to 524288 buckets: it remembers fewer \
             messages, so fewer copies are caught (`--rate` with the fleet's rate says how \
             many fewer).\n\
             Forgotten (`--force`): the 262144-bucket table, from before the resize <t> ago \
             (<date>), which its consumers read until one of them has made 1048576 new entries \
             in the 1048576-bucket table (as many as it has slots; its status line counts them \
             down as `previous_inserts_left`), or `max_age` has passed since, if they set one; \
             `resize` cannot tell when without their rate (`--rate`) or their `max_age` \
             (`--config` with their file). Copies of the messages remembered only there pass \
             as new; nothing is lost.\n",
            ""
        )
    );
    assert_eq!(
        caught(open(geometry(524_288)), &committed).await,
        0,
        "forced, the copies remembered only in the oldest table pass, as said"
    );
}

fn redis_config(redis: &RedisServer) -> RedisConfig {
    RedisConfig {
        urls: vec![redis.url()],
        namespace: "twice".into(),
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

fn redis_flags(redis: &RedisServer) -> Vec<String> {
    ["--store", "redis", "--redis-url", &redis.url()]
        .map(String::from)
        .to_vec()
}

/// [`resize`] of the table of `namespace` in `redis`, with `extra`.
fn resize_in(redis: &RedisServer, namespace: &str, extra: &[&str]) -> (i32, String, String) {
    let flags = redis_flags(redis);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(&["--namespace", namespace]);
    args.extend_from_slice(extra);
    resize(&args)
}

/// A consumer of the table in `redis` given `buckets`, following the store's.
async fn consumer(redis: &RedisServer, buckets: u64) -> Generations<RedisStore> {
    let store = RedisStore::new_lazy(redis_config(redis), geometry(buckets)).unwrap();
    let consumer = Generations::new(store);
    consumer.follow().await.unwrap();
    consumer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_resize_while_the_previous_size_is_read_is_refused_in_redis() {
    let redis = RedisServer::start();
    let config = redis_config(&redis);
    two_resizes_in_a_row(&redis_flags(&redis), |geometry| {
        RedisStore::new_lazy(config.clone(), geometry).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_resize_while_the_previous_size_is_read_is_refused_in_memcached() {
    let memcached = MemcachedServer::start();
    let config = MemcachedConfig {
        servers: vec![memcached.addr()],
        namespace: "twice".into(),
        timeout: Duration::from_secs(5),
        ..MemcachedConfig::default()
    };
    let flags = [
        "--store",
        "memcached",
        "--memcached-address",
        &memcached.addr(),
    ]
    .map(String::from)
    .to_vec();
    two_resizes_in_a_row(&flags, |geometry| {
        MemcachedStore::new_lazy(config.clone(), geometry).unwrap()
    })
    .await;
}

/// Given the consumers' `max_age` (their config file), the refusal says when the previous
/// size stops being read; once a consumer has retired it (its table turned over), it drops it
/// from the descriptor, and the next resize is let through without `--force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_size_is_read_until_a_consumer_retires_it() {
    let redis = RedisServer::start();
    let fleet = consumer(&redis, 512).await;
    nsq_dedupe::dedup::generational::resize(&fleet.current(), geometry(1024))
        .await
        .unwrap();
    fleet.follow().await.unwrap();
    assert!(fleet.previous().is_some());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sidecar.toml");
    std::fs::write(
        &file,
        format!(
            "[dedupe]\nmax_age = \"10m\"\n[store]\nkind = \"redis\"\nredis_urls = [{:?}]\n\
             namespace = \"twice\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let (status, _, stderr) = resize(&["--config", file.to_str().unwrap(), "--buckets", "2048"]);
    assert_eq!(
        (status, times(&stderr).as_str()),
        (
            78,
            "error: resizing the table of namespace \"twice\": the table was resized <t> ago \
             (<date>) from 512 to 1024 buckets, and its consumers still read the 512-bucket \
             table until `max_age` (10m) has passed since, at <date> (in <t>). A resize now \
             would stop that: copies of the messages remembered only in the 512-bucket table \
             would pass as new. Resize after that, or pass `--force` to resize now (those \
             copies slip through; nothing is lost)\n"
        )
    );

    // As many new entries as the table has slots: it has turned over.
    let fresh = digests(1_100, 2);
    assert!(fleet.claim_many(&fresh).await.iter().all(Result::is_ok));
    fleet.follow().await.unwrap();
    assert_eq!(fleet.previous(), None);
    assert_eq!(
        redis.cli(&["GET", "twice:table"]).trim(),
        "v1 current=3:128x8",
        "the consumer that retired the previous size dropped it from the descriptor"
    );
    let (status, stdout, stderr) = resize_in(&redis, "twice", &["--buckets", "2048"]);
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert!(
        stdout.starts_with("The table of namespace \"twice\" is now 2048 buckets")
            && !stdout.contains("Forgotten"),
        "{stdout}"
    );
}

/// A shrink is done, and said: from what to what, and what it costs, with the catch
/// probability at the rate when `--rate` gives it.
#[test]
fn a_shrink_says_so_and_what_it_costs() {
    let redis = RedisServer::start();
    let run = |namespace: &str, extra: &[&str]| resize_in(&redis, namespace, extra);
    let (status, stdout, stderr) = run("shrink", &["--buckets", "262144", "--create"]);
    assert_eq!(
        (status, stdout.as_str(), stderr.as_str()),
        (
            0,
            "The store held no table in namespace \"shrink\": it now has one of 262144 buckets \
             (32768 sets of 8 ways) (`--create`), which the fleet takes when it starts.\n\
             Size: 262144 buckets, as `--buckets` gave it.\n",
            ""
        )
    );
    let (status, stdout, stderr) = run("shrink", &["--buckets", "100"]);
    assert_eq!(
        (status, stdout.as_str(), stderr.as_str()),
        (
            0,
            "The table of namespace \"shrink\" is now 104 buckets (13 sets of 8 ways); it was \
             262144 buckets (32768 sets of 8 ways), which claims read until it has turned over \
             (or `max_age` has passed). Running consumers follow within one fleet interval.\n\
             Size: 104 buckets: `--buckets` gave 100, rounded to whole sets of 8 ways.\n\
             This shrinks the table, from 262144 to 104 buckets: it remembers fewer messages, \
             so fewer copies are caught (`--rate` with the fleet's rate says how many fewer).\n",
            ""
        )
    );
    run("rated", &["--buckets", "262144", "--create"]);
    let (status, stdout, _) = run("rated", &["--buckets", "131072", "--rate", "50"]);
    assert_eq!(status, 0);
    assert_eq!(
        stdout.lines().nth(2),
        Some(
            "This shrinks the table, from 262144 to 131072 buckets: it remembers fewer \
             messages, so fewer copies are caught: at 50 distinct messages a second \
             (`--rate`), a copy 1h late is caught with probability 0.144069, where the \
             262144-bucket table caught it with 0.810331."
        ),
        "{stdout}"
    );
}

/// A namespace with no table (a typo, most likely) is refused (78), and nothing is written;
/// `--create` starts the table there before the fleet does.
#[test]
fn a_namespace_without_a_table_is_refused_unless_created() {
    let redis = RedisServer::start();
    let args = ["--buckets", "1048576"];
    let (status, stdout, stderr) = resize_in(&redis, "evnets", &args);
    assert_eq!(
        (status, stdout.as_str(), stderr.as_str()),
        (
            78,
            "",
            "error: resizing the table of namespace \"evnets\": the store holds no table in \
             this namespace (no descriptor), and `resize` would start one that no sidecar uses \
             if the namespace is mistyped: pass the sidecars' own, their `--namespace` (by \
             default `nsq-dedupe.<topic>.<channel>` of their stream), or `--config` with their \
             config file; to create the table before the fleet starts, pass `--create`\n"
        )
    );
    assert_eq!(redis.cli(&["DBSIZE"]).trim(), "0", "nothing written");
    let (status, _, stderr) = resize_in(&redis, "evnets", &[&args[..], &["--create"]].concat());
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert_eq!(
        redis.cli(&["GET", "evnets:table"]).trim(),
        "v1 current=3:131072x8"
    );
}

/// `--rate` alone sizes the table for the default target probability over the default window
/// (not the default size), and the result says so.
#[test]
fn a_size_from_the_rate_says_how_it_was_computed() {
    let redis = RedisServer::start();
    let (status, stdout, stderr) = resize_in(&redis, "rate", &["--rate", "1000", "--create"]);
    assert_eq!(
        (status, stdout.as_str(), stderr.as_str()),
        (
            0,
            "The store held no table in namespace \"rate\": it now has one of 9910168 buckets \
             (1238771 sets of 8 ways) (`--create`), which the fleet takes when it starts.\n\
             Size: 9910168 buckets, for a catch probability of 0.99 (the default target) of a \
             copy up to 1h late (the default window) at 1000 distinct messages a second \
             (`--rate`).\n",
            ""
        )
    );
    assert_eq!(
        redis.cli(&["GET", "rate:table"]).trim(),
        "v1 current=3:1238771x8"
    );
}

/// The store flags only a running consumer uses are refused by name (78); the same keys in
/// the sidecars' config file are left unused.
#[test]
fn flags_only_a_running_consumer_uses_are_refused() {
    let base = [
        "--store",
        "redis",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--namespace",
        "x",
        "--buckets",
        "1024",
    ];
    for (extra, flag) in [
        (&["--snapshot-interval", "1m"][..], "--snapshot-interval"),
        (&["--journal-fsync"][..], "--journal-fsync"),
        (&["--lease", "70s"][..], "--lease"),
        (&["--table-file", "/tmp/t"][..], "--table-file"),
    ] {
        let (status, stdout, stderr) = resize(&[&base[..], extra].concat());
        assert_eq!(
            (status, stdout.as_str(), stderr),
            (
                78,
                "",
                format!(
                    "error: `{flag}` is used only by a running consumer (`run`), and `resize` \
                     does not use it: remove it (a `[store]` key of the sidecars' config file \
                     given with `--config` is left unused)\n"
                )
            )
        );
    }
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sidecar.toml");
    std::fs::write(
        &file,
        format!(
            "[store]\nkind = \"redis\"\nredis_urls = [{:?}]\nnamespace = \"x\"\n\
             snapshot_interval = \"1m\"\njournal_fsync = true\nlease = \"70s\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let (status, _, stderr) = resize(&[
        "--config",
        file.to_str().unwrap(),
        "--buckets",
        "1024",
        "--create",
    ]);
    assert_eq!((status, stderr.as_str()), (0, ""));
}

/// Back to the previous size while it is still read: that table becomes the current one
/// again, so nothing is forgotten, and the resize is let through without `--force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_back_to_the_previous_size_is_let_through() {
    let redis = RedisServer::start();
    let fleet = consumer(&redis, 262_144).await;
    let committed = digests(100, 3);
    assert!(fleet.claim_many(&committed).await.iter().all(Result::is_ok));
    assert!(fleet
        .commit_many(&committed)
        .await
        .iter()
        .all(Result::is_ok));
    let (status, _, stderr) = resize_in(&redis, "twice", &["--buckets", "1048576"]);
    assert_eq!((status, stderr.as_str()), (0, ""));
    let (status, stdout, stderr) = resize_in(&redis, "twice", &["--buckets", "262144"]);
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert!(!stdout.contains("Forgotten"), "{stdout}");
    let store = RedisStore::new_lazy(redis_config(&redis), geometry(262_144)).unwrap();
    assert_eq!(caught(store, &committed).await, 100);
}
