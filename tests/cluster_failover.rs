//! A master of the Redis Cluster fails while two sidecar processes de-duplicate a replicated
//! stream through it, as deployed: two nsqd (test brokers) carrying the same payloads, two
//! `nsq-dedupe run` processes sharing one table in a cluster of three masters with a replica
//! each, bursts of up to 20 messages in flight, and the producers still publishing when the
//! master goes. It is either killed (SIGKILL: its port refuses connections) or frozen
//! (SIGSTOP: its port accepts connections and answers nothing, as a hung process or a host cut
//! off by the network does); either way the cluster promotes its replica after
//! `cluster-node-timeout`. Each fault on a cluster of Redis 7.0 (the set script) and of Valkey
//! 8.1 (`SET … IFEQ`).
//!
//! What a user cares about: every payload reaches a sink (the two sidecars' stdout together
//! hold each one; repeats are allowed, losses are not), and nothing is left queued, deferred or
//! in flight on either nsqd shortly after the cluster has recovered.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::sidecar::{drained, payload, CHANNEL, TOPIC};
use crate::support::broker::{Broker, BrokerConfig};
use crate::support::redis::{Flavor, RedisCluster};

/// The cluster's `cluster-node-timeout`: a master silent this long is marked failed and its
/// replica promoted.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest the sidecars may go without delivering a payload not delivered before, once
/// the cluster has had `NODE_TIMEOUT` to detect the failure and promote a replica: a stall.
/// How fast they drain the backlog after it depends on the machine's load, and is not what
/// this test holds them to.
const STALL_LIMIT: Duration = Duration::from_secs(6);

/// The bound on the whole drain after the fault, so that the test ends.
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

/// Payloads published to both brokers.
const REPLICATED: usize = 5_000;

/// Payloads published to the first broker only.
const FIRST_BROKER_ONLY: usize = 300;

/// Distinct payloads delivered before the master fails.
const FAULT_AFTER: usize = 1_000;

/// The producers publish this many replicated payloads (and their share of the first
/// broker's own) every `PUBLISH_TICK`: 1,000 a second, so most of the stream is published
/// after the fault.
const PUBLISH_CHUNK: usize = 50;
const PUBLISH_TICK: Duration = Duration::from_millis(50);

/// How long the sidecars may take to deliver `FAULT_AFTER` payloads on a healthy cluster.
const HEALTHY_LIMIT: Duration = Duration::from_secs(30);

/// Lines of each sidecar's stderr shown when the test fails.
const STDERR_TAIL: usize = 8;

/// How the master fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL: connections to it break and new ones are refused.
    Kill,
    /// SIGSTOP: connections to it are accepted and never answered.
    Freeze,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_stalls_no_sidecar_and_loses_no_payload() {
    master_fails_mid_stream(Flavor::Redis, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_stalls_no_sidecar_and_loses_no_payload() {
    master_fails_mid_stream(Flavor::Redis, Fault::Freeze).await;
}

/// The same on a cluster of Valkey 8.1, where the sidecars claim and commit with
/// `SET … IFEQ`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_valkey_master_stalls_no_sidecar_and_loses_no_payload() {
    master_fails_mid_stream(Flavor::Valkey, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_valkey_master_stalls_no_sidecar_and_loses_no_payload() {
    master_fails_mid_stream(Flavor::Valkey, Fault::Freeze).await;
}

/// What the sidecars wrote to stdout, together.
#[derive(Default)]
struct Delivered {
    lines: usize,
    distinct: HashSet<String>,
}

/// One `nsq-dedupe run` process writing to the stdout sink; killed on drop.
struct Sidecar {
    name: &'static str,
    child: Child,
    /// Lines this process wrote to stdout.
    lines: Arc<Mutex<usize>>,
    /// What it wrote to stderr, by line.
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Sidecar {
    /// Starts the binary consuming `brokers` with the table in the cluster whose masters are
    /// `seeds`; each stdout line goes into `delivered`. No metrics server (two would want one
    /// port), and a status line every second, whose `store_errors` count says whether the
    /// store answers.
    fn start(
        name: &'static str,
        brokers: &[&Broker],
        seeds: &[String],
        delivered: &Arc<Mutex<Delivered>>,
    ) -> Sidecar {
        let nsqd: Vec<String> = brokers.iter().map(|b| b.tcp_addr().to_string()).collect();
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .args(["run", "--topic", TOPIC, "--channel", CHANNEL])
            .args(["--nsqd-tcp-address", &nsqd.join(",")])
            .args(["--store", "redis", "--redis-cluster"])
            .args(seeds.iter().flat_map(|url| ["--redis-url", url.as_str()]))
            .args(["--namespace", "failover"])
            .args(["--max-in-flight", "20", "--msg-timeout", "5s"])
            .args(["--sink", "stdout", "--metrics-address", "off"])
            .args(["--status-interval", "1s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the nsq-dedupe binary runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(0));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            {
                let (lines, delivered) = (lines.clone(), delivered.clone());
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        *lines.lock().unwrap() += 1;
                        let mut delivered = delivered.lock().unwrap();
                        delivered.lines += 1;
                        delivered.distinct.insert(line);
                    }
                })
            },
            {
                let stderr = stderr.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stderr_pipe).lines() {
                        let Ok(line) = line else { break };
                        stderr.lock().unwrap().push(line);
                    }
                })
            },
        ];
        Sidecar {
            name,
            child,
            lines,
            stderr,
            readers,
        }
    }

    /// Whether it still runs, its stdout line count, its store errors (in all, and over its
    /// last three status lines), the last store error it logged, and the end of its stderr.
    fn report(&mut self) -> String {
        let status = match self.child.try_wait() {
            Ok(None) => "running".to_owned(),
            Ok(Some(status)) => format!("exited with {status}"),
            Err(error) => format!("unknown state ({error})"),
        };
        let stderr = self.stderr.lock().unwrap();
        let store_errors: Vec<u64> = stderr
            .iter()
            .filter_map(|line| {
                let count = line.split("store_errors=").nth(1)?;
                count.split(' ').next()?.parse().ok()
            })
            .collect();
        let total = store_errors.last().copied().unwrap_or(0);
        let recent = store_errors
            .len()
            .checked_sub(4)
            .map_or(total, |i| total - store_errors[i]);
        let last_error = stderr
            .iter()
            .rev()
            .find(|line| line.contains("Store error."))
            .map_or("none", String::as_str);
        let tail = &stderr[stderr.len().saturating_sub(STDERR_TAIL)..];
        format!(
            "sidecar {} ({status}): {} lines on stdout; {total} store errors, {recent} in its last 3 s; \
             last store error logged: {last_error}\n  stderr ends:\n    {}",
            self.name,
            *self.lines.lock().unwrap(),
            tail.join("\n    ")
        )
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pipes closed with the process: the readers end.
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

/// Publishing steps: `PUBLISH_CHUNK` replicated payloads each.
const STEPS: usize = REPLICATED.div_ceil(PUBLISH_CHUNK);

/// Publishes step `step` of the stream: its replicated payloads to both brokers, and its share
/// of the first broker's own to `first` alone.
fn publish_step(step: usize, first: &Broker, second: &Broker) {
    let replicated: Vec<Bytes> = (step * PUBLISH_CHUNK
        ..((step + 1) * PUBLISH_CHUNK).min(REPLICATED))
        .map(payload)
        .collect();
    let own_per_step = FIRST_BROKER_ONLY.div_ceil(STEPS);
    let own = (step * own_per_step..((step + 1) * own_per_step).min(FIRST_BROKER_ONLY))
        .map(|i| payload(REPLICATED + i));
    first.publish_many(TOPIC, replicated.iter().cloned().chain(own));
    second.publish_many(TOPIC, replicated);
}

/// The (queued, deferred, in flight) of both brokers' channels, added up.
fn held(a: &Broker, b: &Broker) -> (usize, usize, usize) {
    let (x, y) = (a.depth(TOPIC, CHANNEL), b.depth(TOPIC, CHANNEL));
    (x.0 + y.0, x.1 + y.1, x.2 + y.2)
}

/// Two sidecars consume a stream published steadily to two brokers; after `FAULT_AFTER`
/// deliveries the master of slot 0 (a node of `flavor`) suffers `fault`, while publishing goes
/// on. Every payload must be delivered and both brokers drained, with no stall longer than
/// `STALL_LIMIT` after the cluster's `NODE_TIMEOUT`.
async fn master_fails_mid_stream(flavor: Flavor, fault: Fault) {
    let began = Instant::now();
    let cluster = RedisCluster::of(flavor, NODE_TIMEOUT);
    let masters = cluster.masters(0);
    assert_eq!(masters.len(), 3, "a new cluster has three masters");
    let seeds: Vec<String> = masters.iter().map(|&i| cluster.nodes[i].url()).collect();
    let victim = cluster.master_of_slot(0, masters[0]);
    // Asked who serves slot 0 after the fault.
    let survivor = masters.iter().copied().find(|&i| i != victim).unwrap();
    let victim_pid = cluster.nodes[victim].pid().expect("the victim runs");
    let a = Broker::start(BrokerConfig::default()).await;
    let b = Broker::start(BrokerConfig::default()).await;
    let delivered = Arc::new(Mutex::new(Delivered::default()));
    let mut sidecars = [
        Sidecar::start("1", &[&a, &b], &seeds, &delivered),
        Sidecar::start("2", &[&a, &b], &seeds, &delivered),
    ];
    let expected = REPLICATED + FIRST_BROKER_ONLY;
    let distinct = || delivered.lock().unwrap().distinct.len();

    // Publish steadily; the fault lands once FAULT_AFTER payloads are through. A frozen node
    // is resumed when `_frozen` drops, before the cluster (declared earlier) kills it.
    let mut _frozen = None;
    let mut fault_at: Option<Instant> = None;
    // Once a second after the fault: distinct payloads delivered and what the brokers hold.
    let mut timeline: Vec<String> = Vec::new();
    let mut timeline_second = None;
    // The last time a payload not delivered before came out, and how many had then.
    let mut progress = (Instant::now(), 0);
    let started = Instant::now();
    let mut step = 0;
    let drained_after = loop {
        if step < STEPS {
            publish_step(step, &a, &b);
            step += 1;
        }
        let Some(at) = fault_at else {
            if distinct() >= FAULT_AFTER {
                match fault {
                    Fault::Kill => cluster.nodes[victim].kill(),
                    Fault::Freeze => _frozen = Some(cluster.nodes[victim].freeze()),
                }
                fault_at = Some(Instant::now());
                eprintln!(
                    "cluster_failover: {flavor:?}: {fault:?} of master node {victim} (pid {victim_pid}) after {} distinct deliveries, {:?} into the stream",
                    distinct(),
                    started.elapsed()
                );
            } else if started.elapsed() > HEALTHY_LIMIT {
                let reports: Vec<String> = sidecars.iter_mut().map(Sidecar::report).collect();
                panic!(
                    "the sidecars delivered only {}/{FAULT_AFTER} distinct payloads in {HEALTHY_LIMIT:?} on a healthy cluster; \
                     the brokers hold (queued, deferred, in flight) {:?} and {:?}\n{}",
                    distinct(),
                    a.depth(TOPIC, CHANNEL),
                    b.depth(TOPIC, CHANNEL),
                    reports.join("\n")
                );
            }
            tokio::time::sleep(PUBLISH_TICK).await;
            continue;
        };
        if step == STEPS && distinct() == expected && drained(&a) && drained(&b) {
            break Some(at.elapsed());
        }
        let second = at.elapsed().as_secs();
        if timeline_second != Some(second) {
            timeline_second = Some(second);
            let (queued, deferred, in_flight) = held(&a, &b);
            timeline.push(format!(
                "+{second}s {} {queued}/{deferred}/{in_flight}",
                distinct()
            ));
        }
        let now_delivered = distinct();
        if now_delivered > progress.1 {
            progress = (Instant::now(), now_delivered);
        }
        let stalled = at.elapsed() > NODE_TIMEOUT + STALL_LIMIT
            && progress.0.elapsed() > STALL_LIMIT
            && now_delivered < expected;
        if stalled || at.elapsed() > DRAIN_LIMIT {
            break None;
        }
        let pause = if step < STEPS {
            PUBLISH_TICK
        } else {
            Duration::from_millis(20)
        };
        tokio::time::sleep(pause).await;
    };

    let (lines, distinct_now) = {
        let delivered = delivered.lock().unwrap();
        (delivered.lines, delivered.distinct.len())
    };
    let Some(drain_time) = drained_after else {
        let missing: Vec<String> = {
            let delivered = delivered.lock().unwrap();
            (0..expected)
                .map(|i| String::from_utf8_lossy(&payload(i)).into_owned())
                .filter(|p| !delivered.distinct.contains(p))
                .take(3)
                .collect()
        };
        let reports: Vec<String> = sidecars.iter_mut().map(Sidecar::report).collect();
        panic!(
            "{flavor:?}: {fault:?} of master node {victim}: {distinct_now}/{expected} distinct payloads delivered ({lines} lines) \
             and the brokers not drained: no new payload for {:?} (stall limit {STALL_LIMIT:?}), {:?} after the fault (node timeout {NODE_TIMEOUT:?}); \
             broker 1 holds (queued, deferred, in flight) {:?}, broker 2 {:?}; first missing {missing:?}; \
             slot 0 now served by node {}\n\
             after the fault (distinct delivered, queued/deferred/in flight on both): {}\n{}",
            progress.0.elapsed(),
            fault_at.map(|at| at.elapsed()),
            a.depth(TOPIC, CHANNEL),
            b.depth(TOPIC, CHANNEL),
            cluster.master_of_slot(0, survivor),
            timeline.join(", "),
            reports.join("\n")
        );
    };
    eprintln!(
        "cluster_failover: {flavor:?}: {fault:?}: {expected} payloads delivered in {lines} lines ({} repeats); drained {drain_time:?} after the fault; {:?} in all",
        lines - distinct_now,
        began.elapsed()
    );
}
