//! How many bytes a shared store spends per remembered message: our table against the naive
//! key per message users write instead, measured with the store's own counters in the same run.
//!
//! For each store it starts a server on a free loopback port, then:
//! - `ours`: sizes a table (8 ways, as the sidecar's default) for `N` distinct messages at
//!   probability `P` (`size --messages N --probability P`), and writes `3N` distinct messages
//!   into it as the sidecar does for a sink that can fail (`claim_many`, then `commit_many`,
//!   a burst at a time), so that every set is full; the server's memory grown by it, divided
//!   by the `N` messages the table is sized to remember;
//! - `naive`: `N` keys `nsq-dedupe:<32 hex digits>` of the value `1` (Redis `SET key 1 NX EX
//!   3600`, Memcached's meta add `ms key 1 T3600 ME`), the server's memory grown by them,
//!   divided by `N`;
//! - `estimate`: what `size` prints for the table, divided by `N`.
//!
//! Memory is Redis's `used_memory` (`INFO memory`) and Memcached's `bytes` (`stats`): the
//! figures an operator reads. Redis is emptied (`FLUSHALL`) between the cases; Memcached is a
//! fresh server for each.
//!
//! Run through `bench/store-density.sh` (see `--help` there), or `cargo bench --bench
//! store_density -- [--messages N] [--probability P] [--slots-per-item S] [redis] [valkey]
//! [memcached]`.

// Shared with the CPU benchmark, whose cluster and CPU readings this one does not use.
#[allow(dead_code)]
#[path = "servers.rs"]
mod servers;

use std::time::Duration;

use nsq_dedupe::sizing::{
    memcached_bytes_estimate, redis_bytes_estimate, redis_sets_bytes_estimate, slots_for,
};
use nsq_dedupe::{
    Claim, Digest, Geometry, MemcachedConfig, MemcachedStore, RedisConfig, RedisStore, Store,
};
use servers::{Program, Server};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Ways of the table measured: the sidecar's default.
const WAYS: u32 = 8;

/// Messages written per burst, as the sidecar claims them.
const BURST: u64 = 128;

/// The stores' time limit per operation: a busy machine must not fail the fill.
const TIMEOUT: Duration = Duration::from_secs(10);

struct Settings {
    /// Distinct messages the table is sized to remember.
    messages: u64,
    probability: f64,
    /// Slots a Memcached item holds (`MemcachedConfig::slots_per_item`).
    slots_per_item: u32,
    /// The key format of the Redis table (`None`: the store's own).
    redis_format: Option<u8>,
    stores: Vec<String>,
}

impl Settings {
    fn from_args() -> Result<Self, String> {
        let mut settings = Settings {
            messages: 300_000,
            probability: 0.99,
            slots_per_item: MemcachedConfig::default().slots_per_item,
            redis_format: None,
            stores: Vec::new(),
        };
        // `cargo test --all-targets` runs this binary without `--bench`, which `cargo bench`
        // adds: then it is a check that every answer is right, on a small table, unless the
        // size is given.
        if !std::env::args().any(|arg| arg == "--bench") {
            settings.messages = 3_000;
        }
        let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--messages" => {
                    let v = value("--messages")?;
                    settings.messages = v
                        .parse()
                        .map_err(|_| format!("--messages: {v:?} is not a whole number"))?;
                }
                "--probability" => {
                    let v = value("--probability")?;
                    settings.probability = v
                        .parse()
                        .map_err(|_| format!("--probability: {v:?} is not a number"))?;
                }
                "--slots-per-item" => {
                    let v = value("--slots-per-item")?;
                    settings.slots_per_item = v
                        .parse()
                        .map_err(|_| format!("--slots-per-item: {v:?} is not a whole number"))?;
                }
                "--redis-format" => {
                    let v = value("--redis-format")?;
                    settings.redis_format = Some(
                        v.parse()
                            .map_err(|_| format!("--redis-format: {v:?} is not 2 or 3"))?,
                    );
                }
                "redis" | "valkey" | "memcached" => settings.stores.push(arg),
                other => return Err(format!("unknown argument {other:?}: see --help")),
            }
        }
        if settings.stores.is_empty() {
            settings.stores = vec!["redis".into(), "valkey".into(), "memcached".into()];
        }
        Ok(settings)
    }

    fn geometry(&self) -> Result<Geometry, String> {
        slots_for(self.probability, WAYS, self.messages as f64).map_err(|e| e.to_string())
    }
}

/// The `i`-th distinct digest: xxh3-128 of the counter.
fn digest(i: u64) -> Digest {
    Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes()))
}

/// Writes `3 × messages` distinct digests into `store` as the sidecar does for a sink that
/// can fail, a claim and a commit a burst at a time, checking every answer.
async fn fill<S: Store>(store: &S, messages: u64) {
    let total = 3 * messages;
    let mut next = 0;
    while next < total {
        let burst: Vec<Digest> = (next..(next + BURST).min(total)).map(digest).collect();
        next += burst.len() as u64;
        for claim in store.claim_many(&burst).await {
            assert_eq!(claim, Ok(Claim::New), "a fresh digest must be claimed new");
        }
        for commit in store.commit_many(&burst).await {
            assert_eq!(commit, Ok(true), "a claimed digest must be committed");
        }
    }
}

/// The naive key of the `i`-th message.
fn naive_key(i: u64) -> String {
    format!("nsq-dedupe:{:032x}", digest(i).as_u128())
}

/// One printed line: bytes per remembered message of ours, of the naive key, and the ratio.
fn report(store: &str, geometry: Geometry, settings: &Settings, figures: [u64; 3]) {
    let n = settings.messages as f64;
    let [ours, naive, estimate] = figures.map(|bytes| bytes as f64 / n);
    println!(
        "{store:<10} {:>10} {:>6.1} {:>10.1} {:>10.1} {:>7.2}x {:>10.1}",
        geometry.slots(),
        geometry.slots() as f64 / n,
        ours,
        naive,
        ours / naive,
        estimate,
    );
}

async fn redis_case(settings: &Settings, program: Program) -> Result<(), String> {
    let geometry = settings.geometry()?;
    let server = Server::redis_program(program, false)?;
    let url = format!("redis://{}", server.addr);
    let mut plain = redis::Client::open(url.as_str())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let config = RedisConfig {
        urls: vec![url.clone()],
        timeout: TIMEOUT,
        ..RedisConfig::default()
    };
    let store = match settings.redis_format {
        Some(format) => RedisStore::connect_in(config, geometry, format).await,
        None => RedisStore::connect(config, geometry).await,
    }
    .map_err(|e| e.to_string())?;
    let before = redis_used_memory(&mut plain).await?;
    fill(&store, settings.messages).await;
    let ours = grown(before, redis_used_memory(&mut plain).await?)?;
    drop(store);
    // SYNC: a server that frees lazily (Valkey) would free the table while the naive keys
    // are measured.
    redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async::<()>(&mut plain)
        .await
        .map_err(|e| format!("FLUSHALL: {e}"))?;
    let before = redis_used_memory(&mut plain).await?;
    let mut next = 0;
    while next < settings.messages {
        let end = (next + BURST).min(settings.messages);
        let mut pipe = redis::pipe();
        for i in next..end {
            pipe.cmd("SET")
                .arg(naive_key(i))
                .arg(1)
                .arg("NX")
                .arg("EX")
                .arg(3600);
        }
        let answers: Vec<Option<String>> = pipe
            .query_async(&mut plain)
            .await
            .map_err(|e| e.to_string())?;
        assert!(
            answers.iter().all(Option::is_some),
            "a fresh key must be set"
        );
        next = end;
    }
    let naive = grown(before, redis_used_memory(&mut plain).await?)?;
    report(
        match program {
            Program::Redis => "redis",
            Program::Valkey => "valkey",
        },
        geometry,
        settings,
        [
            ours,
            naive,
            if settings.redis_format == Some(2) {
                redis_sets_bytes_estimate(geometry)
            } else {
                redis_bytes_estimate(geometry)
            },
        ],
    );
    Ok(())
}

/// Redis's `used_memory`, in bytes.
async fn redis_used_memory(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, String> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO memory: {e}"))?;
    stat(&info, "used_memory:").ok_or_else(|| format!("no used_memory in {info:?}"))
}

/// How much the memory grew from `before` to `after`.
fn grown(before: u64, after: u64) -> Result<u64, String> {
    after
        .checked_sub(before)
        .ok_or(format!("the memory shrank from {before} to {after} bytes"))
}

/// The number after `name` at the start of a line of `text`.
fn stat(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|value| value.trim().parse().ok())
}

async fn memcached_case(settings: &Settings) -> Result<(), String> {
    let geometry = settings.geometry()?;
    let items = geometry.sets().max(settings.messages);
    let ours = {
        let server = Server::memcached_holding(items)?;
        let store = MemcachedStore::connect(
            MemcachedConfig {
                servers: vec![server.addr.clone()],
                timeout: TIMEOUT,
                slots_per_item: settings.slots_per_item,
                ..MemcachedConfig::default()
            },
            geometry,
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut conn = memcached_conn(&server.addr).await?;
        let before = memcached_bytes(&mut conn).await?;
        fill(&store, settings.messages).await;
        grown(before, memcached_bytes(&mut conn).await?)?
    };
    let server = Server::memcached_holding(items)?;
    let mut conn = memcached_conn(&server.addr).await?;
    let before = memcached_bytes(&mut conn).await?;
    let mut next = 0;
    while next < settings.messages {
        let end = (next + BURST).min(settings.messages);
        let mut out = Vec::new();
        for i in next..end {
            out.extend_from_slice(format!("ms {} 1 T3600 ME\r\n1\r\n", naive_key(i)).as_bytes());
        }
        conn.get_mut()
            .write_all(&out)
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        for _ in next..end {
            line.clear();
            conn.read_line(&mut line).await.map_err(|e| e.to_string())?;
            assert_eq!(line, "HD\r\n", "a fresh key must be added");
        }
        next = end;
    }
    let naive = grown(before, memcached_bytes(&mut conn).await?)?;
    report(
        "memcached",
        geometry,
        settings,
        [ours, naive, memcached_bytes_estimate(geometry)],
    );
    Ok(())
}

async fn memcached_conn(addr: &str) -> Result<BufReader<tokio::net::TcpStream>, String> {
    tokio::net::TcpStream::connect(addr)
        .await
        .map(BufReader::new)
        .map_err(|e| format!("connect to memcached at {addr}: {e}"))
}

/// Memcached's `bytes` (`stats`): the bytes its items take.
async fn memcached_bytes(conn: &mut BufReader<tokio::net::TcpStream>) -> Result<u64, String> {
    conn.get_mut()
        .write_all(b"stats\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut stats = String::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.map_err(|e| e.to_string())? == 0 {
            return Err("memcached closed the connection".into());
        }
        if line == "END\r\n" {
            break;
        }
        stats.push_str(line.trim_start_matches("STAT "));
    }
    stat(&stats, "bytes ").ok_or_else(|| format!("no bytes in {stats:?}"))
}

fn main() {
    let settings = match Settings::from_args() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    };
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("A check of every answer on a small stream; `cargo bench` measures.");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "Bytes per remembered message: a table for {} distinct messages at probability {}, \
         filled with 3x as many; the naive key per message in the same run.",
        settings.messages, settings.probability
    );
    println!(
        "{:<10} {:>10} {:>6} {:>10} {:>10} {:>8} {:>10}",
        "store", "buckets", "b/msg", "ours B", "naive B", "ratio", "size est."
    );
    for store in &settings.stores {
        let result = runtime.block_on(async {
            match store.as_str() {
                "redis" => redis_case(&settings, Program::Redis).await,
                "valkey" => redis_case(&settings, Program::Valkey).await,
                _ => memcached_case(&settings).await,
            }
        });
        if let Err(error) = result {
            eprintln!("{store}: {error}");
            std::process::exit(1);
        }
    }
}
