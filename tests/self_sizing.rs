//! The in-process table that sizes itself (`--probability` and `--window`, no rate and no
//! size): it starts small, grows by generations when the rate rises so that copies a window
//! late are still caught, loses nothing, stays under `--max-memory` and says when that
//! ceiling stops it; and the flags are accepted or refused as the guide says.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nsq_dedupe::config::Dur;

use crate::cli_errors::run_refused;
use crate::sidecar::{
    metric, payload, raw_config, scrape, wait_all_delivered, Recorder, Running, TOPIC,
};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::child::Child;

/// The window the tests size for, short so that a test takes seconds.
const WINDOW: Duration = Duration::from_secs(3);

/// How long after its original each copy is published: two thirds of the window.
const LATE: Duration = Duration::from_secs(2);

/// One phase of traffic: `rate` new messages a second for `length`.
struct Phase {
    rate: f64,
    length: Duration,
}

/// The step the growth tests send: 200 messages a second for 3 s, then 2,000 for 4 s.
const RISE: [Phase; 2] = [
    Phase {
        rate: 200.0,
        length: Duration::from_secs(3),
    },
    Phase {
        rate: 2000.0,
        length: Duration::from_secs(4),
    },
];

/// What a run of [`send`] published, and what the metrics page said meanwhile.
struct Sent {
    /// Originals of each phase: ids `start..end`.
    phases: Vec<std::ops::Range<usize>>,
    /// (seconds since the second phase began, table slots) at each change of size seen.
    sizes: Vec<(f64, f64)>,
    /// The most memory the table's generations held together at a scrape.
    max_held_bytes: f64,
}

/// Publishes `phases` of new messages, each one again [`LATE`] after it, scraping the metrics
/// page at `addr` every 100 ms.
async fn send(broker: &Broker, addr: std::net::SocketAddr, phases: &[Phase]) -> Sent {
    let mut next = 0;
    let mut copies: VecDeque<(Instant, usize)> = VecDeque::new();
    let mut ranges = Vec::new();
    let mut sizes = Vec::new();
    let mut max_held_bytes: f64 = 0.0;
    let mut last_scrape = Instant::now() - Duration::from_secs(1);
    let mut step_at = None;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut observe = |step_at: Option<Instant>, sizes: &mut Vec<(f64, f64)>| {
        let page = scrape(addr);
        let slots = metric(&page, "nsq_dedupe_table_slots").unwrap_or(0.0);
        let previous = metric(&page, "nsq_dedupe_table_previous_slots").unwrap_or(0.0);
        max_held_bytes = max_held_bytes.max((slots + previous) * 8.0);
        if sizes.last().is_none_or(|&(_, s)| s != slots) {
            let since = step_at.map_or(-1.0, |at: Instant| at.elapsed().as_secs_f64());
            sizes.push((since, slots));
        }
    };
    for (index, phase) in phases.iter().enumerate() {
        let started = Instant::now();
        if index == 1 {
            step_at = Some(started);
        }
        let first = next;
        let total = (phase.rate * phase.length.as_secs_f64()) as usize;
        while next - first < total {
            tick.tick().await;
            let due = ((phase.rate * started.elapsed().as_secs_f64()) as usize).min(total);
            let now = Instant::now();
            let fresh: Vec<usize> = (next..first + due).collect();
            next = first + due;
            broker.publish_many(TOPIC, fresh.iter().map(|&i| payload(i)));
            copies.extend(fresh.into_iter().map(|i| (now + LATE, i)));
            send_due_copies(broker, &mut copies);
            if last_scrape.elapsed() >= Duration::from_millis(100) {
                last_scrape = Instant::now();
                observe(step_at, &mut sizes);
            }
        }
        ranges.push(first..next);
    }
    while !copies.is_empty() {
        tick.tick().await;
        send_due_copies(broker, &mut copies);
        if last_scrape.elapsed() >= Duration::from_millis(100) {
            last_scrape = Instant::now();
            observe(step_at, &mut sizes);
        }
    }
    observe(step_at, &mut sizes);
    Sent {
        phases: ranges,
        sizes,
        max_held_bytes,
    }
}

/// Publishes the copies whose time has come.
fn send_due_copies(broker: &Broker, copies: &mut VecDeque<(Instant, usize)>) {
    let now = Instant::now();
    let mut due = Vec::new();
    while copies.front().is_some_and(|&(at, _)| at <= now) {
        due.push(payload(copies.pop_front().unwrap().1));
    }
    broker.publish_many(TOPIC, due);
}

/// Copies of `range` delivered, besides their originals.
fn passed(recorder: &Recorder, range: &std::ops::Range<usize>) -> usize {
    let delivered = recorder.delivered();
    range
        .clone()
        .map(|i| delivered.get(&payload(i)).copied().unwrap_or(0))
        .filter(|&n| n > 1)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sudden_rise_grows_the_table_and_copies_a_window_late_are_still_caught() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[broker.tcp_addr()]);
    raw.store.buckets = None;
    raw.store.probability = Some(0.99);
    raw.store.window = Some(Dur(WINDOW));
    raw.store.max_memory = Some("64MiB".to_owned());
    let recorder = Recorder::default();
    let running = Running::start(raw.validate().unwrap(), recorder.clone()).await;
    let addr = running.metrics_addr.unwrap();
    let page = scrape(addr);
    let initial = metric(&page, "nsq_dedupe_table_slots").unwrap();

    let sent = send(&broker, addr, &RISE).await;
    let originals = sent.phases.last().unwrap().end;
    wait_all_delivered(&recorder, &[&broker], originals, "").await;
    let page = scrape(addr);
    running.stop().await;

    let (slow, fast) = (&sent.phases[0], &sent.phases[1]);
    let (slow_passed, fast_passed) = (passed(&recorder, slow), passed(&recorder, fast));
    eprintln!(
        "initial slots {initial}; sizes (seconds after the rise, slots): {:?}; most held \
         {:.0} bytes; copies passed: {slow_passed} of {} before the rise, {fast_passed} of {} \
         after",
        sent.sizes,
        sent.max_held_bytes,
        slow.len(),
        fast.len()
    );
    // Nothing lost: every original delivered.
    assert_eq!(recorder.distinct_delivered(), originals);
    // Each copy of the fast phase came once it had run two thirds of a window: at most 2% pass.
    assert!(
        fast_passed * 50 <= fast.len(),
        "{fast_passed} of {} copies passed after the rise; sizes {:?}",
        fast.len(),
        sent.sizes
    );
    let slots = metric(&page, "nsq_dedupe_table_slots").unwrap();
    assert!(
        slots > initial,
        "the table grew from {initial} slots: {page}"
    );
    assert!(metric(&page, "nsq_dedupe_table_resizes_total").unwrap() >= 1.0);
    assert!(
        sent.max_held_bytes <= (64 << 20) as f64,
        "{} bytes held",
        sent.max_held_bytes
    );
}

/// A free loopback port for a child's metrics server.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_holds_the_table_and_says_so() {
    the_ceiling_holds(&[], "The table is too small for the recent rate").await;
}

/// The same for a table shared in Redis: its WARN names the fleet's rate, and the ceiling that
/// would let it grow as far as it needs, counted as `--max-memory` counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_holds_a_shared_table_and_says_so() {
    let redis = crate::support::redis::RedisServer::start();
    let url = redis.url();
    let store = ["--store", "redis", "--redis-url", &url];
    the_ceiling_holds(
        &store,
        "The shared table is too small for the fleet's recent rate",
    )
    .await;
}

/// A sidecar with `store` (none: the in-process table) sizing itself under a `--max-memory`
/// of 64 KiB, sent 2,000 new messages a second: it stays under the ceiling and warns, starting
/// with `says`, what ceiling would let it grow.
async fn the_ceiling_holds(store: &[&str], says: &str) {
    let broker = Broker::start(BrokerConfig::default()).await;
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let nsqd = broker.tcp_addr().to_string();
    let mut args = vec![
        "run",
        "--topic",
        TOPIC,
        "--channel",
        "dedupe",
        "--nsqd-tcp-address",
        &nsqd,
        "--sink",
        "null",
        "--metrics-address",
        &metrics,
        "--status-interval",
        "1s",
        "--probability",
        "0.99",
        "--window",
        "3s",
        "--max-memory",
        "64KiB",
    ];
    args.extend(store);
    let mut child = Child::bin(args);
    assert!(
        child
            .line_on_stderr("sizes itself", Duration::from_secs(60))
            .is_some(),
        "{}",
        child.stderr()
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let sent = send(
        &broker,
        addr,
        &[Phase {
            rate: 2000.0,
            length: Duration::from_secs(3),
        }],
    )
    .await;
    let warning = child.line_on_stderr("cannot grow past", Duration::from_secs(10));
    let finished = child.stop_within("TERM", Duration::from_secs(15));
    let warning = warning.unwrap_or_else(|| panic!("no warning:\n{}", finished.stderr));
    assert!(
        warning.contains(&format!(
            "{says} and cannot grow past `--max-memory`: a copy one window late is caught with \
             probability"
        )),
        "{warning}"
    );
    assert!(warning.contains("max_memory=64.0 KiB"), "{warning}");
    // It names the ceiling that would let the table grow as far as it needs.
    assert!(
        warning.contains("so `--max-memory` of at least ")
            && warning.contains(" held now, until they retire) lets it grow there."),
        "{warning}"
    );
    assert!(
        sent.max_held_bytes > 0.0 && sent.max_held_bytes <= 65536.0,
        "{} bytes held",
        sent.max_held_bytes
    );
}

#[test]
fn probability_and_window_without_a_size_start_a_table_that_sizes_itself() {
    let mut child = Child::bin([
        "run",
        "--topic",
        "t",
        "--nsqd-tcp-address",
        "127.0.0.1:1",
        "--metrics-address",
        "off",
        "--sink",
        "null",
        "--probability",
        "0.99",
        "--window",
        "30s",
    ]);
    let line = child.line_on_stderr("The table sizes itself", Duration::from_secs(60));
    if child.has_exited() {
        panic!("refused:\n{}", child.stderr());
    }
    let finished = child.stop_within("TERM", Duration::from_secs(15));
    let line = line.unwrap_or_else(|| panic!("not started:\n{}", finished.stderr));
    assert!(
        line.contains("it grows for the distinct rate it meets, up to `--max-memory`."),
        "{line}"
    );
}

#[test]
fn a_bad_max_memory_is_refused_naming_the_flag() {
    let run = |extra: &[&str]| {
        run_refused(
            &[],
            &[
                &[
                    "--topic",
                    "t",
                    "--nsqd-tcp-address",
                    "127.0.0.1:1",
                    "--metrics-address",
                    "off",
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let (code, stderr) = run(&[
        "--probability",
        "0.99",
        "--window",
        "30s",
        "--max-memory",
        "lots",
    ]);
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.starts_with("error: invalid `--max-memory` = \"lots\": "),
        "{stderr}"
    );
    let (code, stderr) = run(&[
        "--probability",
        "0.99",
        "--window",
        "30s",
        "--max-memory",
        "32B",
    ]);
    assert_eq!(code, 78, "{stderr}");
    assert_eq!(
        stderr,
        "error: invalid `--max-memory` = \"32B\": holds less than one set of 8 slots (64 \
         bytes)\n"
    );
    // A table of a size given does not size itself: the ceiling would do nothing.
    let (code, stderr) = run(&["--buckets", "1024", "--max-memory", "1MiB"]);
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("`--max-memory`"), "{stderr}");
}

/// The value of `field=` in `line`.
fn field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_table_file_keeps_the_size_the_table_grew_to() {
    let broker = Broker::start(BrokerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    let nsqd = broker.tcp_addr().to_string();
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let args = [
        "run",
        "--topic",
        TOPIC,
        "--channel",
        "dedupe",
        "--nsqd-tcp-address",
        &nsqd,
        "--sink",
        "null",
        "--metrics-address",
        &metrics,
        "--probability",
        "0.99",
        "--window",
        "3s",
        "--table-file",
        table.to_str().unwrap(),
    ];
    let mut first = Child::bin(args);
    assert!(first
        .line_on_stderr("The table sizes itself", Duration::from_secs(60))
        .is_some());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    send(
        &broker,
        addr,
        &[Phase {
            rate: 2000.0,
            length: Duration::from_secs(2),
        }],
    )
    .await;
    let first = first.stop_within("TERM", Duration::from_secs(15));
    let grown = first
        .stderr
        .lines()
        .rev()
        .filter(|line| line.contains("The table grew"))
        .find_map(|line| field(line, "new_buckets"))
        .unwrap_or_else(|| panic!("the table did not grow:\n{}", first.stderr));

    let mut second = Child::bin(args);
    let started = second.line_on_stderr("The table sizes itself", Duration::from_secs(60));
    let second = second.stop_within("TERM", Duration::from_secs(15));
    let started = started.unwrap_or_else(|| panic!("not started:\n{}", second.stderr));
    assert_eq!(field(&started, "buckets"), Some(grown), "{}", second.stderr);
    assert!(
        !second.stderr.contains("Table file resized"),
        "{}",
        second.stderr
    );
}

/// Two sidecars sharing a Redis table that sizes itself: the fleet's rate rises tenfold, the
/// table grows for it through the store's descriptor (the same one `nsq-dedupe resize`
/// writes), both follow, and copies a window late are still caught; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_table_grows_for_the_fleets_rate_and_copies_a_window_late_are_still_caught() {
    let redis = crate::support::redis::RedisServer::start();
    let descriptor = || redis.cli(&["GET", "selfsizing:table"]);
    a_shared_table_grows(
        |raw| {
            raw.store.kind = Some(nsq_dedupe::config::StoreKind::Redis);
            raw.store.redis_urls = Some(vec![redis.url()]);
        },
        descriptor,
    )
    .await;
}

/// The same in Memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_shared_in_memcached_grows_for_the_fleets_rate() {
    let memcached = crate::support::memcached::MemcachedServer::start();
    let addr = memcached.addr();
    let descriptor = || memcached_get(&addr, "selfsizing:table");
    a_shared_table_grows(
        |raw| {
            raw.store.kind = Some(nsq_dedupe::config::StoreKind::Memcached);
            raw.store.memcached_addresses = Some(vec![addr.clone()]);
        },
        descriptor,
    )
    .await;
}

/// The value of `key` in the Memcached server at `addr`, as text ("" when it holds none).
fn memcached_get(addr: &str, key: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "get {key}\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).unwrap();
    if header.starts_with("END") {
        return String::new();
    }
    let mut value = String::new();
    reader.read_line(&mut value).unwrap();
    value
}

/// Two sidecars sharing the table `store` configures, sizing itself; `descriptor` reads the
/// store's descriptor.
async fn a_shared_table_grows(
    store: impl FnOnce(&mut nsq_dedupe::config::RawConfig),
    descriptor: impl Fn() -> String,
) {
    let broker = Broker::start(BrokerConfig::default()).await;
    let mut raw = raw_config(&[broker.tcp_addr()]);
    store(&mut raw);
    raw.store.namespace = Some("selfsizing".to_owned());
    raw.store.fleet_interval = Some(Dur(Duration::from_millis(200)));
    raw.store.buckets = None;
    raw.store.ways = None;
    raw.store.probability = Some(0.99);
    raw.store.window = Some(Dur(WINDOW));
    raw.store.max_memory = Some("64MiB".to_owned());
    let settings = raw.validate().unwrap();
    let recorder = Recorder::default();
    let a = Running::start(settings.clone(), recorder.clone()).await;
    let b = Running::start(settings, recorder.clone()).await;
    let addr = a.metrics_addr.unwrap();
    let before = descriptor();

    let sent = send(&broker, addr, &RISE).await;
    let originals = sent.phases.last().unwrap().end;
    wait_all_delivered(&recorder, &[&broker], originals, "").await;
    // A growth decided just now reaches the other sidecar at its next look at the store's
    // descriptor (every `fleet_interval`): wait, boundedly, until both claim in one table.
    let mut pages = (scrape(addr), scrape(b.metrics_addr.unwrap()));
    for _ in 0..50 {
        let slots = |page: &str| metric(page, "nsq_dedupe_table_slots");
        if slots(&pages.0) == slots(&pages.1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        pages = (scrape(addr), scrape(b.metrics_addr.unwrap()));
    }
    let (page_a, page_b) = pages;
    a.stop().await;
    b.stop().await;
    let after = descriptor();

    let (slow, fast) = (&sent.phases[0], &sent.phases[1]);
    let (slow_passed, fast_passed) = (passed(&recorder, slow), passed(&recorder, fast));
    eprintln!(
        "descriptor {before:?} then {after:?}; sizes seen by one sidecar (seconds after the \
         rise, slots): {:?}; copies passed: {slow_passed} of {} before the rise, \
         {fast_passed} of {} after",
        sent.sizes,
        slow.len(),
        fast.len()
    );
    // Nothing lost: every original delivered.
    assert_eq!(recorder.distinct_delivered(), originals);
    assert_ne!(before.trim(), after.trim(), "the store's table grew");
    assert!(
        fast_passed * 50 <= fast.len(),
        "{fast_passed} of {} copies passed after the rise; descriptor {after:?}; sizes {:?}",
        fast.len(),
        sent.sizes
    );
    // Both sidecars claim in the grown table, and count the resize.
    let slots_a = metric(&page_a, "nsq_dedupe_table_slots").unwrap();
    assert_eq!(Some(slots_a), metric(&page_b, "nsq_dedupe_table_slots"));
    let current = after.split_whitespace().nth(1).unwrap_or_default();
    assert!(
        current.ends_with(&format!(":{}x8", slots_a as u64 / 8)),
        "{after}"
    );
    for page in [&page_a, &page_b] {
        assert!(metric(page, "nsq_dedupe_table_resizes_total").unwrap() >= 1.0);
    }
}
