//! Throughput benchmarks of `run` (ignored; run explicitly in release mode): the in-process
//! table against the `none` store, and the stdout and nsq sinks against the null sink and
//! against the per-record writes they had before.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::config::{Dur, SinkKind, StoreKind};
use nsq_dedupe::metrics::get;

use crate::sidecar::{
    publish_timed, raw_config, wait_for_fins, Running, CHANNEL, TOPIC, UNIQUE_TOPIC,
};
use crate::support::broker::{Broker, BrokerConfig};

/// Which sink a timed pass delivers to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BenchSink {
    Null,
    /// The stdout sink's writer, on `/dev/null`.
    StdoutToDevNull,
    /// The stdout sink as it was before group commit, on `/dev/null`: an async mutex, then one
    /// write and one flush per record through tokio's blocking pool.
    PerRecordToDevNull,
    /// The nsq sink, to a second broker.
    Nsq(SocketAddr),
    /// One PUB and one round trip per record, as the nsq sink did before batching.
    PubPerRecord(SocketAddr),
}

/// One timed pass: messages per second, and CPU microseconds per message (process-wide).
#[derive(Debug, Clone, Copy)]
struct Pass {
    rate: f64,
    cpu_us: f64,
}

/// One timed pass of [`throughput`]: `n` distinct 100-byte bodies through `run` to the null
/// sink with `store`; returns messages per second from the publish to the last FIN.
///
/// Steady state: the sidecar first handles `WARM_UP` other messages, so connecting, RDY
/// ramp-up and the first touch of the table's memory (64 MiB zeroed by the kernel) are not
/// timed; a long-running sidecar pays them once.
async fn timed_pass(store: StoreKind, sink: BenchSink, n: usize, pass: usize) -> Pass {
    const WARM_UP: usize = 100_000;
    let broker = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let bodies = |prefix: &str, count: usize| {
        let mut all = bytes::BytesMut::with_capacity(count * 100);
        for i in 0..count {
            let mut b = [b'x'; 100];
            b[..13].copy_from_slice(format!("{prefix}{pass:03}{i:09}").as_bytes());
            all.extend_from_slice(&b);
        }
        let all = all.freeze();
        (0..count).map(move |i| all.slice(i * 100..(i + 1) * 100))
    };
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.source.max_in_flight = Some(2500);
    raw.source.msg_timeout = Some(Dur(Duration::from_secs(60)));
    raw.source.heartbeat_interval = Some(Dur(Duration::from_secs(30)));
    raw.store.kind = Some(store);
    raw.store.buckets = Some(8 * 1024 * 1024);
    raw.sink.kind = Some(SinkKind::Null);
    raw.metrics.address = Some("off".into());
    raw.metrics.status_interval = Some(Dur(Duration::from_secs(3600)));
    broker.publish_many(TOPIC, bodies("w", WARM_UP));
    let running = match sink {
        BenchSink::Null => Running::start_configured(raw.validate().unwrap()).await,
        BenchSink::StdoutToDevNull => {
            let dev_null = std::fs::File::create("/dev/null").unwrap();
            let sink = nsq_dedupe::sink::Sink::Stdout(nsq_dedupe::sink::StdoutSink::new(dev_null));
            Running::start(raw.validate().unwrap(), sink).await
        }
        BenchSink::PerRecordToDevNull => {
            use tokio::io::AsyncWriteExt;
            let dev_null = tokio::fs::File::from_std(std::fs::File::create("/dev/null").unwrap());
            let out = Arc::new(tokio::sync::Mutex::new(dev_null));
            let handler = move |body: Bytes| {
                let out = out.clone();
                async move {
                    let mut line = Vec::with_capacity(body.len() + 1);
                    line.extend_from_slice(&body);
                    line.push(b'\n');
                    let mut out = out.lock().await;
                    out.write_all(&line).await.unwrap();
                    out.flush().await.unwrap();
                    Ok(())
                }
            };
            Running::start(raw.validate().unwrap(), handler).await
        }
        BenchSink::Nsq(destination) => {
            raw.sink.kind = Some(SinkKind::Nsq);
            raw.sink.destination_nsqd_tcp_addresses = Some(vec![destination.to_string()]);
            raw.sink.destination_topic = Some(UNIQUE_TOPIC.into());
            Running::start_configured(raw.validate().unwrap()).await
        }
        BenchSink::PubPerRecord(destination) => {
            let config = nsq_dedupe::ProducerConfig::new(vec![destination.to_string()]);
            let producer = Arc::new(nsq_dedupe::Producer::new(config).unwrap());
            let handler = move |body: Bytes| {
                let producer = producer.clone();
                async move {
                    producer.publish(UNIQUE_TOPIC, body).await.unwrap();
                    Ok(())
                }
            };
            Running::start(raw.validate().unwrap(), handler).await
        }
    };
    wait_for_fins(&broker, "the warm-up finished", WARM_UP as u64).await;
    let (elapsed, cpu) =
        publish_timed(&broker, bodies("t", n).collect(), (WARM_UP + n) as u64).await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(get(&metrics.unique), (WARM_UP + n) as u64);
    assert_eq!(get(&metrics.handler_successes), (WARM_UP + n) as u64);
    assert_eq!(broker.depth(TOPIC, CHANNEL), (0, 0, 0));
    Pass {
        rate: n as f64 / elapsed.as_secs_f64(),
        cpu_us: cpu.as_secs_f64() * 1e6 / n as f64,
    }
}

/// End-to-end throughput of `run`: test broker -> de-dup -> null sink, with the in-process
/// table against the `none` store, alternating which runs first, best of five each.
///
/// `cargo test --release --test integration sidecar_throughput::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 300_000;
    let (mut none, mut memory) = (Vec::new(), Vec::new());
    // Alternate which goes first, so that neither always runs on a warmer (or busier) machine.
    for pass in 0..5 {
        if pass % 2 == 0 {
            none.push(timed_pass(StoreKind::None, BenchSink::Null, N, 2 * pass).await);
            memory.push(timed_pass(StoreKind::Memory, BenchSink::Null, N, 2 * pass + 1).await);
        } else {
            memory.push(timed_pass(StoreKind::Memory, BenchSink::Null, N, 2 * pass + 1).await);
            none.push(timed_pass(StoreKind::None, BenchSink::Null, N, 2 * pass).await);
        }
    }
    let median = |v: &[Pass], field: fn(&Pass) -> f64| {
        let mut v: Vec<f64> = v.iter().map(field).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let best = |v: &[Pass]| v.iter().map(|p| p.rate).fold(0.0, f64::max);
    let rate = |p: &Pass| p.rate;
    let cpu = |p: &Pass| p.cpu_us;
    println!("sidecar throughput, {N} distinct 100-byte messages after a warm-up, max_in_flight 2500, null sink:");
    for (name, passes) in [("none", &none), ("memory", &memory)] {
        println!(
            "  store {name:<7} {:>9.0} msgs/s best, {:>9.0} median; CPU {:.2} µs/msg median (sidecar and test broker); passes {:?}",
            best(passes),
            median(passes, rate),
            median(passes, cpu),
            passes.iter().map(|p| (p.rate.round(), (p.cpu_us * 100.0).round() / 100.0)).collect::<Vec<_>>()
        );
    }
    println!(
        "  ratio memory/none: {:.3} (best of each), {:.3} (medians); CPU per message memory/none {:.3} (medians)",
        best(&memory) / best(&none),
        median(&memory, rate) / median(&none, rate),
        median(&memory, cpu) / median(&none, cpu),
    );
}

/// Runs each of `sinks` (with its message count) five times, rotating which goes first, and
/// prints the median rate of each and its ratio to the first.
async fn compare_sinks(title: &str, sinks: &[(&str, BenchSink, usize)]) {
    let mut rates = vec![Vec::new(); sinks.len()];
    for pass in 0..5 {
        for k in 0..sinks.len() {
            let which = (pass + k) % sinks.len();
            let (_, sink, n) = sinks[which];
            let tag = sinks.len() * pass + k;
            rates[which].push(timed_pass(StoreKind::Memory, sink, n, tag).await.rate);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("{title}, 100-byte messages, max_in_flight 2500, memory store, medians of 5:");
    let first = median(&rates[0]);
    for ((name, _, n), rates) in sinks.iter().zip(&rates) {
        let rounded: Vec<f64> = rates.iter().map(|x| x.round()).collect();
        println!(
            "  {name:<18} {:>9.0} msgs/s of {n} ({:.3} of {}; passes {rounded:?})",
            median(rates),
            median(rates) / first,
            sinks[0].0
        );
    }
}

/// End-to-end throughput of the nsq sink (MPUB batches to a second broker) against the `null`
/// sink and against one PUB per record, in-process table.
///
/// `cargo test --release --test integration sidecar_throughput::nsq_sink_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn nsq_sink_throughput() {
    let destination = Broker::start(BrokerConfig {
        record_messages: false,
        ..BrokerConfig::default()
    })
    .await;
    let to = destination.tcp_addr();
    let sinks = [
        ("null", BenchSink::Null, 200_000),
        ("nsq (MPUB)", BenchSink::Nsq(to), 200_000),
        ("one PUB each", BenchSink::PubPerRecord(to), 50_000),
    ];
    compare_sinks("nsq sink", &sinks).await;
}

/// End-to-end throughput of the stdout sink (writing to `/dev/null`) against the `null` sink
/// and against the per-record write-and-flush it had before, in-process table.
///
/// `cargo test --release --test integration sidecar_throughput::stdout_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn stdout_throughput() {
    let sinks = [
        ("null", BenchSink::Null, 300_000),
        ("stdout /dev/null", BenchSink::StdoutToDevNull, 300_000),
        ("per-record flush", BenchSink::PerRecordToDevNull, 20_000),
    ];
    compare_sinks("stdout sink", &sinks).await;
}
