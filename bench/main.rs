//! Benchmarks: one criterion binary, one module per area.

use criterion::criterion_main;

mod memcached;

criterion_main!(memcached::benches);
