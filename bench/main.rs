//! Benchmarks: one criterion binary, one module per area.
//!
//! `cargo bench` runs them all; `cargo bench --bench main -- <filter>` runs a subset, for
//! example `-- contains_and_add`, `-- nsq::frame` or `-- MemcachedStore`
//! or `-- RedisStore`.

mod memcached;
mod nsq;
mod redis;
// The Redis Cluster launcher serves the store-cost benchmark only.
#[allow(dead_code)]
mod servers;
mod table;

criterion::criterion_main!(
    table::benches,
    nsq::benches,
    memcached::benches,
    redis::benches
);
