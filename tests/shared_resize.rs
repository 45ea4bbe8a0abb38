//! A fleet resizes the table it shares in Redis or Memcached without forgetting:
//! `nsq-dedupe resize` writes the store's descriptor, a sidecar restarted with the new size and one left running
//! with the old flag both follow it, and the messages taken before the resize stay seen; a
//! sidecar killed during a resize loses nothing. Then the store's own claims, commits and
//! erases across a resize.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::dedup::generational::resize;
use nsq_dedupe::{
    Claim, Digest, Generation, Generations, Geometry, MemcachedConfig, MemcachedStore, RedisConfig,
    RedisStore, Shape, Store,
};

use crate::sidecar::{drained, payload, sidecar_binary, spawn_sidecar, ChildGuard, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::memcached::MemcachedServer;
use crate::support::redis::{Flavor, RedisCluster, RedisServer};
use crate::util::wait_until_or;

const OUT: &str = "events.unique";
const OLD_BUCKETS: u64 = 262_144;
const NEW_BUCKETS: u64 = 1_048_576;

/// The shared store of a test.
enum Shared {
    Redis(RedisServer),
    Memcached(MemcachedServer),
    /// A cluster of three masters with a replica each, its nodes given as seeds.
    Cluster(RedisCluster),
}

impl Shared {
    fn redis() -> Shared {
        Shared::Redis(RedisServer::start())
    }

    fn cluster(flavor: Flavor) -> Shared {
        Shared::Cluster(RedisCluster::of(flavor, Duration::from_secs(1)))
    }

    fn memcached() -> Shared {
        Shared::Memcached(MemcachedServer::start())
    }

    /// Its `[store]` keys.
    fn toml(&self) -> String {
        match self {
            Shared::Redis(redis) => format!("kind = \"redis\"\nredis_urls = [\"{}\"]", redis.url()),
            Shared::Memcached(memcached) => format!(
                "kind = \"memcached\"\nmemcached_addresses = [\"{}\"]",
                memcached.addr()
            ),
            Shared::Cluster(cluster) => format!(
                "kind = \"redis\"\nredis_cluster = true\nredis_urls = {:?}",
                cluster.urls()
            ),
        }
    }

    /// Its flags.
    fn flags(&self) -> Vec<String> {
        match self {
            Shared::Redis(redis) => vec![
                "--store".into(),
                "redis".into(),
                "--redis-url".into(),
                redis.url(),
            ],
            Shared::Memcached(memcached) => vec![
                "--store".into(),
                "memcached".into(),
                "--memcached-address".into(),
                memcached.addr(),
            ],
            Shared::Cluster(cluster) => ["--store", "redis", "--redis-cluster"]
                .into_iter()
                .map(String::from)
                .chain(
                    cluster
                        .urls()
                        .into_iter()
                        .flat_map(|url| ["--redis-url".to_owned(), url]),
                )
                .collect(),
        }
    }
}

/// A sidecar's config file: the broker's topic into its `events.unique`, through the table
/// in the shared store at `buckets`; the descriptor is read every 200 ms, the status line
/// logged every second.
fn config(dir: &Path, name: &str, broker: &Broker, shared: &Shared, buckets: u64) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[source]
nsqd_tcp_addresses = ["{addr}"]
topic = "{TOPIC}"
channel = "{CHANNEL}"
max_in_flight = 20
msg_timeout = "1s"
heartbeat_interval = "1s"
backoff = "10ms"
max_backoff = "200ms"

[dedupe]
in_flight_requeue_delay = "200ms"

[store]
{store}
namespace = "resize"
buckets = {buckets}
lease = "1500ms"
fleet_interval = "200ms"

[sink]
kind = "nsq"
destination_nsqd_tcp_addresses = ["{addr}"]
destination_topic = "{OUT}"

[metrics]
address = "off"
status_interval = "1s"

[shutdown]
grace = "2s"
"#,
            addr = broker.tcp_addr(),
            store = shared.toml(),
        ),
    )
    .unwrap();
    path
}

/// `nsq-dedupe resize` of the test's namespace to `buckets`; its stdout.
fn resize_command(shared: &Shared, buckets: u64) -> String {
    resize_command_with(shared, buckets, &[])
}

/// [`resize_command`] with `extra` flags.
fn resize_command_with(shared: &Shared, buckets: u64, extra: &[&str]) -> String {
    let out = Command::new(sidecar_binary())
        .args(["resize", "--namespace", "resize"])
        .args(shared.flags())
        .args(["--buckets", &buckets.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("the nsq-dedupe binary runs");
    assert!(
        out.status.success(),
        "resize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// How many times each body came out.
fn delivered(broker: &Broker) -> HashMap<Bytes, usize> {
    let mut counts = HashMap::new();
    for body in broker.messages_on(OUT) {
        *counts.entry(body).or_insert(0) += 1;
    }
    counts
}

async fn wait_out(broker: &Broker, n: usize, logs: &[&Path]) {
    wait_until_or(
        &format!("{n} bodies out and the channel drained"),
        Duration::from_secs(60),
        || broker.messages_on(OUT).len() >= n && drained(broker),
        || {
            let text: Vec<String> = logs
                .iter()
                .map(|log| std::fs::read_to_string(log).unwrap_or_default())
                .collect();
            format!(
                "{} out; logs:\n{}",
                broker.messages_on(OUT).len(),
                text.join("\n")
            )
        },
    )
    .await;
}

/// Two sidecars `a` and `b` sharing `shared`'s table at [`OLD_BUCKETS`], each logging to its
/// own file, on a fresh broker; `new` is the same configuration at [`NEW_BUCKETS`].
struct Fleet {
    broker: Broker,
    /// Holds the configurations and the logs.
    dir: tempfile::TempDir,
    new: PathBuf,
    log_a: PathBuf,
    log_b: PathBuf,
    a: ChildGuard,
    b: ChildGuard,
}

impl Fleet {
    async fn start(shared: &Shared) -> Fleet {
        let broker = Broker::start(BrokerConfig::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let old = config(dir.path(), "old", &broker, shared, OLD_BUCKETS);
        let new = config(dir.path(), "new", &broker, shared, NEW_BUCKETS);
        let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        let a = ChildGuard(Some(spawn_sidecar(&old, &log_a)));
        let b = ChildGuard(Some(spawn_sidecar(&old, &log_b)));
        Fleet {
            broker,
            dir,
            new,
            log_a,
            log_b,
            a,
            b,
        }
    }
}

/// The lines of `logs` above INFO, for a failure's message.
fn warnings(logs: &[&Path]) -> String {
    logs.iter()
        .flat_map(|log| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
                .map(|line| format!("{}: {line}\n", log.display()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether a line of `log` at `level` (such as `" WARN "`) says `message`.
fn logged_at(log: &str, level: &str, message: &str) -> bool {
    log.lines()
        .any(|line| line.contains(level) && line.contains(message))
}

/// Stops a sidecar with SIGTERM (a graceful stop, as a rolling restart does).
fn stop(guard: &mut ChildGuard) {
    let mut child = guard.0.take().unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill(2) with a pid of our own child and a valid signal touches no memory.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_resized_one_sidecar_at_a_time_forgets_nothing_in_redis() {
    a_fleet_resized_one_sidecar_at_a_time_forgets_nothing(Shared::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_resized_one_sidecar_at_a_time_forgets_nothing_in_memcached() {
    a_fleet_resized_one_sidecar_at_a_time_forgets_nothing(Shared::memcached()).await;
}

/// The same on a Redis Cluster: the descriptor and each set are keys of their own slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_resized_one_sidecar_at_a_time_forgets_nothing_in_a_redis_cluster() {
    a_fleet_resized_one_sidecar_at_a_time_forgets_nothing(Shared::cluster(Flavor::Redis)).await;
}

/// The same on a cluster of Valkey 8.1, whose operations are decided in the client and
/// written with `SET … IFEQ`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_resized_one_sidecar_at_a_time_forgets_nothing_in_a_valkey_cluster() {
    a_fleet_resized_one_sidecar_at_a_time_forgets_nothing(Shared::cluster(Flavor::Valkey)).await;
}

async fn a_fleet_resized_one_sidecar_at_a_time_forgets_nothing(shared: Shared) {
    let Fleet {
        broker,
        dir: _dir,
        new,
        log_a,
        log_b,
        a,
        mut b,
    } = Fleet::start(&shared).await;
    let logs = [log_a.as_path(), log_b.as_path()];
    const N: usize = 5_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &logs).await;
    assert_eq!(delivered(&broker).len(), N, "each of the first {N} once");

    let said = resize_command(&shared, NEW_BUCKETS);
    assert!(
        said.contains("is now 1048576 buckets") && said.contains("it was 262144 buckets"),
        "{said}"
    );
    // One sidecar restarted with the new size; the other keeps running with its old flag.
    stop(&mut b);
    b = ChildGuard(Some(spawn_sidecar(&new, &log_b)));
    let log_text = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
    wait_until_or(
        "the sidecar left running follows the resize",
        Duration::from_secs(10),
        || {
            log_text(&log_a).contains(
                "Following the store's table to the size and layout its descriptor names.",
            )
        },
        || log_text(&log_a),
    )
    .await;
    let warned = log_text(&log_a);
    assert!(
        logged_at(
            &warned,
            " INFO ",
            "The store's table was resized from 262144 to 1048576 buckets: following it. Give \
             this consumer the new size (1048576 buckets), or no size (a probability and a \
             window without a rate: a table that sizes itself), before it next starts."
        ),
        "the sidecar given the old size says it follows the store's: {warned}"
    );
    // Its status line shows the previous table it still reads.
    let followed = warned.len();
    wait_until_or(
        "a status line that shows the previous table",
        Duration::from_secs(10),
        || log_text(&log_a)[followed..].contains("previous_slots=262144"),
        || log_text(&log_a)[followed..].to_owned(),
    )
    .await;

    broker.publish_many(TOPIC, (0..N).map(payload));
    broker.publish_many(TOPIC, (N..N + 2_000).map(payload));
    wait_out(&broker, N + 2_000, &logs).await;
    let counts = delivered(&broker);
    let again: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert_eq!(
        again.len(),
        0,
        "of the first {N} sent again after the resize, none delivered a second time; \
         warnings:\n{}",
        warnings(&logs)
    );
    assert_eq!(
        counts.len(),
        N + 2_000,
        "each of the 2,000 new ones delivered"
    );
    // How a Redis store writes is said once, although the sidecar left running opened a
    // second generation on the same servers.
    let said = log_text(&log_a).matches("The Redis store writes ").count();
    let expected = usize::from(!matches!(shared, Shared::Memcached(_)));
    assert_eq!(said, expected, "{}", log_text(&log_a));
    drop((a, b));
}

/// A fleet on a Memcached table of the earlier layout (key format 1, an item per set, as
/// earlier versions keep it) moves to the compact layout with `nsq-dedupe resize` at the same
/// size, while it runs, and forgets nothing: the messages taken in the earlier layout are not
/// delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_moves_to_the_compact_layout_without_forgetting_in_memcached() {
    a_fleet_moves_to_the_compact_layout_without_forgetting(Shared::memcached(), 1, 2).await;
}

/// The same in Redis: from a key per set (key format 2) to the compact layout (key format 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_moves_to_the_compact_layout_without_forgetting_in_redis() {
    a_fleet_moves_to_the_compact_layout_without_forgetting(Shared::redis(), 2, 3).await;
}

/// A fleet on `shared`'s table of key format `earlier` moves to key format `compact`.
async fn a_fleet_moves_to_the_compact_layout_without_forgetting(
    shared: Shared,
    earlier: u8,
    compact: u8,
) {
    let Fleet {
        broker,
        dir: _dir,
        log_a,
        log_b,
        a,
        b,
        ..
    } = Fleet::start(&shared).await;
    let logs = [log_a.as_path(), log_b.as_path()];
    // The fleet's descriptor made that of a table of the earlier layout, as an earlier
    // version's fleet has it.
    let mut descriptor = None;
    wait_until_or(
        "the fleet's descriptor written",
        Duration::from_secs(10),
        || {
            descriptor = shared.text("resize:table");
            descriptor.is_some()
        },
        String::new,
    )
    .await;
    let descriptor = descriptor.unwrap();
    let (now, then) = (format!("current={compact}:"), format!("current={earlier}:"));
    assert!(descriptor.starts_with(&format!("v1 {now}")), "{descriptor}");
    shared.set_text("resize:table", &descriptor.replace(&now, &then));
    let log_text = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
    let followed = |log: &Path, times: usize| {
        log_text(log)
            .matches("Following the store's table to the size and layout its descriptor names.")
            .count()
            >= times
    };
    wait_until_or(
        "the fleet follows the table of the earlier layout",
        Duration::from_secs(10),
        || followed(&log_a, 1) && followed(&log_b, 1),
        || log_text(&log_a),
    )
    .await;
    assert!(
        log_text(&log_a).contains(&format!(
            "earlier layout (key format {earlier}): following it. Once every consumer of the \
             table runs this version, `nsq-dedupe resize --namespace resize --buckets \
             {OLD_BUCKETS} --ways 8` (with the store's flags) moves it to key format {compact} \
             without forgetting"
        )),
        "{}",
        log_text(&log_a)
    );
    const N: usize = 5_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &logs).await;
    assert_eq!(delivered(&broker).len(), N, "each of the first {N} once");

    let said = resize_command(&shared, OLD_BUCKETS);
    assert!(
        said.contains(&format!(
            "key format {compact}); it was 262144 buckets (32768 sets of 8 ways, key format \
             {earlier})"
        )),
        "{said}"
    );
    wait_until_or(
        "the fleet follows the move to the compact layout",
        Duration::from_secs(10),
        || followed(&log_a, 2) && followed(&log_b, 2),
        || log_text(&log_a),
    )
    .await;
    broker.publish_many(TOPIC, (0..N).map(payload));
    broker.publish_many(TOPIC, (N..N + 2_000).map(payload));
    wait_out(&broker, N + 2_000, &logs).await;
    let counts = delivered(&broker);
    assert_eq!(
        counts.values().filter(|&&n| n > 1).count(),
        0,
        "of the first {N} sent again after the move, none delivered a second time"
    );
    assert_eq!(
        counts.len(),
        N + 2_000,
        "each of the 2,000 new ones delivered"
    );
    drop((a, b));
}

impl Shared {
    /// The text the store holds under `key`, if any.
    fn text(&self, key: &str) -> Option<String> {
        match self {
            Shared::Memcached(server) => memcached_text(&server.addr(), key),
            Shared::Redis(server) => {
                Some(server.cli(&["GET", key]).trim_end().to_owned()).filter(|t| !t.is_empty())
            }
            Shared::Cluster(_) => unimplemented!("a descriptor read from a cluster's node"),
        }
    }

    /// Sets `key` to the text `value` in the store.
    fn set_text(&self, key: &str, value: &str) {
        match self {
            Shared::Memcached(server) => memcached_set(&server.addr(), key, value),
            Shared::Redis(server) => {
                server.cli(&["SET", key, value]);
            }
            Shared::Cluster(_) => unimplemented!("a descriptor written to a cluster's node"),
        }
    }
}

/// The text memcached at `addr` holds under `key`, if any (meta protocol).
fn memcached_text(addr: &str, key: &str) -> Option<String> {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(addr).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    (&stream)
        .write_all(format!("mg {key} v\r\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    if line.starts_with("EN") {
        return None;
    }
    let mut value = String::new();
    reader.read_line(&mut value).unwrap();
    Some(value.trim_end().to_owned())
}

/// Sets `key` to `value` in memcached at `addr`.
fn memcached_set(addr: &str, key: &str, value: &str) {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(addr).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    (&stream)
        .write_all(format!("ms {key} {}\r\n{value}\r\n", value.len()).as_bytes())
        .unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "HD\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_restarted_with_another_size_follows_the_stores_table_in_redis() {
    a_sidecar_restarted_with_another_size_follows_the_stores_table(Shared::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_restarted_with_another_size_follows_the_stores_table_in_memcached() {
    a_sidecar_restarted_with_another_size_follows_the_stores_table(Shared::memcached()).await;
}

async fn a_sidecar_restarted_with_another_size_follows_the_stores_table(shared: Shared) {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let old = config(dir.path(), "old", &broker, &shared, OLD_BUCKETS);
    let new = config(dir.path(), "new", &broker, &shared, NEW_BUCKETS);
    let log = dir.path().join("sidecar.log");
    let mut sidecar = ChildGuard(Some(spawn_sidecar(&old, &log)));
    const N: usize = 2_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &[&log]).await;
    // Restarted with another size and no `resize`: the store's table stays the one in use.
    stop(&mut sidecar);
    let started = std::fs::read_to_string(&log).unwrap().len();
    sidecar = ChildGuard(Some(spawn_sidecar(&new, &log)));
    broker.publish_many(TOPIC, (0..N).map(payload));
    broker.publish_many(TOPIC, (N..N + 500).map(payload));
    wait_out(&broker, N + 500, &[&log]).await;
    let counts = delivered(&broker);
    assert_eq!(
        counts.values().filter(|&&n| n > 1).count(),
        0,
        "of the {N} sent again, none delivered a second time"
    );
    assert_eq!(counts.len(), N + 500);
    let said = std::fs::read_to_string(&log).unwrap()[started..].to_owned();
    assert_eq!(
        said.matches("`nsq-dedupe resize`").count(),
        1,
        "the size given and the store's are named once: {said}"
    );
    assert!(
        logged_at(
            &said,
            " WARN ",
            "The store's table has 262144 buckets, not the 1048576 given here: following the \
             store's table, whose data is intact. Give this consumer the store's size (262144 \
             buckets), or no size (a probability and a window without a rate: a table that \
             sizes itself); `nsq-dedupe resize` changes the store's size."
        ),
        "{said}"
    );
    drop(sidecar);
}

/// A sidecar that sizes itself (given no size) joining a table that has grown follows the
/// store's size and says so once at INFO: no warning of a size it was never given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_sizes_itself_follows_a_grown_table_without_a_warning() {
    let said = a_sidecar_that_sizes_itself_joins_a_grown_table("").await;
    let followed = "The table sizes itself and follows the store's table of 1048576 buckets.";
    assert_eq!(said.matches(followed).count(), 1, "{said}");
    assert!(logged_at(&said, " INFO ", followed), "{said}");
    assert!(!said.contains(" WARN "), "no warning: {said}");
}

/// The same sidecar given a `max_memory` below what the grown table holds (8 MiB, counted as
/// an in-process table) follows it all the same, and says once, at WARN, that another
/// consumer grew it past this one's ceiling and that a fleet's consumers want the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_sizes_itself_below_a_grown_table_says_whose_ceiling_differs() {
    let said = a_sidecar_that_sizes_itself_joins_a_grown_table("max_memory = \"4MiB\"\n").await;
    let warned = "The shared table holds 8.0 MiB in its generations, more than this consumer's \
                  `store.max_memory` of 4.0 MiB: another consumer grew it. This one follows it \
                  as it is (a table never shrinks) and does not grow it further. Give every \
                  consumer of the table the same `store.max_memory`.";
    assert_eq!(said.matches(warned).count(), 1, "{said}");
    assert!(logged_at(&said, " WARN ", warned), "{said}");
    assert!(!said.contains("whose data is intact"), "{said}");
}

/// A sidecar sizing itself (its `[store]` also given `extra`) joins a Redis table resized to
/// [`NEW_BUCKETS`] and takes 200 messages, every one out; what it logged.
async fn a_sidecar_that_sizes_itself_joins_a_grown_table(extra: &str) -> String {
    let shared = Shared::redis();
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // The table started at that size before the fleet.
    resize_command_with(&shared, NEW_BUCKETS, &["--create"]);
    let fixed = config(dir.path(), "fixed", &broker, &shared, NEW_BUCKETS);
    let growing = dir.path().join("growing.toml");
    let text = std::fs::read_to_string(&fixed).unwrap().replace(
        &format!("buckets = {NEW_BUCKETS}\n"),
        &format!("probability = 0.99\nwindow = \"30s\"\n{extra}"),
    );
    std::fs::write(&growing, text).unwrap();
    let log = dir.path().join("sidecar.log");
    let sidecar = ChildGuard(Some(spawn_sidecar(&growing, &log)));
    const N: usize = 200;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &[&log]).await;
    drop(sidecar);
    std::fs::read_to_string(&log).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_during_a_resize_loses_nothing_in_redis() {
    a_sidecar_killed_during_a_resize_loses_nothing(Shared::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_during_a_resize_loses_nothing_in_memcached() {
    a_sidecar_killed_during_a_resize_loses_nothing(Shared::memcached()).await;
}

/// The fleet takes `N` messages at the old size, then `M` more; `resize` lands while the
/// second batch is under way, and one sidecar is killed with SIGKILL as it does, its claims
/// of the old size in flight. Copies of everything published afterwards, the killed
/// sidecar restarted with the new size, are caught where the old generation holds them.
async fn a_sidecar_killed_during_a_resize_loses_nothing(shared: Shared) {
    let Fleet {
        broker,
        dir: _dir,
        new,
        log_a,
        log_b,
        mut a,
        b,
    } = Fleet::start(&shared).await;
    let logs = [log_a.as_path(), log_b.as_path()];
    const N: usize = 5_000;
    const M: usize = 6_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &logs).await;
    broker.publish_many(TOPIC, (N..N + M).map(payload));
    wait_until_or(
        "1,000 of the second batch out",
        Duration::from_secs(30),
        || broker.messages_on(OUT).len() >= N + 1_000,
        String::new,
    )
    .await;
    resize_command(&shared, NEW_BUCKETS);
    // SIGKILL while its claims of the old size are in flight: nothing is answered.
    let mut killed = a.0.take().unwrap();
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(
        broker.messages_on(OUT).len() < N + M,
        "the whole stream was done before the kill; nothing was tested"
    );
    a = ChildGuard(Some(spawn_sidecar(&new, &log_a)));
    // Copies of the first batch, which only the old generation holds.
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N + M, &logs).await;
    let counts = delivered(&broker);
    let missing = (0..N + M)
        .filter(|&i| !counts.contains_key(&payload(i)))
        .count();
    assert_eq!(
        missing, 0,
        "every payload delivered after the kill and the resize"
    );
    let again = |range: std::ops::Range<usize>, counts: &HashMap<Bytes, usize>| {
        range
            .filter(|&i| counts.get(&payload(i)).is_some_and(|&n| n > 1))
            .count()
    };
    assert_eq!(
        again(0..N, &counts),
        0,
        "of the {N} taken before the resize and sent again after the kill, none delivered \
         a second time; warnings:\n{}",
        warnings(&logs)
    );
    // Those the killed sidecar had sent out but not committed go again (at most one
    // `max_in_flight` of them); the rest were committed, in one generation or the other.
    let redelivered = again(N..N + M, &counts);
    assert!(redelivered <= 20, "{redelivered} delivered twice");
    broker.publish_many(TOPIC, (N..N + M).map(payload));
    wait_until_or(
        "the copies of the second batch answered",
        Duration::from_secs(60),
        || drained(&broker),
        String::new,
    )
    .await;
    let total = |counts: &HashMap<Bytes, usize>| {
        (N..N + M)
            .map(|i| counts.get(&payload(i)).copied().unwrap_or(0))
            .sum::<usize>()
    };
    assert_eq!(
        total(&delivered(&broker)),
        total(&counts),
        "of the second batch sent again, none delivered again"
    );
    drop((a, b));
}

/// A shared table too small for the rate: the warning names `nsq-dedupe resize`, which
/// changes the size of every consumer's table without forgetting, and says that the target
/// is the default one when none was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_table_too_small_names_nsq_dedupe_resize() {
    let shared = Shared::redis();
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let small = config(dir.path(), "small", &broker, &shared, 4_096);
    let log = dir.path().join("sidecar.log");
    let sidecar = ChildGuard(Some(spawn_sidecar(&small, &log)));
    const N: usize = 2_000;
    broker.publish_many(TOPIC, (0..N).map(payload));
    wait_out(&broker, N, &[&log]).await;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until_or(
        "a warning that the table is too small",
        Duration::from_secs(10),
        || log_text().contains("The table is too small for its window"),
        log_text,
    )
    .await;
    let text = log_text();
    let warning = text
        .lines()
        .find(|line| line.contains("The table is too small for its window"))
        .unwrap();
    assert!(
        warning.contains("below the default target 0.99 (no --probability was given); `nsq-dedupe resize --namespace resize --buckets ")
            && warning.contains(
                "(with --ways 8 and the store's flags) resizes the table of every consumer to \
                 meet it, without forgetting what it holds."
            )
            && !warning.contains("--memory"),
        "{warning}"
    );
    // Resized, still too small for the window's 2,000 messages: while the previous size is
    // read, a second resize would forget it, and the warning says to wait instead.
    resize_command(&shared, 4_160);
    let before = log_text().len();
    let waiting = "; a resize is under way (the previous size, 4096 buckets, is still read): \
                   once it is no longer read, `nsq-dedupe resize --namespace resize --buckets ";
    wait_until_or(
        "a warning that says to wait for the resize under way",
        Duration::from_secs(10),
        || log_text()[before..].contains(waiting),
        || log_text()[before..].to_owned(),
    )
    .await;
    drop(sidecar);
}

fn digest(i: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes()))
}

fn store_config(urls: Vec<String>, cluster: bool) -> RedisConfig {
    RedisConfig {
        urls,
        cluster,
        namespace: "generations".into(),
        // These tests are of answers, not of time limits: a busy machine may take longer
        // than the default 500 ms to answer a connect.
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_commits_and_erases_keep_their_answers_across_a_resize() {
    let redis = RedisServer::start();
    across_a_resize(store_config(vec![redis.url()], false), false).await;
}

/// The same in Memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_across_a_resize_in_memcached() {
    let memcached = MemcachedServer::start();
    let config = MemcachedConfig {
        servers: vec![memcached.addr()],
        namespace: "generations".into(),
        ..MemcachedConfig::default()
    };
    let open = |geometry| MemcachedStore::connect(config.clone(), geometry);
    claims_across(open(small()).await.unwrap(), open(large()).await.unwrap()).await;
}

/// A namespace in which a version before descriptors kept a Memcached table (the earlier
/// layout, and no descriptor): the first consumer of this version reads it as the previous
/// generation, so the messages taken there stay seen; a namespace that holds nothing has no
/// previous generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_kept_without_a_descriptor_is_read_as_the_previous_generation_in_memcached() {
    let memcached = MemcachedServer::start();
    let config = |namespace: &str| MemcachedConfig {
        servers: vec![memcached.addr()],
        namespace: namespace.into(),
        ..MemcachedConfig::default()
    };
    let geometry = large();
    let fresh = MemcachedStore::connect(config("earlier"), geometry)
        .await
        .unwrap();
    let earlier_shape = Shape {
        format: 1,
        geometry,
    };
    let earlier = fresh.reshaped(earlier_shape).unwrap();
    let seen: Vec<Digest> = (0..500).map(digest).collect();
    assert_eq!(
        earlier.claim_done_many(&seen).await,
        vec![Ok(Claim::New); 500]
    );
    let store = Generations::new(fresh);
    store.follow().await.unwrap();
    assert_eq!(
        store.previous().map(|(shape, _)| shape),
        Some(earlier_shape)
    );
    assert_eq!(
        store.claim_many(&seen).await,
        vec![Ok(Claim::Duplicate); 500],
        "taken by the earlier version: copies"
    );
    assert_eq!(store.claim(digest(5_000)).await, Ok(Claim::New));

    let empty = Generations::new(
        MemcachedStore::connect(config("nothing"), geometry)
            .await
            .unwrap(),
    );
    empty.follow().await.unwrap();
    assert_eq!(empty.previous(), None);
}

/// Claims, commits and erases made in a Redis table of a key per set (key format 2, as earlier
/// versions keep it), seen by a consumer of the compact layout (key format 3) after `resize`
/// moved the table there, and kept by the consumer that made them, which follows: on Redis 7.0
/// (the set script, then the compare-and-set script) and Valkey 8.1 (`SET … IFEQ`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_a_key_per_set_are_caught_after_the_move_to_the_compact_layout() {
    for flavor in [Flavor::Redis, Flavor::Valkey] {
        let server = RedisServer::of(flavor, &[]);
        let config = store_config(vec![server.url()], false);
        let before = RedisStore::connect_in(config.clone(), small(), 2)
            .await
            .unwrap();
        let after = RedisStore::connect(config, large()).await.unwrap();
        assert_eq!((before.key_format(), after.key_format()), (2, 3));
        claims_across(before, after).await;
    }
}

/// A namespace in which a version before descriptors kept a Redis table (a key per set, and
/// no descriptor): the first consumer of this version reads it as the previous generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_kept_without_a_descriptor_is_read_as_the_previous_generation_in_redis() {
    let redis = RedisServer::start();
    let config = store_config(vec![redis.url()], false);
    let geometry = large();
    let earlier = RedisStore::connect_in(config.clone(), geometry, 2)
        .await
        .unwrap();
    let seen: Vec<Digest> = (0..500).map(digest).collect();
    assert_eq!(
        earlier.claim_done_many(&seen).await,
        vec![Ok(Claim::New); 500]
    );
    let store = Generations::new(RedisStore::connect(config, geometry).await.unwrap());
    store.follow().await.unwrap();
    assert_eq!(
        store.previous().map(|(shape, _)| shape),
        Some(Shape {
            format: 2,
            geometry
        })
    );
    assert_eq!(
        store.claim_many(&seen).await,
        vec![Ok(Claim::Duplicate); 500],
        "taken by the earlier version: copies"
    );
    assert_eq!(store.claim(digest(5_000)).await, Ok(Claim::New));
}

/// The same on Valkey 8.1, whose operations are decided in the client and written with
/// `SET … IFEQ`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_across_a_resize_on_valkey_with_ifeq() {
    let valkey = RedisServer::of(Flavor::Valkey, &[]);
    across_a_resize(store_config(vec![valkey.url()], false), true).await;
}

/// The same on a Redis Cluster: the descriptor and each set are keys of their own slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_across_a_resize_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    across_a_resize(store_config(cluster.urls(), true), false).await;
}

/// A descriptor of another key format (written by another version) is not followed: the
/// consumer keeps the size it was given and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_of_another_key_format_is_not_followed() {
    let redis = RedisServer::start();
    redis.cli(&["SET", "generations:table", "v1 current=9:16384x4"]);
    let config = store_config(vec![redis.url()], false);
    let store = Generations::new(RedisStore::connect(config, small()).await.unwrap());
    assert_eq!(
        store.follow().await.unwrap_err().to_string(),
        "store protocol error: the table's descriptor `generations:table` names a table of key \
         format 9, and this version reads and writes key format 3: upgrade every consumer of \
         the table to one version"
    );
    assert_eq!(store.geometry(), Some(small()));
}

/// Claims, commits and erases made before a resize, by a consumer that follows it, seen by
/// a consumer started with the new size.
async fn across_a_resize(config: RedisConfig, ifeq: bool) {
    let before = RedisStore::connect(config.clone(), small()).await.unwrap();
    assert_eq!(before.uses_ifeq(), ifeq);
    let after = RedisStore::connect(config, large()).await.unwrap();
    claims_across(before, after).await;
}

/// The table before the store-level resize.
fn small() -> Geometry {
    Geometry::new(4_096, 4).unwrap()
}

/// The table after it.
fn large() -> Geometry {
    Geometry::new(16_384, 4).unwrap()
}

/// `before`, a store of the [`small`] table, claims, commits and erases, and follows a
/// resize to the [`large`] one; `after`, a store of the large table, sees its answers.
async fn claims_across<S: Generation>(before: S, after: S) {
    let (small, large) = (small(), large());
    let before = Generations::new(before);
    before.follow().await.unwrap();
    let (done, held, failed) = (digest(1), digest(2), digest(3));
    let claims = before.claim_many(&[done, held, failed]).await;
    assert_eq!(claims, vec![Ok(Claim::New); 3]);
    assert_eq!(before.commit(done).await, Ok(true));

    // Resized as `nsq-dedupe resize` of the new version does it: to its own layout.
    let resized = resize(&after, large).await.unwrap();
    assert_eq!(resized.after.current.geometry, large);
    assert_eq!(resized.after.current.format, after.format());
    // A consumer started with the new size, and the one that made the claims following.
    let after = Generations::new(after);
    after.follow().await.unwrap();
    before.follow().await.unwrap();
    assert_eq!(
        before.geometry(),
        Some(large),
        "the running consumer follows"
    );
    assert_eq!(
        after.previous().map(|(shape, _)| shape.geometry),
        Some(small)
    );

    // Committed before the resize: a copy. In flight: in flight, and left to its claim.
    let (fresh, other) = (digest(4), digest(5));
    let claims = after.claim_many(&[done, held, failed, fresh]).await;
    assert_eq!(
        claims,
        vec![
            Ok(Claim::Duplicate),
            Ok(Claim::InFlight),
            Ok(Claim::InFlight),
            Ok(Claim::New)
        ]
    );
    // The claims made before the resize commit and erase where they were made.
    assert_eq!(before.commit(held).await, Ok(true));
    assert_eq!(before.erase(failed).await, Ok(true));
    assert_eq!(after.claim(held).await, Ok(Claim::Duplicate));
    // A failed message's retry passes, and is not taken for a copy.
    assert_eq!(after.claim(failed).await, Ok(Claim::New));
    assert_eq!(after.commit(failed).await, Ok(true));
    assert_eq!(before.claim(failed).await, Ok(Claim::Duplicate));
    // New claims live in the new table, for both consumers.
    assert_eq!(after.commit(fresh).await, Ok(true));
    assert_eq!(before.claim(fresh).await, Ok(Claim::Duplicate));
    assert_eq!(before.claim(other).await, Ok(Claim::New));
    assert_eq!(after.claim(other).await, Ok(Claim::InFlight));
    assert_eq!(before.erase(other).await, Ok(true));
    assert_eq!(after.claim(other).await, Ok(Claim::New));
}

/// Runs `nsq-dedupe resize` with `args`; its exit status and stderr.
fn resize_fails(args: &[&str]) -> (i32, String) {
    let out = Command::new(sidecar_binary())
        .arg("resize")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the nsq-dedupe binary runs");
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

/// `resize` given no size is a setting to add (78), not the default size written into every
/// consumer's table; it names the flags, and touches no store.
#[test]
fn resize_without_a_size_is_refused() {
    assert_eq!(
        resize_fails(&["--store", "redis", "--redis-url", "redis://127.0.0.1:1"]),
        (
            78,
            "error: `resize` sets the size of the table every consumer shares, and none was \
             given: pass `--buckets N`, `--memory SIZE` or `--rate R` (or set `store.buckets`, \
             `store.memory` or `store.rate` in the config file). The size the table has now, \
             given again, moves it to this version's layout without resizing it (a consumer \
             following a table of an earlier layout names it in its WARN)\n"
                .into()
        )
    );
}

/// `resize` given neither a namespace nor the sidecars' stream is refused (78): each stream's
/// consumers keep their own table by default, and it cannot tell which one is meant.
#[test]
fn resize_without_a_namespace_or_a_topic_is_refused() {
    assert_eq!(
        resize_fails(&[
            "--store",
            "redis",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--buckets",
            "1024"
        ]),
        (
            78,
            "error: `resize` needs to know whose table to resize, and neither `--namespace` \
             nor `--config` naming a topic was given: pass the sidecars' `--namespace`, or \
             `--config` with the sidecars' config file (its `[source]` topic and channel name their table when it \
             sets no `store.namespace`: `nsq-dedupe.<topic>.<channel>`)\n"
                .into()
        )
    );
}

/// `resize --config` with the sidecars' file resizes the table they use: their stream's
/// when the file names no namespace, with their digest key's fingerprint when they key it.
#[test]
fn resize_with_the_sidecars_config_resizes_their_table() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("digest.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let fingerprint = nsq_dedupe::DigestKey::from_file_contents(&[7u8; 32])
        .unwrap()
        .fingerprint();
    for (dedupe, namespace) in [
        (String::new(), "nsq-dedupe.orders.billing".to_owned()),
        (
            format!(
                "[dedupe]\ndigest_key_file = {:?}\n",
                key.display().to_string()
            ),
            format!("nsq-dedupe.orders.billing.k{fingerprint}"),
        ),
    ] {
        let file = dir.path().join("sidecar.toml");
        std::fs::write(
            &file,
            format!(
                "[source]\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\ntopic = \"orders\"\n\
                 channel = \"billing\"\n{dedupe}[store]\nkind = \"redis\"\n\
                 redis_urls = [{:?}]\nbuckets = 1048576\n",
                server.url()
            ),
        )
        .unwrap();
        let out = Command::new(sidecar_binary())
            .args([
                "resize",
                "--config",
                file.to_str().unwrap(),
                "--buckets",
                "2097152",
                "--create",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("the nsq-dedupe binary runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains(&format!("namespace {namespace:?}")),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `resize` keeps a table's ways unless told: without `--ways`, a table of other ways than
/// the default is refused (78), naming both; with them, it is resized.
#[test]
fn resize_without_ways_keeps_or_refuses_the_tables_ways() {
    let server = RedisServer::start();
    let url = server.url();
    let run = |args: &[&str]| {
        let out = Command::new(sidecar_binary())
            .args([
                "resize",
                "--store",
                "redis",
                "--redis-url",
                &url,
                "--namespace",
                "w",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("the nsq-dedupe binary runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, said, _) = run(&["--ways", "4", "--buckets", "65536", "--create"]);
    assert_eq!(status, Some(0));
    assert!(said.contains("(16384 sets of 4 ways)"), "{said}");
    let (status, said, stderr) = run(&["--buckets", "131072"]);
    assert_eq!((status, said.as_str()), (Some(78), ""));
    assert_eq!(
        stderr.lines().last(),
        Some(
            "error: resizing the table of namespace \"w\": the table has 4 ways, and `resize` \
             without `--ways` would give it 8: pass `--ways 4` to keep them (or `--ways 8` to \
             change them)"
        ),
        "{stderr}"
    );
    let (status, said, _) = run(&["--ways", "4", "--buckets", "131072"]);
    assert_eq!(status, Some(0));
    assert!(
        said.contains("is now 131072 buckets (32768 sets of 4 ways)"),
        "{said}"
    );
}

/// `resize` of a store that keeps no shared table is a setting to change (78), and says
/// which; a descriptor that holds something else is named, with what to do, and left alone.
#[test]
fn resize_refuses_a_store_without_a_shared_table_and_a_descriptor_it_cannot_read() {
    assert_eq!(
        resize_fails(&["--buckets", "1048576"]),
        (
            78,
            "error: `resize` changes the size of a table shared through Redis or Memcached, \
             and the store given is \"memory\": pass `--store redis` with `--redis-url`, or \
             `--store memcached` with `--memcached-address` (or set `store.kind` in the config \
             file); an in-process table takes its size from `--buckets` at start\n"
                .into()
        )
    );
    let redis = RedisServer::start();
    redis.cli(&["SET", "resize:table", "junk"]);
    let url = redis.url();
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--namespace",
        "resize",
    ];
    let (status, said) = resize_fails(&[&args[..], &["--buckets", "1048576"]].concat());
    // The error, after whatever the store logged when it connected.
    let error = said
        .lines()
        .filter(|line| line.starts_with("error: "))
        .map(|line| format!("{line}\n"))
        .collect::<String>();
    assert_eq!(
        (status, error.as_str()),
        (
            1,
            "error: resizing the table of namespace \"resize\": store protocol error: the \
             table's descriptor `resize:table` holds \"junk\", which is not a descriptor \
             (`v1 current=<format>:<sets>x<ways>[ previous=... since=<ms>]`); delete it to \
             start a table at the size given\n"
        )
    );
    assert_eq!(redis.cli(&["GET", "resize:table"]).trim(), "junk");
}

/// A consumer whose store did not answer its first read of the descriptor (down at start)
/// does not claim at the size it was given: its claims fail, as in an outage, until the
/// store answers, then go to the table the descriptor names, where the fleet's messages are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_could_not_read_the_descriptor_at_start_claims_nothing_until_it_can() {
    let mut redis = RedisServer::start();
    let config = store_config(vec![redis.url()], false);
    redis.kill();
    let late = Generations::new(RedisStore::new_lazy(config.clone(), small()).unwrap());
    assert!(late.follow().await.is_err(), "the store is down");
    let done = digest(1);
    assert!(
        late.claim(done).await.is_err(),
        "no claim while the table's size is unknown"
    );

    // The store comes back; the fleet resized its table, and a message is done in it.
    redis.restart();
    let fleet = RedisStore::connect(config, small()).await.unwrap();
    resize(&fleet, large()).await.unwrap();
    let fleet = Generations::new(fleet);
    fleet.follow().await.unwrap();
    assert_eq!(fleet.claim(done).await, Ok(Claim::New));
    assert_eq!(fleet.commit(done).await, Ok(true));

    assert_eq!(
        late.claim(done).await,
        Ok(Claim::Duplicate),
        "a copy of the fleet's message is caught"
    );
    assert_eq!(late.geometry(), Some(large()));
}

/// Two consumers decide to grow the table they share at once: one compare-and-set wins,
/// the other follows the winner instead of growing on top of it, and what was claimed
/// before stays seen by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_growing_at_once_follow_the_one_whose_growth_won() {
    let redis = RedisServer::start();
    let config = store_config(vec![redis.url()], false);
    let open = || async {
        let store = Generations::new(RedisStore::connect(config.clone(), small()).await.unwrap());
        store.follow().await.unwrap();
        store
    };
    let (first, second) = (open().await, open().await);
    let done = digest(1);
    assert_eq!(first.claim(done).await, Ok(Claim::New));
    assert_eq!(first.commit(done).await, Ok(true));

    assert_eq!(first.grow(large()).await, Ok(true), "the first growth wins");
    let medium = Geometry::new(8_192, 4).unwrap();
    assert_eq!(
        second.grow(medium).await,
        Ok(false),
        "decided on the table before the first growth: it lost"
    );
    for consumer in [&first, &second] {
        assert_eq!(consumer.geometry(), Some(large()), "both follow the winner");
        assert_eq!(
            consumer.previous().map(|(shape, _)| shape.geometry),
            Some(small())
        );
        assert_eq!(consumer.claim(done).await, Ok(Claim::Duplicate));
    }
    let descriptor = redis.cli(&["GET", "generations:table"]);
    assert!(
        descriptor.starts_with("v1 current=3:4096x4 previous=3:1024x4 since="),
        "{descriptor}"
    );
}
