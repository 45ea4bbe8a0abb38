//! Claims per second against a local `redis-server` that this benchmark starts itself, next to
//! the home-made de-duplication with the same client: `SET <key> 1 NX EX 3600`, one key per
//! message.
//!
//! Each case runs 64 tasks sharing one connection, 16 operations each per iteration, every one
//! of a fresh digest (the expensive case for the table: its set is read, changed and written):
//! `script_claim` as 16 single claims, `script_claim_many` as one burst of 16 (one script run
//! for the burst, as the sidecar claims what one read from nsqd brought), `set_nx` as 16
//! single `SET NX`. The ratio of a script case's throughput to `set_nx`'s, taken in the same
//! run, is what the Lua script and the set layout cost over a bare `SET NX`.
//!
//! Run with `cargo bench --bench main -- RedisStore`. Needs `/usr/bin/redis-server` (or
//! `$REDIS_SERVER_BIN`); without it the group is skipped with a message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nsq_dedupe::{Digest, Geometry, RedisConfig, RedisStore, Store};

use crate::servers::{Program, Server};

/// Fresh digests: xxh3-128 of a counter.
struct Digests(AtomicU64);

impl Digests {
    fn next(&self) -> Digest {
        // Relaxed: only uniqueness matters.
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
    }
}

const TASKS: u64 = 64;
const PER_TASK: u64 = 16;

/// Runs `iters` rounds of 64 tasks calling `op` `calls` times each; returns the time taken.
fn rounds<F, Fut>(runtime: &tokio::runtime::Runtime, iters: u64, calls: u64, op: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    runtime.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let op = op.clone();
                    tokio::spawn(async move {
                        for _ in 0..calls {
                            op().await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("benchmark task");
            }
        }
        start.elapsed()
    })
}

fn claims(c: &mut Criterion) {
    let server = match Server::redis_program(Program::Redis, false) {
        Ok(server) => server,
        Err(err) => {
            eprintln!("skipping Redis benchmarks: {err}");
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // 1 M slots: 131,072 keys of at most 275 bytes.
    let geometry = Geometry::new(1 << 20, 8).expect("valid geometry");
    let store = runtime
        .block_on(RedisStore::connect(
            RedisConfig {
                urls: vec![format!("redis://{}", server.addr)],
                namespace: "bench".into(),
                timeout: crate::servers::BENCH_TIMEOUT,
                ..RedisConfig::default()
            },
            geometry,
        ))
        .expect("connect to the benchmark's redis");
    let plain = runtime
        .block_on(async {
            redis::Client::open(format!("redis://{}", server.addr))?
                .get_multiplexed_async_connection()
                .await
        })
        .expect("a plain connection");
    let digests = Arc::new(Digests(AtomicU64::new(0)));

    let mut group = c.benchmark_group("nsq_dedupe::RedisStore/claim");
    // Few samples of a few seconds each: the server is real and the machine is shared.
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(TASKS * PER_TASK));

    group.bench_function(BenchmarkId::new("script_claim", TASKS), |b| {
        b.iter_custom(|iters| {
            let (store, digests) = (store.clone(), digests.clone());
            rounds(&runtime, iters, PER_TASK, move || {
                let (store, digests) = (store.clone(), digests.clone());
                async move {
                    store.claim(digests.next()).await.expect("claim");
                }
            })
        })
    });

    group.bench_function(BenchmarkId::new("script_claim_many", TASKS), |b| {
        b.iter_custom(|iters| {
            let (store, digests) = (store.clone(), digests.clone());
            rounds(&runtime, iters, 1, move || {
                let (store, digests) = (store.clone(), digests.clone());
                async move {
                    let burst: Vec<Digest> = (0..PER_TASK).map(|_| digests.next()).collect();
                    for claim in store.claim_many(&burst).await {
                        claim.expect("claim_many");
                    }
                }
            })
        })
    });

    group.bench_function(BenchmarkId::new("set_nx", TASKS), |b| {
        b.iter_custom(|iters| {
            let (conn, digests) = (plain.clone(), digests.clone());
            rounds(&runtime, iters, PER_TASK, move || {
                let (mut conn, digests) = (conn.clone(), digests.clone());
                async move {
                    let key = format!("plain:{:032x}", digests.next().as_u128());
                    let _: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(1)
                        .arg("NX")
                        .arg("EX")
                        .arg(3600)
                        .query_async(&mut conn)
                        .await
                        .expect("SET NX");
                }
            })
        })
    });
    group.finish();
}

criterion_group!(benches, claims);
