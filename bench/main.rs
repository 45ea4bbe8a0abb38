//! Benchmarks: one criterion binary, one module per area.

use criterion::criterion_main;

criterion_main!();
