//! Claims per second against a local memcached that this benchmark starts itself.
//!
//! Ways of claiming: one task claiming one digest at a time; 64 tasks sharing one store, with
//! and without coalescing; pipelined batches of 100 (`claim_many`), from one task and from 4. Every claim is of a fresh digest, so every one
//! reads and compare-and-swaps its set: the expensive case. After each case the memcached
//! server's own CPU time (user + system, from `/proc/<pid>/stat`) per claim is printed.
//!
//! Run with `cargo bench --bench main -- MemcachedStore`. Needs `/usr/bin/memcached` (or
//! `$MEMCACHED_BIN`); without it the group is skipped with a message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nsq_dedupe::{Digest, Geometry, MemcachedConfig, MemcachedStore, Store};

use crate::servers::{cpu_ticks, Server};

/// Fresh digests: xxh3-128 of a counter.
struct Digests(AtomicU64);

impl Digests {
    fn next(&self) -> Digest {
        // Relaxed: only uniqueness matters.
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        Digest::from_u128(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
    }
}

/// CPU time of the server and of this process, and claims made, summed over the timed
/// routines only (not criterion's analysis). Criterion runs each routine for about half a
/// second per sample, so the 10 ms tick resolution costs about 2%.
#[derive(Default)]
struct Meter {
    server_ticks: AtomicU64,
    client_ticks: AtomicU64,
    claims: AtomicU64,
}

impl Meter {
    /// Runs `routine`, which makes `claims` claims, and adds up what it cost.
    fn record(&self, server: &Server, claims: u64, routine: impl FnOnce() -> Duration) -> Duration {
        let before = ticks(server);
        let elapsed = routine();
        if let (Some(before), Some(after)) = (before, ticks(server)) {
            // Relaxed: plain counters, read after the benchmark.
            self.server_ticks
                .fetch_add(after.0 - before.0, Ordering::Relaxed);
            self.client_ticks
                .fetch_add(after.1 - before.1, Ordering::Relaxed);
        }
        self.claims.fetch_add(claims, Ordering::Relaxed);
        elapsed
    }

    /// Prints the CPU per claim since the last report and starts again.
    fn report(&self, case: &str) {
        let n = self.claims.swap(0, Ordering::Relaxed);
        let server_ms = self.server_ticks.swap(0, Ordering::Relaxed) * 10;
        let client_ms = self.client_ticks.swap(0, Ordering::Relaxed) * 10;
        if n == 0 {
            return; // filtered out
        }
        eprintln!(
            "CPU for {case} over {n} claims: memcached {server_ms} ms = {:.2} µs per claim \
             ({:.0} claims per memcached CPU-second); client {client_ms} ms = {:.2} µs per claim",
            server_ms as f64 * 1000.0 / n as f64,
            n as f64 / (server_ms.max(1) as f64 / 1000.0),
            client_ms as f64 * 1000.0 / n as f64,
        );
    }
}

/// CPU ticks of the server and of this benchmark process so far.
fn ticks(server: &Server) -> Option<(u64, u64)> {
    Some((server.cpu_ticks()?, cpu_ticks("self")?))
}

fn claims(c: &mut Criterion) {
    let server = match Server::memcached_holding(0) {
        Ok(server) => server,
        Err(err) => {
            eprintln!("skipping memcached benchmarks: {err}");
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // 1 M slots: 131 072 items of at most 275 bytes; every claim below is of a fresh digest.
    let geometry = Geometry::new(1 << 20, 8).expect("valid geometry");
    let config = MemcachedConfig {
        servers: vec![server.addr.clone()],
        namespace: "bench".into(),
        timeout: crate::servers::BENCH_TIMEOUT,
        ..MemcachedConfig::default()
    };
    let uncoalesced = runtime
        .block_on(MemcachedStore::connect(
            MemcachedConfig {
                coalesce: false,
                ..config.clone()
            },
            geometry,
        ))
        .expect("connect to the benchmark's memcached");
    let store = runtime
        .block_on(MemcachedStore::connect(config, geometry))
        .expect("connect to the benchmark's memcached");
    let digests = Arc::new(Digests(AtomicU64::new(0)));
    let meter = Meter::default();

    let mut group = c.benchmark_group("nsq_dedupe::MemcachedStore/claim");
    // Few samples of a few seconds each: the server is real and the machine is shared, so we
    // want a stable mean rather than fine-grained distribution data.
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));

    // One task, one claim at a time: bound by the round-trip time (read, then write).
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("sequential", 1), |b| {
        b.iter_custom(|iters| {
            meter.record(&server, iters, || {
                // On a worker thread, as in a consumer: `block_on` would add a wake-up of the
                // main thread to every round trip.
                let (store, digests) = (store.clone(), digests.clone());
                runtime
                    .block_on(runtime.spawn(async move {
                        let start = Instant::now();
                        for _ in 0..iters {
                            store.claim(digests.next()).await.expect("claim");
                        }
                        start.elapsed()
                    }))
                    .expect("claim task")
            })
        })
    });
    meter.report("sequential");

    // 64 tasks sharing the store, 16 claims each per iteration: with coalescing (the default)
    // their claims share pipelines; without it each takes one of the 4 pooled connections.
    const TASKS: u64 = 64;
    const PER_TASK: u64 = 16;
    group.throughput(Throughput::Elements(TASKS * PER_TASK));
    for (name, store) in [("tasks", &store), ("tasks_uncoalesced", &uncoalesced)] {
        group.bench_function(BenchmarkId::new(name, TASKS), |b| {
            b.iter_custom(|iters| {
                meter.record(&server, iters * TASKS * PER_TASK, || {
                    runtime.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let tasks: Vec<_> = (0..TASKS)
                                .map(|_| {
                                    let (store, digests) = (store.clone(), digests.clone());
                                    tokio::spawn(async move {
                                        for _ in 0..PER_TASK {
                                            store.claim(digests.next()).await.expect("claim");
                                        }
                                    })
                                })
                                .collect();
                            for task in tasks {
                                task.await.expect("claim task");
                            }
                        }
                        start.elapsed()
                    })
                })
            })
        });
        meter.report(name);
    }

    // Pipelined batches: one round trip reads 100 sets, the next compare-and-swaps them.
    const BATCH: u64 = 100;
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function(BenchmarkId::new("batch", BATCH), |b| {
        b.iter_custom(|iters| {
            meter.record(&server, iters * BATCH, || {
                let (store, digests) = (store.clone(), digests.clone());
                runtime
                    .block_on(runtime.spawn(async move {
                        let mut elapsed = Duration::ZERO;
                        for _ in 0..iters {
                            let batch: Vec<Digest> = (0..BATCH).map(|_| digests.next()).collect();
                            let start = Instant::now();
                            for claim in store.claim_many(&batch).await {
                                claim.expect("claim_many");
                            }
                            elapsed += start.elapsed();
                        }
                        elapsed
                    }))
                    .expect("batch task")
            })
        })
    });
    meter.report("batches of 100");

    // Pipelined batches from 4 tasks at once, as several consumers of one process would.
    const BATCH_TASKS: u64 = 4;
    group.throughput(Throughput::Elements(BATCH * BATCH_TASKS));
    group.bench_function(BenchmarkId::new("batch_tasks", BATCH_TASKS), |b| {
        b.iter_custom(|iters| {
            meter.record(&server, iters * BATCH * BATCH_TASKS, || {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let tasks: Vec<_> = (0..BATCH_TASKS)
                            .map(|_| {
                                let (store, digests) = (store.clone(), digests.clone());
                                tokio::spawn(async move {
                                    let batch: Vec<Digest> =
                                        (0..BATCH).map(|_| digests.next()).collect();
                                    for claim in store.claim_many(&batch).await {
                                        claim.expect("claim_many");
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("batch task");
                        }
                    }
                    start.elapsed()
                })
            })
        })
    });
    meter.report("4 tasks × batches of 100");
    group.finish();
    eprintln!("unreadable values seen: {}", store.unreadable_values());
}

criterion_group!(benches, claims);
