//! What a shared table costs its store server per distinct message, against the pipelined
//! naive write users would send instead (`SET key v NX EX ttl` to Redis, a meta-protocol add,
//! `ms key 1 T<ttl> ME`, to Memcached), measured in the same run.
//!
//! For each store it starts a server on a free loopback port and reads the server's CPU time
//! (user + system, `/proc/<pid>/stat`) before and after each case:
//! - `naive`: the naive write of every message, in pipelines of one burst, several at once;
//! - `ours empty`: a claim and a commit of every message (`claim_many` then `commit_many` of
//!   each burst, as the sidecar sends them), on a table that starts empty and that the
//!   messages do not fill;
//! - `ours full`: the same on a small table filled first (every set at its ways), so that every
//!   claim replaces an entry;
//! - `one-shot empty` and `one-shot full`: the same two tables, each burst claimed done at
//!   once (`claim_done_many`, no commit), as the sidecar sends them for a sink that cannot
//!   fail once it took a message (`--sink null`);
//! - `resizing`: a claim and a commit of every message during a resize: a table of the full
//!   table's size, filled first, resized (`nsq-dedupe resize`'s descriptor) to the empty
//!   case's size, so that every claim also looks its digest up in the previous generation;
//! - `after resize`: the same table once its previous generation retired (no look-up);
//!   both are also given as a ratio to `ours empty`, the same table without a resize, and
//!   `resizing` to `ours full`, a table in use that a resize would relieve;
//! - `naive` again: the figure compared against is the mean of its two runs, so that a drift of
//!   the shared machine's load does not favour either side.
//!
//! Before each case (the full tables before they are filled) the Redis servers are emptied
//! (`FLUSHALL`), so that every case meets the same keyspace: its own table and nothing else.
//!
//! `valkey` runs the Redis cases on Valkey 8.1, twice on one server: the store as it runs
//! there (claims and commits written with `SET … IFEQ`), then forced through the set script,
//! each against the naive write measured around it. With `--instructions` the Redis and
//! Valkey servers run under valgrind's callgrind and the cost is their instructions per
//! message, which the machine's other load does not move.
//!
//! Every answer is checked: each fresh digest must be claimed new and its commit held, each
//! naive write stored. A commit may answer `false` only for an entry that `WAYS` newer claims
//! of its set may have pushed out before it (a burst that waited long between its claim and
//! its commit while the others went on); those are counted and printed, any other fails. Run through `bench/store-cost.sh` (see `--help` there), or
//! `cargo bench --bench store_cost -- [--messages N] [--burst B] [--tasks T]
//! [--full-slots S] [--consumers C] [--slots-per-item S] [--instructions] [redis]
//! [redis-cluster] [valkey] [memcached]`. `--slots-per-item` sets the slots of a Memcached
//! item (`MemcachedConfig::slots_per_item`). With `--consumers C`, C stores of one table (C
//! owners, as a fleet's consumers) take the bursts in turn, so a set is often written last by
//! another than the one that meets it.

#[path = "servers.rs"]
mod servers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nsq_dedupe::dedup::generational::resize;
use nsq_dedupe::{
    Claim, Digest, Generation, Generations, Geometry, MemcachedConfig, MemcachedStore, RedisConfig,
    RedisStore, Store,
};
use servers::{Program, RedisCluster, Server};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Clock ticks per second of `/proc/<pid>/stat` (Linux's `USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// Ways of every table measured: the sidecar's default.
const WAYS: u32 = 8;

struct Settings {
    messages: u64,
    /// Messages per burst: what the sidecar claims at once.
    burst: u64,
    /// Bursts in flight at once.
    tasks: u64,
    /// Slots of the table that is filled before it is measured.
    full_slots: u64,
    /// Instructions under callgrind instead of CPU time (Redis and Valkey only).
    instructions: bool,
    /// Stores of one table (each its own owner, as consumers of a fleet are) that take the
    /// bursts in turn.
    consumers: u64,
    /// Slots a Memcached item holds (`MemcachedConfig::slots_per_item`).
    slots_per_item: u32,
    /// The key format of the Redis tables (`None`: the store's own, the compact layout).
    redis_format: Option<u8>,
    stores: Vec<String>,
}

impl Settings {
    fn from_args() -> Result<Self, String> {
        let mut settings = Settings {
            messages: 300_000,
            burst: 128,
            tasks: 4,
            full_slots: 65_536,
            instructions: false,
            consumers: 1,
            slots_per_item: MemcachedConfig::default().slots_per_item,
            redis_format: None,
            stores: Vec::new(),
        };
        let mut args = std::env::args().skip(1);
        // `cargo test --all-targets` runs this binary without `--bench`, which `cargo bench`
        // adds: then it is a check that every answer is right, on a small stream, unless the
        // sizes are given.
        let benched = std::env::args().any(|arg| arg == "--bench");
        if !benched {
            (settings.messages, settings.full_slots) = (3_000, 16_384);
        }
        while let Some(arg) = args.next() {
            let mut number = |name: &str| -> Result<u64, String> {
                let value = args.next().ok_or(format!("{name} needs a number"))?;
                value
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("{name} needs a positive number, not {value:?}"))
            };
            match arg.as_str() {
                // What `cargo bench` adds to every bench binary's arguments.
                "--bench" => {}
                "--messages" => settings.messages = number("--messages")?,
                "--burst" => settings.burst = number("--burst")?,
                "--tasks" => settings.tasks = number("--tasks")?,
                "--full-slots" => settings.full_slots = number("--full-slots")?,
                "--instructions" => settings.instructions = true,
                "--consumers" => settings.consumers = number("--consumers")?,
                "--slots-per-item" => {
                    settings.slots_per_item = u32::try_from(number("--slots-per-item")?)
                        .map_err(|_| "--slots-per-item is at most 255".to_owned())?;
                }
                "--redis-format" => {
                    settings.redis_format = Some(
                        u8::try_from(number("--redis-format")?)
                            .map_err(|_| "--redis-format is 2 or 3".to_owned())?,
                    );
                }
                "redis" | "redis-cluster" | "valkey" | "memcached" => settings.stores.push(arg),
                other => {
                    return Err(format!(
                        "unknown argument {other:?}: give --messages, --burst, --tasks, \
                         --full-slots, --consumers, --slots-per-item, --redis-format, \
                         --instructions, redis, \
                         redis-cluster, valkey or memcached"
                    ))
                }
            }
        }
        if settings.stores.is_empty() {
            settings.stores = vec!["redis".into(), "memcached".into()];
        }
        if settings.instructions {
            if let Some(store) = settings
                .stores
                .iter()
                .find(|s| *s != "redis" && *s != "valkey")
            {
                return Err(format!(
                    "--instructions measures redis and valkey only, not {store}"
                ));
            }
        }
        Ok(settings)
    }
}

/// Fresh digests: xxh3-128 of a counter, from a start of its own per case.
struct Digests(AtomicU64);

impl Digests {
    fn starting_at(n: u64) -> Arc<Self> {
        Arc::new(Digests(AtomicU64::new(n)))
    }

    fn burst(&self, len: u64) -> Vec<Digest> {
        // Relaxed: only uniqueness matters.
        let first = self.0.fetch_add(len, Ordering::Relaxed);
        (first..first + len)
            .map(|n| Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes())))
            .collect()
    }
}

/// The server processes whose CPU a case costs: one server, or each master of a cluster.
trait Measured {
    /// Each process's name, as printed.
    fn names(&self, store: &str) -> Vec<String>;
    /// What each process has cost so far, in the order of `names`: its CPU time in clock
    /// ticks, or (under callgrind) its instructions.
    fn cpu_ticks(&self) -> Vec<u64>;
}

impl Measured for Server {
    fn names(&self, store: &str) -> Vec<String> {
        vec![store.to_owned()]
    }

    fn cpu_ticks(&self) -> Vec<u64> {
        if self.under_callgrind() {
            vec![self.instructions().expect("the server's instructions")]
        } else {
            vec![Server::cpu_ticks(self).expect("the server's CPU time")]
        }
    }
}

impl Measured for RedisCluster {
    fn names(&self, store: &str) -> Vec<String> {
        (1..=self.masters.len())
            .map(|i| format!("{store} m{i}"))
            .collect()
    }

    fn cpu_ticks(&self) -> Vec<u64> {
        self.masters
            .iter()
            .map(|m| m.cpu_ticks().expect("a master's CPU time"))
            .collect()
    }
}

/// Runs `settings.tasks` tasks that each call `burst` with bursts of fresh digests until
/// `messages` were sent in all; returns each server's CPU ticks and the wall time taken.
async fn measure<F, Fut>(
    server: &impl Measured,
    settings: &Settings,
    messages: u64,
    digests: Arc<Digests>,
    burst: F,
) -> (Vec<u64>, f64)
where
    F: Fn(Vec<Digest>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let before = server.cpu_ticks();
    let start = Instant::now();
    let bursts = messages / settings.burst;
    let left = Arc::new(AtomicU64::new(bursts));
    let size = settings.burst;
    let tasks: Vec<_> = (0..settings.tasks)
        .map(|_| {
            let (burst, left, digests) = (burst.clone(), left.clone(), digests.clone());
            tokio::spawn(async move {
                // Relaxed: a plain counter of bursts still to send.
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    burst(digests.burst(size)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a benchmark task");
    }
    let wall = start.elapsed().as_secs_f64();
    let after = server.cpu_ticks();
    (
        after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        wall,
    )
}

/// How the sidecar writes a burst of unique messages to the store.
#[derive(Debug, Clone, Copy)]
enum Writes {
    /// A claim (in flight, with a lease), then a commit once the sink took them.
    ClaimCommit,
    /// A claim done at once, for a sink that cannot fail once it took a message.
    OneShot,
}

/// Writes each burst as the sidecar does (`writes`), checking every answer.
///
/// A commit that answers `false` is accepted only for an entry that newer claims of its set
/// may have pushed out before its commit (see [`ClaimLog`]); any other fails the run.
async fn ours<S: Store + Clone + Send + Sync + 'static>(
    server: &impl Measured,
    settings: &Settings,
    (stores, writes): (Vec<S>, Writes),
    messages: u64,
    digests: Arc<Digests>,
) -> (Vec<u64>, f64) {
    let geometry = stores[0].geometry();
    let log = Arc::new(ClaimLog::default());
    // The consumers take bursts in turn.
    let turn = Arc::new(AtomicU64::new(0));
    let bursts = log.clone();
    let measured = measure(server, settings, messages, digests, move |burst| {
        // Relaxed: only the turns' spread matters.
        let i = turn.fetch_add(1, Ordering::Relaxed) as usize % stores.len();
        let (store, log) = (stores[i].clone(), bursts.clone());
        async move {
            let entry = log.claiming(geometry, &burst);
            let claims = match writes {
                Writes::ClaimCommit => store.claim_many(&burst).await,
                Writes::OneShot => store.claim_done_many(&burst).await,
            };
            log.claimed(entry);
            for claim in claims {
                assert_eq!(claim, Ok(Claim::New), "a fresh digest must be claimed new");
            }
            if let Writes::ClaimCommit = writes {
                let commits = store.commit_many(&burst).await;
                for (position, commit) in commits.into_iter().enumerate() {
                    match commit {
                        Ok(true) => {}
                        Ok(false) => log.lost(entry, position),
                        other => panic!("a claimed digest must be committed: {other:?}"),
                    }
                }
            }
        }
    })
    .await;
    let pushed_out = log.check();
    if pushed_out > 0 {
        println!(
            "               (next case or its table's filling: {pushed_out} entries in flight \
             pushed out by {WAYS} or more newer claims of their set before their commit, the \
             table's eviction)"
        );
    }
    measured
}

/// Each burst's claim, when it was sent and answered and the sets of its digests, and the
/// commits that answered `false`: enough to tell an entry the table's eviction pushed out
/// (`WAYS` newer claims of its set before its commit, possible when a burst waits long
/// between its claim and its commit while other bursts go on) from one lost.
#[derive(Default)]
struct ClaimLog {
    bursts: std::sync::Mutex<Vec<LoggedBurst>>,
    /// (burst, position in it, when its commit was answered)
    lost: std::sync::Mutex<Vec<(usize, usize, Instant)>>,
}

struct LoggedBurst {
    sent: Instant,
    answered: Option<Instant>,
    /// Each digest's set (`None` for a store of no one geometry).
    sets: Vec<Option<u64>>,
}

impl ClaimLog {
    /// Logs a burst whose claim is about to be sent; its number.
    fn claiming(&self, geometry: Option<Geometry>, burst: &[Digest]) -> usize {
        let sets = burst
            .iter()
            .map(|&d| geometry.map(|g| g.set_of(d)))
            .collect();
        let mut bursts = self.bursts.lock().unwrap();
        bursts.push(LoggedBurst {
            sent: Instant::now(),
            answered: None,
            sets,
        });
        bursts.len() - 1
    }

    fn claimed(&self, burst: usize) {
        self.bursts.lock().unwrap()[burst].answered = Some(Instant::now());
    }

    fn lost(&self, burst: usize, position: usize) {
        self.lost
            .lock()
            .unwrap()
            .push((burst, position, Instant::now()));
    }

    /// How many commits answered `false` for an entry that may have been pushed out: at
    /// least `WAYS` claims of its set could have been written between its claim and its
    /// commit (the later digests of its own burst, and every digest of a burst whose claim
    /// was on the way at some time between its claim's sending and its commit's answer).
    /// Panics for any other: an entry lost.
    fn check(&self) -> usize {
        let bursts = self.bursts.lock().unwrap();
        let lost = self.lost.lock().unwrap();
        for &(index, position, committed) in lost.iter() {
            let burst = &bursts[index];
            let set = burst.sets[position];
            let same_set =
                |sets: &[Option<u64>]| sets.iter().filter(|&&s| s.is_some() && s == set).count();
            let later_own = same_set(&burst.sets[position + 1..]);
            let others: usize = bursts
                .iter()
                .enumerate()
                .filter(|&(i, b)| {
                    i != index && b.sent < committed && b.answered.is_none_or(|a| a > burst.sent)
                })
                .map(|(_, b)| same_set(&b.sets))
                .sum();
            let newer = later_own + others;
            assert!(
                set.is_some() && newer >= WAYS as usize,
                "a claimed digest must be committed: its commit answered false, and at most \
                 {newer} claims of its set (set {set:?}) could have come between its claim and \
                 its commit, fewer than the {WAYS} ways that push an entry out"
            );
        }
        lost.len()
    }
}

/// One printed line: a case's server cost per message (CPU µs, or instructions), its ratio
/// to `naive` (the same unit) and, for CPU time, its rate per server core.
fn report(store: &str, case: &str, messages: u64, (cost, wall): (u64, f64), naive: Option<f64>) {
    let per = per_message(cost, messages);
    let ratio = naive.map_or("".to_owned(), |naive| format!("{:.2}x", per / naive));
    let rate = if INSTRUCTIONS.load(Ordering::Relaxed) {
        "".to_owned()
    } else {
        format!("{:.0}", 1e6 / per.max(1e-9))
    };
    println!(
        "{store:<14} {case:<14} {messages:>9} {per:>10.2} {ratio:>7} {rate:>12} {:>10.0}",
        messages as f64 / wall,
    );
}

/// Whether costs are instructions (`--instructions`), not clock ticks: set once at start.
static INSTRUCTIONS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Server cost per message: CPU µs, or instructions.
fn per_message(cost: u64, messages: u64) -> f64 {
    if INSTRUCTIONS.load(Ordering::Relaxed) {
        cost as f64 / messages as f64
    } else {
        cost as f64 / TICKS_PER_SECOND * 1e6 / messages as f64
    }
}

/// The Redis cases on one server of `program`: on Valkey, with the store as it runs there
/// (`SET … IFEQ`), then forced through the set script.
async fn redis_cases(settings: &Settings, program: Program) -> Result<(), String> {
    let server = Server::redis_program(program, settings.instructions)?;
    let paths: &[(&str, bool)] = match program {
        Program::Redis => &[("redis", false)],
        Program::Valkey => &[("valkey", false), ("valkey-script", true)],
    };
    for &(name, script) in paths {
        redis_server_cases(settings, name, &server, script).await?;
    }
    Ok(())
}

/// The Redis cases on `server`, printed as `name`; with `script`, the store forced through
/// the set script.
async fn redis_server_cases(
    settings: &Settings,
    name: &str,
    server: &Server,
    script: bool,
) -> Result<(), String> {
    let url = format!("redis://{}", server.addr);
    let connect = |namespace: &str, slots: u64| {
        let config = RedisConfig {
            urls: vec![url.clone()],
            namespace: namespace.into(),
            timeout: servers::BENCH_TIMEOUT,
            ..RedisConfig::default()
        };
        let geometry = Geometry::new(slots, WAYS).expect("a valid geometry");
        let format = settings.redis_format;
        async move {
            let store = match format {
                Some(format) => RedisStore::connect_in(config, geometry, format).await?,
                None => RedisStore::connect(config, geometry).await?,
            };
            if script {
                store.force_script();
            }
            Ok::<_, nsq_dedupe::error::StoreError>(store)
        }
    };
    let plain = redis::Client::open(url.as_str())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let emptied = plain.clone();
    let naive = move |burst: Vec<Digest>| {
        let mut plain = plain.clone();
        async move {
            let mut pipe = redis::pipe();
            for digest in &burst {
                pipe.cmd("SET")
                    .arg(format!("naive:{:032x}", digest.as_u128()))
                    .arg(1)
                    .arg("NX")
                    .arg("EX")
                    .arg(3600);
            }
            let answers: Vec<Option<String>> = pipe
                .query_async(&mut plain)
                .await
                .expect("pipelined SET NX");
            assert!(
                answers.iter().all(Option::is_some),
                "a fresh key must be set"
            );
        }
    };
    let empty = move || flush_all(vec![emptied.clone()]);
    run_cases(
        settings,
        name,
        server,
        (naive, empty),
        |namespace, slots| {
            let store = connect(namespace, slots);
            async move { store.await.map_err(|e| e.to_string()) }
        },
    )
    .await
}

/// The three-master cluster's cases: the naive write sends each burst as one pipeline per
/// master, as a cluster client does; every master's CPU is reported on its own.
async fn redis_cluster_cases(settings: &Settings) -> Result<(), String> {
    let cluster = RedisCluster::start()?;
    let urls: Vec<String> = cluster
        .masters
        .iter()
        .map(|m| format!("redis://{}", m.addr))
        .collect();
    let mut conns = Vec::new();
    for url in &urls {
        conns.push(
            redis::Client::open(url.as_str())
                .map_err(|e| e.to_string())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    // The master of each slot, from CLUSTER SLOTS: [[start, end, [host, port, id, ...], ...], ...].
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conns[0].clone())
        .await
        .map_err(|e| format!("CLUSTER SLOTS: {e}"))?;
    let mut owner = vec![usize::MAX; 16_384];
    for range in ranges {
        let parse = || -> redis::RedisResult<(usize, usize, String, u16)> {
            let node: Vec<redis::Value> = redis::from_redis_value(&range[2])?;
            Ok((
                redis::from_redis_value(&range[0])?,
                redis::from_redis_value(&range[1])?,
                redis::from_redis_value(&node[0])?,
                redis::from_redis_value(&node[1])?,
            ))
        };
        let (start, end, host, port) = parse().map_err(|e| format!("CLUSTER SLOTS: {e}"))?;
        let addr = format!("{host}:{port}");
        let master = cluster
            .masters
            .iter()
            .position(|m| m.addr == addr)
            .ok_or(format!("CLUSTER SLOTS names an unknown node {addr}"))?;
        owner[start..=end].fill(master);
    }
    let owner = Arc::new(owner);
    let masters = conns.clone();
    let empty = move || flush_all(masters.clone());
    let naive =
        move |burst: Vec<Digest>| {
            let (conns, owner) = (conns.clone(), owner.clone());
            async move {
                let mut pipes: Vec<redis::Pipeline> = conns.iter().map(|_| redis::pipe()).collect();
                let mut counts = vec![0usize; conns.len()];
                for digest in &burst {
                    let key = format!("naive:{:032x}", digest.as_u128());
                    let master = owner[usize::from(RedisStore::key_slot(key.as_bytes()))];
                    counts[master] += 1;
                    pipes[master]
                        .cmd("SET")
                        .arg(key)
                        .arg(1)
                        .arg("NX")
                        .arg("EX")
                        .arg(3600);
                }
                let sends = pipes.iter().zip(conns).zip(&counts).map(
                    |((pipe, mut conn), &count)| async move {
                        if count == 0 {
                            return;
                        }
                        let answers: Vec<Option<String>> =
                            pipe.query_async(&mut conn).await.expect("pipelined SET NX");
                        assert!(
                            answers.iter().all(Option::is_some),
                            "a fresh key must be set"
                        );
                    },
                );
                futures::future::join_all(sends).await;
            }
        };
    run_cases(
        settings,
        "cluster",
        &cluster,
        (naive, empty),
        |namespace, slots| {
            let store = RedisStore::connect(
                RedisConfig {
                    urls: urls.clone(),
                    cluster: true,
                    namespace: namespace.into(),
                    timeout: servers::BENCH_TIMEOUT,
                    ..RedisConfig::default()
                },
                Geometry::new(slots, WAYS).expect("a valid geometry"),
            );
            async move { store.await.map_err(|e| e.to_string()) }
        },
    )
    .await
}

async fn memcached_cases(settings: &Settings) -> Result<(), String> {
    // Every case's items stay (memcached's `flush_all` keeps its hash table's size), so the
    // table is made at start for all of them: no case pays for growing it.
    let server = Server::memcached_holding(8 * settings.messages)?;
    let addr = server.addr.clone();
    let naive_addr = addr.clone();
    let naive = move |burst: Vec<Digest>| {
        let addr = naive_addr.clone();
        async move {
            // A connection per burst would cost the server a connect: idle ones are kept.
            let mut conn = NAIVE_CONNS.take(&addr).await;
            let mut out = Vec::with_capacity(burst.len() * 60);
            for digest in &burst {
                out.extend_from_slice(
                    format!("ms naive:{:032x} 1 T3600 ME\r\n1\r\n", digest.as_u128()).as_bytes(),
                );
            }
            conn.get_mut()
                .write_all(&out)
                .await
                .expect("write the adds");
            let mut line = String::new();
            for _ in &burst {
                line.clear();
                conn.read_line(&mut line).await.expect("read an answer");
                assert_eq!(line, "HD\r\n", "a fresh key must be added");
            }
            NAIVE_CONNS.give(conn);
        }
    };
    // Memcached keeps its hash table's size after `flush_all`: its cases share one server.
    let empty = || async { Ok(()) };
    run_cases(
        settings,
        "memcached",
        &server,
        (naive, empty),
        |namespace, slots| {
            let store = MemcachedStore::connect(
                MemcachedConfig {
                    servers: vec![addr.clone()],
                    namespace: namespace.into(),
                    timeout: servers::BENCH_TIMEOUT,
                    slots_per_item: settings.slots_per_item,
                    ..MemcachedConfig::default()
                },
                Geometry::new(slots, WAYS).expect("a valid geometry"),
            );
            async move { store.await.map_err(|e| e.to_string()) }
        },
    )
    .await
}

/// Empties each Redis server (`FLUSHALL`, synchronous), so that every case meets the same
/// keyspace: its own table and nothing else. Without it a later case meets the hundreds of
/// thousands of keys the earlier ones left, a bigger dictionary, whose lookups miss the cache
/// more often, and possibly its incremental rehash.
async fn flush_all(conns: Vec<redis::aio::MultiplexedConnection>) -> Result<(), String> {
    for mut conn in conns {
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| format!("FLUSHALL: {e}"))?;
    }
    Ok(())
}

/// Idle connections of the naive Memcached writer, one per task at most.
struct Conns(std::sync::Mutex<Vec<BufReader<tokio::net::TcpStream>>>);

static NAIVE_CONNS: Conns = Conns(std::sync::Mutex::new(Vec::new()));

impl Conns {
    async fn take(&self, addr: &str) -> BufReader<tokio::net::TcpStream> {
        let idle = self.0.lock().expect("the pool's lock").pop();
        match idle {
            Some(conn) => conn,
            None => BufReader::new(
                tokio::net::TcpStream::connect(addr)
                    .await
                    .expect("connect to memcached"),
            ),
        }
    }

    fn give(&self, conn: BufReader<tokio::net::TcpStream>) {
        self.0.lock().expect("the pool's lock").push(conn);
    }
}

/// The cases of one store: naive (`naive` sends one burst's naive writes), ours on an empty
/// table and on a full one, each with a claim and a commit and then claimed done at once, and
/// naive again. `empty` empties the servers before each case (the full table before it is
/// filled), where the store allows it.
async fn run_cases<N, NF, E, EF, C, CF, S>(
    settings: &Settings,
    name: &str,
    server: &impl Measured,
    (naive, empty): (N, E),
    connect: C,
) -> Result<(), String>
where
    N: Fn(Vec<Digest>) -> NF + Clone + Send + 'static,
    NF: std::future::Future<Output = ()> + Send,
    E: Fn() -> EF,
    EF: std::future::Future<Output = Result<(), String>>,
    C: Fn(&str, u64) -> CF,
    CF: std::future::Future<Output = Result<S, String>>,
    S: Generation + Send + Sync,
{
    let n = settings.messages;
    // Digests of each case start far apart, so no case meets another's.
    empty().await?;
    let naive_first = measure(server, settings, n, Digests::starting_at(0), naive.clone()).await;
    // Room for every message: one set in eight or more holds one of them.
    let big = (n * 8 * 8).next_power_of_two();
    let mut cases = Vec::new();
    // Each way of writing: its label, and where its digests start.
    for (writes, label, start) in [
        (Writes::ClaimCommit, "ours", 1),
        (Writes::OneShot, "one-shot", 5),
    ] {
        empty().await?;
        let mut stores = Vec::new();
        for _ in 0..settings.consumers {
            stores.push(connect(&format!("{label}-empty"), big).await?);
        }
        let measured = ours(
            server,
            settings,
            (stores, writes),
            n,
            Digests::starting_at(start << 40),
        );
        cases.push((format!("{label} empty"), measured.await));
        empty().await?;
        let mut full = Vec::new();
        for _ in 0..settings.consumers {
            full.push(connect(&format!("{label}-full"), settings.full_slots).await?);
        }
        // Fills every set: four times the slots, which every set's ways take many times over.
        ours(
            server,
            settings,
            (full.clone(), writes),
            settings.full_slots * 4,
            Digests::starting_at((start + 1) << 40),
        )
        .await;
        let full = ours(
            server,
            settings,
            (full, writes),
            n,
            Digests::starting_at((start + 2) << 40),
        );
        cases.push((format!("{label} full"), full.await));
    }
    let (resizing, after) = resize_cases(settings, server, &empty, &connect, big).await?;
    cases.push(("resizing".to_owned(), resizing));
    cases.push(("after resize".to_owned(), after));
    empty().await?;
    let naive_again = measure(server, settings, n, Digests::starting_at(4 << 40), naive).await;
    let per = |label: &str, i: usize| {
        cases
            .iter()
            .find(|(case, _)| case == label)
            .map(|(_, (ticks, _))| per_message(ticks[i], n))
            .expect("a case measured")
    };
    for (i, name) in server.names(name).iter().enumerate() {
        let case = |(ticks, wall): &(Vec<u64>, f64)| (ticks[i], *wall);
        let baseline = (per_message(naive_first.0[i], n) + per_message(naive_again.0[i], n)) / 2.0;
        report(name, "naive", n, case(&naive_first), None);
        for (label, measured) in &cases {
            report(name, label, n, case(measured), Some(baseline));
        }
        report(name, "naive again", n, case(&naive_again), None);
        let (empty, full) = (per("ours empty", i), per("ours full", i));
        println!(
            "{name:<14} resize: {:.2}x during, {:.2}x after (server cost per message, to ours \
             empty); {:.2}x during, to ours full",
            per("resizing", i) / empty,
            per("after resize", i) / empty,
            per("resizing", i) / full,
        );
    }
    Ok(())
}

/// The resize cases: a table of `settings.full_slots` filled, then resized to `big` slots
/// through the descriptor as `nsq-dedupe resize` does; claims and commits of fresh digests
/// through generations that read the previous table, then through generations whose
/// previous table retired. Each case's server cost.
async fn resize_cases<E, EF, C, CF, S>(
    settings: &Settings,
    server: &impl Measured,
    empty: &E,
    connect: &C,
    big: u64,
) -> Result<((Vec<u64>, f64), (Vec<u64>, f64)), String>
where
    E: Fn() -> EF,
    EF: std::future::Future<Output = Result<(), String>>,
    C: Fn(&str, u64) -> CF,
    CF: std::future::Future<Output = Result<S, String>>,
    S: Generation + Send + Sync,
{
    const NAMESPACE: &str = "resize";
    empty().await?;
    let small = connect(NAMESPACE, settings.full_slots).await?;
    // Its descriptor, as a consumer writes it at start.
    Generations::new(small.clone())
        .follow()
        .await
        .map_err(|e| format!("the table's descriptor: {e}"))?;
    ours(
        server,
        settings,
        (vec![small.clone()], Writes::ClaimCommit),
        settings.full_slots * 4,
        Digests::starting_at(10 << 40),
    )
    .await;
    resize(&small, Geometry::new(big, WAYS).expect("a valid geometry"))
        .await
        .map_err(|e| format!("resize: {e}"))?;
    let (mut during, mut retired) = (Vec::new(), Vec::new());
    for _ in 0..settings.consumers {
        let generations = Generations::new(connect(NAMESPACE, big).await?);
        generations
            .follow()
            .await
            .map_err(|e| format!("following the resize: {e}"))?;
        if generations.previous().is_none() {
            return Err("the resize left no previous generation to read".into());
        }
        during.push(generations);
        // Before it reads the descriptor: one generation, as once the previous one retired.
        retired.push(Generations::new(connect(NAMESPACE, big).await?));
    }
    let n = settings.messages;
    let resizing = ours(
        server,
        settings,
        (during, Writes::ClaimCommit),
        n,
        Digests::starting_at(11 << 40),
    )
    .await;
    let after = ours(
        server,
        settings,
        (retired, Writes::ClaimCommit),
        n,
        Digests::starting_at(12 << 40),
    )
    .await;
    Ok((resizing, after))
}

fn main() {
    let settings = match Settings::from_args() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("store_cost: {error}");
            std::process::exit(2);
        }
    };
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("A check of every answer on a small stream; `cargo bench` measures.");
    }
    INSTRUCTIONS.store(settings.instructions, Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    println!(
        "{} distinct messages, bursts of {}, {} bursts at once, {} consumer(s), full table of {} \
         slots x {WAYS} ways; load average {}",
        settings.messages,
        settings.burst,
        settings.tasks,
        settings.consumers,
        settings.full_slots,
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split(' ').next().unwrap_or("?").to_owned())
            .unwrap_or_else(|_| "?".into()),
    );
    let unit = if settings.instructions {
        "instr/msg"
    } else {
        "µs/msg"
    };
    println!(
        "{:<14} {:<14} {:>9} {:>10} {:>7} {:>12} {:>10}",
        "store", "case", "messages", unit, "ratio", "msg/s/core", "wall msg/s"
    );
    for store in &settings.stores {
        let result = runtime.block_on(async {
            match store.as_str() {
                "redis" => redis_cases(&settings, Program::Redis).await,
                "valkey" => redis_cases(&settings, Program::Valkey).await,
                "redis-cluster" => redis_cluster_cases(&settings).await,
                _ => memcached_cases(&settings).await,
            }
        });
        if let Err(error) = result {
            eprintln!("store_cost: {store}: {error}");
            std::process::exit(1);
        }
    }
}
