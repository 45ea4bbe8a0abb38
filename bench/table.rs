//! `Table::contains_and_add` with hashing included, across sizes, associativity and threads,
//! and the cost of a digest.
//!
//! Keys are random 16-byte values from a seeded splitmix64 generator, hashed with xxh3-128
//! inside the measured loop, so every operation is a new digest: a miss followed by an insert,
//! the slowest path. Baselines measured in the same run: hashing alone, and the same classic
//! table behind a `Mutex`, as a straightforward implementation would keep it.

use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use nsq_dedupe::{Digest, DigestAlgorithm, Geometry, Table};

/// A seeded splitmix64 stream: cheap enough not to be what is measured.
struct Keys(u64);

impl Keys {
    #[inline]
    fn next(&mut self) -> [u8; 16] {
        let mut half = || {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let (a, b) = (half(), half());
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&a.to_le_bytes());
        key[8..].copy_from_slice(&b.to_le_bytes());
        key
    }
}

#[inline]
fn hash(key: &[u8; 16]) -> Digest {
    DigestAlgorithm::Xxh3 { seed: 0 }.digest(key)
}

/// Runs `iters` operations split over `threads` threads and returns the wall time. One thread
/// runs on the caller's, so that no thread start is timed.
fn timed_on_threads(threads: u64, iters: u64, op: impl Fn(&mut Keys) + Sync) -> Duration {
    let seed = start_seed();
    let run = |thread: u64, count: u64| {
        let mut keys = Keys(thread.wrapping_mul(0x1234_5678_9ABC) ^ seed);
        for _ in 0..count {
            op(&mut keys);
        }
    };
    let start = Instant::now();
    if threads == 1 {
        run(0, iters);
    } else {
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let run = &run;
                scope.spawn(move || run(thread, iters / threads));
            }
        });
    }
    start.elapsed()
}

/// A different key stream for every batch, so that batches do not replay each other's keys.
fn start_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(0x5851_F42D_4C95_7F2D, Ordering::Relaxed)
}

/// An array of `len` zeroed words in memory like a table's: lazily zeroed, on huge pages where
/// the kernel grants them, every page touched.
fn words_like_a_table(len: usize) -> Box<[AtomicU64]> {
    // SAFETY: all-zero bytes are a valid `AtomicU64`.
    let words = unsafe { Box::<[AtomicU64]>::new_zeroed_slice(len).assume_init() };
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let start = words.as_ptr() as usize;
        let (first, last) = (
            start.next_multiple_of(HUGE_PAGE),
            (start + len * 8) & !(HUGE_PAGE - 1),
        );
        if last > first {
            // SAFETY: the range is page-aligned and inside `words`; the advice changes how the
            // pages are backed, not what they hold.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
    }
    for word in words.iter().step_by(4096 / 8) {
        let _ = word.compare_exchange(0, 0, Relaxed, Relaxed);
    }
    words
}

/// The classic table behind a lock, for comparison.
struct LockedClassic(Mutex<Vec<u128>>);

impl LockedClassic {
    fn contains_and_add(&self, digest: Digest) -> bool {
        let mut buckets = self.0.lock().unwrap();
        let len = buckets.len() as u128;
        let slot = &mut buckets[((digest.hi() as u128 * len) >> 64) as usize];
        let seen = *slot == digest.as_u128();
        *slot = digest.as_u128();
        seen
    }
}

fn contains_and_add(c: &mut Criterion) {
    let mut group = c.benchmark_group("nsq_dedupe::Table::contains_and_add");
    // Few samples, short windows: twelve cases on a 2-core machine. Warm-up also faults in the
    // table's pages, which the operating system zero-fills lazily.
    group.sample_size(15);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for log2_slots in [16u32, 20, 26] {
        for ways in [1u32, 8] {
            let table = Table::with_slots(1 << log2_slots, ways).unwrap();
            table.prefault();
            for threads in [1u64, 2] {
                let id = format!("slots=2^{log2_slots}/ways={ways}/threads={threads}");
                group.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter_custom(|iters| {
                        timed_on_threads(threads, iters, |keys| {
                            black_box(table.contains_and_add(hash(&keys.next())));
                        })
                    })
                });
            }
        }
    }
    // With `max_age` (1 h, the system clock): new digests, and a stream where every key comes
    // twice in a row, the path that reads an entry's time.
    for log2_slots in [20u32, 26] {
        for ways in [1u32, 8] {
            let table = Table::with_max_age(
                nsq_dedupe::Geometry::new(1 << log2_slots, ways).unwrap(),
                Duration::from_secs(3600),
                std::sync::Arc::new(nsq_dedupe::dedup::clock::CoarseClock),
            )
            .unwrap();
            table.prefault();
            let id = format!("max_age/slots=2^{log2_slots}/ways={ways}/threads=1");
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    timed_on_threads(1, iters, |keys| {
                        black_box(table.contains_and_add(hash(&keys.next())));
                    })
                })
            });
            let id = format!("max_age/slots=2^{log2_slots}/ways={ways}/threads=1/half-duplicates");
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    timed_on_threads(1, iters.div_ceil(2), |keys| {
                        let key = keys.next();
                        black_box(table.contains_and_add(hash(&key)));
                        black_box(table.contains_and_add(hash(&key)));
                    })
                })
            });
        }
    }
    // Batches of 64 digests claimed with `claim_many_into`, which prefetches sets ahead.
    for log2_slots in [20u32, 26] {
        for ways in [1u32, 8] {
            let table = Table::with_slots(1 << log2_slots, ways).unwrap();
            table.prefault();
            let id = format!("claim_many_into/batch=64/slots=2^{log2_slots}/ways={ways}");
            group.bench_function(id, |b| {
                let mut keys = Keys(start_seed());
                let mut digests = Vec::with_capacity(64);
                let mut claims = Vec::with_capacity(64);
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters.div_ceil(64) {
                        digests.clear();
                        digests.extend((0..64).map(|_| hash(&keys.next())));
                        claims.clear();
                        table.claim_many_into(&digests, &mut claims);
                        black_box(&claims);
                    }
                    start.elapsed()
                })
            });
        }
    }
    // The floor under any table of this kind: hashing, one load and one compare-and-swap of a
    // random word of an array the same size, with nothing decided. A table cannot beat it;
    // how close it comes is what its design costs.
    for log2_slots in [20u32, 26] {
        let array = words_like_a_table(1 << log2_slots);
        let id = format!("baseline/hash-load-cas/slots=2^{log2_slots}");
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                timed_on_threads(1, iters, |keys| {
                    let digest = hash(&keys.next());
                    let word = &array[((digest.hi() as u128 * array.len() as u128) >> 64) as usize];
                    let seen = word.load(Acquire);
                    let swap = word.compare_exchange(seen, digest.lo(), AcqRel, Relaxed);
                    black_box(swap.is_ok());
                })
            })
        });
    }
    let table = Table::with_slots(1 << 20, 8).unwrap();
    table.prefault();
    group.bench_function("baseline/xxh3-only", |b| {
        b.iter_custom(|iters| {
            timed_on_threads(1, iters, |keys| {
                black_box(hash(&keys.next()));
            })
        })
    });
    let locked = LockedClassic(Mutex::new(vec![0; 1 << 20]));
    for threads in [1u64, 2] {
        let id = format!("baseline/mutex-classic/slots=2^20/threads={threads}");
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                timed_on_threads(threads, iters, |keys| {
                    black_box(locked.contains_and_add(hash(&keys.next())));
                })
            })
        });
    }
    // A stream with copies: every key is seen twice in a row (the hit path).
    group.bench_function("slots=2^20/ways=8/threads=1/half-duplicates", |b| {
        b.iter_custom(|iters| {
            timed_on_threads(1, iters, |keys| {
                let key = keys.next();
                black_box(table.contains_and_add(hash(&key)));
                black_box(table.contains_and_add(hash(&key)));
            })
        })
    });
    group.finish();
}

fn digest(c: &mut Criterion) {
    let mut group = c.benchmark_group("nsq_dedupe::DigestAlgorithm::digest");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(2));
    for size in [100usize, 1024] {
        let body: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        let keyed = DigestAlgorithm::Blake3Keyed(
            nsq_dedupe::DigestKey::from_file_contents(&[42u8; 32]).expect("a 32-byte key"),
        );
        for algorithm in [
            DigestAlgorithm::Xxh3 { seed: 0 },
            DigestAlgorithm::Md5,
            keyed,
        ] {
            let id = BenchmarkId::new(algorithm.to_string(), format!("{size}B"));
            group.bench_with_input(id, &body, |b, body| {
                b.iter(|| algorithm.digest(black_box(body)))
            });
        }
    }
    group.finish();
}

/// `Table::claim` of new digests during a resize (a previous generation of 2^20 slots, half
/// full, behind a current one of 2^22) against the same claims on a table of 2^22 slots never
/// resized. Each timed run gets a fresh table and stays below half the current generation's
/// slots, so the previous generation is still held (checked) and neither table is full.
fn claim_during_resize(c: &mut Criterion) {
    const OLD: u64 = 1 << 20;
    const NEW: u64 = 1 << 22;
    let mut group = c.benchmark_group("nsq_dedupe::Table::claim/resize");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));
    let steady = || {
        let table = Table::with_slots(NEW, 8).unwrap();
        table.prefault();
        table
    };
    let resizing = || {
        let old = Table::with_slots(OLD, 8).unwrap();
        old.prefault();
        let mut keys = Keys(start_seed());
        for _ in 0..OLD / 2 {
            old.contains_and_add(hash(&keys.next()));
        }
        let table = old.resize(Geometry::new(NEW, 8).unwrap()).unwrap();
        table.prefault();
        table
    };
    let makers: [(&str, &dyn Fn() -> Table); 2] = [("steady", &steady), ("resizing", &resizing)];
    for threads in [1u64, 2] {
        for (name, make) in makers {
            let id = format!("slots=2^22/ways=8/threads={threads}/{name}");
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters;
                    while left > 0 {
                        let n = left.min(NEW / 2);
                        let table = make();
                        total += timed_on_threads(threads, n, |keys| {
                            black_box(table.claim(hash(&keys.next())));
                        });
                        assert_eq!(table.resizing().is_some(), name == "resizing");
                        left -= n;
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion::criterion_group!(benches, contains_and_add, claim_during_resize, digest);
