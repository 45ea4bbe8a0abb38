//! The consumer's control task: owns the table of connections, decides every `RDY` (with
//! [`rdy`](super::rdy)), backs off on handler failures as go-nsq does and on outages (with
//! [`backoff`](super::backoff)), and polls nsqlookupd, joining new nsqd and draining vanished
//! ones.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, Change, Signal};
use super::config::ConsumerConfig;
use super::connection::ConnHandle;
use super::error::Error;
use super::events::{ConsumerEvent, ShutdownReport};
use super::frame::Command;
use super::identify::Identify;
use super::jitter::random_unit;
use super::lookupd;
use super::message::Message;
use super::rdy::{self, BackoffPhase, CONTROL_TICK, RDY_SETTLE};
use super::shared::{ConsumerShared, Control};
use super::supervisor::Supervisor;
use super::transport::Prepared;
use crate::http::{HttpClient, HttpClientConfig};
use crate::metrics::inc;

/// The live state of the connection to `addr`, which the caller has just seen to be live.
///
/// # Panics
///
/// If `addr` has no live connection: `rebalance` lists live connections first and changes
/// none in between, so that would be a broken invariant.
fn live_mut<'a>(entries: &'a mut HashMap<Arc<str>, Entry>, addr: &str) -> &'a mut Live {
    entries
        .get_mut(addr)
        .and_then(|e| e.live.as_mut())
        .expect("rebalance lists only live connections")
}

struct Entry {
    from_lookupd: bool,
    /// Set to a deadline to make the supervisor drain and stop.
    drain: watch::Sender<Option<Instant>>,
    retiring: bool,
    task: JoinHandle<()>,
    live: Option<Live>,
}

struct Live {
    conn: Arc<ConnHandle>,
    max_rdy: u32,
    rdy_sent: u32,
    /// What this connection may still have from nsqd: at least `rdy_sent`, and a lowered
    /// RDY's old value until `release_at`.
    rdy_held: u32,
    release_at: Option<Instant>,
}

pub(super) struct ControlTask {
    config: Arc<ConsumerConfig>,
    identify: Arc<Identify>,
    transport: Prepared,
    shared: Arc<ConsumerShared>,
    control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
    msg_tx: mpsc::UnboundedSender<Vec<Message>>,
    hard_stop: CancellationToken,
    entries: HashMap<Arc<str>, Entry>,
    backoff: Backoff,
    test_rotor: usize,
    rotation_offset: usize,
    last_rotation: Instant,
    lookup_in_progress: bool,
    /// The client for nsqlookupd queries; connections are kept alive between polls.
    http: HttpClient,
}

impl ControlTask {
    /// A control task for `config`, connecting to its static nsqd once it runs.
    pub(super) fn new(
        config: ConsumerConfig,
        transport: Prepared,
        shared: Arc<ConsumerShared>,
        control: (
            mpsc::UnboundedSender<Control>,
            mpsc::UnboundedReceiver<Control>,
        ),
        msg_tx: mpsc::UnboundedSender<Vec<Message>>,
        hard_stop: CancellationToken,
    ) -> Self {
        let (control_tx, control_rx) = control;
        let config_connect_timeout = config.connect_timeout;
        let backoff = Backoff::new(config.backoff_multiplier, config.max_backoff);
        let mut task = ControlTask {
            identify: Arc::new(config.identify()),
            transport,
            config: Arc::new(config),
            shared,
            control_tx,
            control_rx,
            msg_tx,
            hard_stop,
            entries: HashMap::new(),
            backoff,
            test_rotor: 0,
            rotation_offset: 0,
            last_rotation: Instant::now(),
            lookup_in_progress: false,
            http: HttpClient::new(&HttpClientConfig {
                connect_timeout: config_connect_timeout,
                request_timeout: config_connect_timeout,
                root_ca_file: None,
                max_idle_per_host: 2,
            })
            .expect("a client without a CA file always builds"),
        };
        for addr in task.config.nsqd_tcp_addresses.clone() {
            task.add(addr, true);
        }
        task
    }

    pub(super) async fn run(mut self) {
        let has_lookupd = !self.config.lookupd_http_addresses.is_empty();
        let mut next_lookup = Instant::now();
        let mut tick = tokio::time::interval(CONTROL_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A lowered RDY's budget is given on the moment it settles, not at the next tick:
            // a connection waiting for it (another's copies taken back while its own were
            // set aside) would otherwise get nothing for up to a tick.
            let release = self.next_release();
            tokio::select! {
                _ = self.hard_stop.cancelled() => break,
                msg = self.control_rx.recv() => {
                    let Some(msg) = msg else { break };
                    match msg {
                        Control::Shutdown { grace, done } => {
                            self.shutdown(grace, done);
                            return;
                        }
                        other => self.handle(other),
                    }
                }
                _ = tokio::time::sleep_until(next_lookup), if has_lookupd && !self.lookup_in_progress => {
                    self.spawn_lookup();
                    let jitter = self.config.lookupd_poll_jitter * (2.0 * random_unit() - 1.0);
                    next_lookup = Instant::now() + self.config.lookupd_poll_interval.mul_f64(1.0 + jitter);
                }
                _ = tick.tick() => self.on_tick(),
                _ = tokio::time::sleep_until(release.unwrap_or_else(Instant::now)), if release.is_some() => self.on_tick(),
            }
        }
        // Hard stop: supervisors watch the same token.
    }

    fn handle(&mut self, msg: Control) {
        match msg {
            Control::Up {
                addr,
                conn,
                max_rdy,
            } => {
                if let Some(entry) = self.entries.get_mut(&addr) {
                    entry.live = Some(Live {
                        conn,
                        max_rdy,
                        rdy_sent: 0,
                        rdy_held: 0,
                        release_at: None,
                    });
                    inc(&self.shared.counters.connections);
                }
                self.rebalance();
            }
            Control::Down { addr } => {
                let retiring = match self.entries.get_mut(&addr) {
                    Some(entry) => {
                        if entry.live.take().is_some() {
                            self.shared
                                .counters
                                .connections
                                .fetch_sub(1, Ordering::Relaxed);
                        }
                        entry.retiring
                    }
                    None => false,
                };
                if retiring {
                    self.entries.remove(&addr);
                }
                self.rebalance();
            }
            // RDY is set before `lowered` is dropped: its sender's answers come after it.
            Control::Backoff(signal, lowered) => {
                self.on_signal(signal);
                drop(lowered);
            }
            Control::Rebalance => {
                self.shared
                    .rebalance_pending
                    .store(false, Ordering::Release);
                self.rebalance();
            }
            Control::Lookup(results) => self.on_lookup(results),
            Control::Shutdown { .. } => unreachable!("handled in run"),
        }
    }

    fn add(&mut self, addr: String, is_static: bool) {
        let addr: Arc<str> = addr.into();
        if self.entries.contains_key(&addr) {
            return;
        }
        let (drain, drain_rx) = watch::channel(None);
        let supervisor = Supervisor {
            addr: addr.clone(),
            config: self.config.clone(),
            identify: self.identify.clone(),
            transport: self.transport.clone(),
            shared: self.shared.clone(),
            control: self.control_tx.clone(),
            messages: self.msg_tx.clone(),
            hard_stop: self.hard_stop.clone(),
            drain: drain_rx,
        };
        let task = tokio::spawn(supervisor.run());
        self.entries.insert(
            addr,
            Entry {
                from_lookupd: !is_static,
                drain,
                retiring: false,
                task,
                live: None,
            },
        );
    }

    fn spawn_lookup(&mut self) {
        self.lookup_in_progress = true;
        let addrs = self.config.lookupd_http_addresses.clone();
        let topic = self.config.topic.clone();
        let http = self.http.clone();
        let control = self.control_tx.clone();
        tokio::spawn(async move {
            let queries = addrs.into_iter().map(|addr| {
                let (topic, http) = (topic.clone(), http.clone());
                async move {
                    let result = lookupd::lookup(&http, &addr, &topic).await;
                    (addr, result)
                }
            });
            let results = futures::future::join_all(queries).await;
            let _ = control.send(Control::Lookup(results));
        });
    }

    fn on_lookup(&mut self, results: Vec<(String, Result<Vec<String>, Error>)>) {
        self.lookup_in_progress = false;
        let mut all_ok = true;
        let mut found = HashSet::new();
        for (lookupd, result) in results {
            match result {
                Ok(producers) => found.extend(producers),
                Err(error) => {
                    all_ok = false;
                    tracing::warn!(lookupd = %crate::redact::url(&lookupd), %error, "nsqlookupd query failed; keeping current connections.");
                    self.shared.event(ConsumerEvent::LookupdFailed {
                        addr: lookupd,
                        error: error.to_string(),
                    });
                }
            }
        }
        for addr in &found {
            if !self.entries.contains_key(addr.as_str()) {
                tracing::info!(nsqd = %addr, "Discovered nsqd through nsqlookupd.");
                self.shared
                    .event(ConsumerEvent::NsqdDiscovered { addr: addr.clone() });
                self.add(addr.clone(), false);
            }
        }
        // Only a complete answer can prove an nsqd is gone.
        if all_ok {
            let deadline = Instant::now() + self.config.removal_grace;
            for (addr, entry) in self.entries.iter_mut() {
                if entry.from_lookupd && !entry.retiring && !found.contains(&**addr) {
                    tracing::info!(nsqd = %addr, "nsqd vanished from nsqlookupd; draining its connection.");
                    self.shared.event(ConsumerEvent::NsqdRemoved {
                        addr: addr.to_string(),
                    });
                    entry.retiring = true;
                    let _ = entry.drain.send(Some(deadline));
                }
            }
            // Entries with no live connection retire at once.
            self.entries
                .retain(|_, e| !(e.retiring && e.live.is_none() && e.task.is_finished()));
        }
        self.rebalance();
    }

    /// Applies a message's outcome to the backoff, says what changed, and sets RDY.
    fn on_signal(&mut self, signal: Signal) {
        let Some(change) = self.backoff.on(signal, Instant::now()) else {
            return;
        };
        let shared = &self.shared;
        shared
            .backoff_active
            .store(self.backoff.handler_active(), Ordering::Relaxed);
        shared
            .outage_active
            .store(self.backoff.outage_active(), Ordering::Relaxed);
        match change {
            Change::Paused {
                signal,
                level,
                delay,
            } => {
                let delay_ms = delay.as_millis() as u64;
                match signal {
                    Signal::HandlerSucceeded => {
                        tracing::info!(level, delay_ms, "Handler succeeded; easing backoff.");
                        shared.event(ConsumerEvent::BackoffEased { level, delay });
                    }
                    Signal::HandlerFailed => {
                        tracing::warn!(level, delay_ms, "Handler failed; backing off.");
                        shared.event(ConsumerEvent::BackoffStarted { level, delay });
                    }
                    Signal::Outage | Signal::OutageOver => {
                        tracing::warn!(level, delay_ms, "Requeued for an outage; backing off: RDY 0, then one message tests it.");
                        shared.event(ConsumerEvent::OutageBackoff { level, delay });
                    }
                }
            }
            Change::Ended { signal, resumed } => {
                if signal == Signal::OutageOver {
                    // The caller says at INFO what answers again; this is its consequence.
                    tracing::debug!(resumed, "Outage over; restoring RDY.");
                    shared.event(ConsumerEvent::OutageEnded);
                } else {
                    tracing::info!("Handler backoff ended; restoring RDY.");
                }
                if resumed {
                    shared.event(ConsumerEvent::BackoffEnded);
                }
            }
        }
        self.rebalance();
    }

    /// When the first lowered RDY still counted at its old value settles.
    fn next_release(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.live.as_ref()?.release_at)
            .min()
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        for entry in self.entries.values_mut() {
            if let Some(live) = entry.live.as_mut() {
                if live.release_at.is_some_and(|t| t <= now) {
                    live.rdy_held = live.rdy_sent;
                    live.release_at = None;
                }
            }
        }
        if self.backoff.tick(now) {
            self.test_rotor = self.test_rotor.wrapping_add(1);
        }
        if now.duration_since(self.last_rotation) >= self.config.rdy_redistribute_interval {
            self.last_rotation = now;
            self.rotation_offset = self
                .rotation_offset
                .wrapping_add(self.config.max_in_flight as usize);
            // The test phase waits for a message on one connection; if that nsqd has nothing
            // queued, none would ever come. Move the test RDY on, as go-nsq's redistribution
            // does, so that an idle nsqd cannot stall the consumer.
            if self.backoff.phase() == BackoffPhase::Testing {
                self.test_rotor = self.test_rotor.wrapping_add(1);
            }
        }
        self.rebalance();
    }

    /// Computes each live connection's RDY target and sends the changes: decreases first,
    /// then increases only as far as the budget (`max_in_flight` minus what every connection
    /// may still hold) allows. Out of backoff, messages set aside (`Message::park`) do not
    /// count: each connection's target and the budget grow by as many as it has set aside.
    fn rebalance(&mut self) {
        let parked = |l: &Live| match self.backoff.phase() {
            BackoffPhase::Normal => l.conn.parked(),
            _ => 0,
        };
        let parked_total: u32 = self
            .entries
            .values()
            .filter_map(|e| e.live.as_ref())
            .map(parked)
            .fold(0u32, u32::saturating_add);
        let max = self.config.max_in_flight.saturating_add(parked_total);
        let mut live: Vec<(Arc<str>, bool)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.live.is_some())
            .map(|(a, e)| (a.clone(), e.retiring))
            .collect();
        live.sort();
        let active: Vec<&Arc<str>> = live.iter().filter(|(_, r)| !r).map(|(a, _)| a).collect();
        let targets: HashMap<Arc<str>, u32> = rdy::targets(
            self.config.max_in_flight,
            active.len(),
            self.backoff.phase(),
            self.test_rotor,
            self.rotation_offset,
        )
        .into_iter()
        .enumerate()
        .filter(|&(_, target)| target > 0)
        .map(|(i, target)| {
            let aside = self.entries[active[i]].live.as_ref().map_or(0, parked);
            (active[i].clone(), target.saturating_add(aside))
        })
        .collect();
        let now = Instant::now();
        // Decreases first.
        for (addr, _) in &live {
            let live = live_mut(&mut self.entries, addr);
            let target = targets.get(addr).copied().unwrap_or(0).min(live.max_rdy);
            if target < live.rdy_sent {
                let _ = live.conn.send(Command::Rdy(target));
                live.rdy_sent = target;
                live.release_at = Some(now + RDY_SETTLE);
            }
        }
        let holding = |l: &Live| l.rdy_held.max(l.rdy_sent).max(l.conn.in_flight() as u32);
        let mut used: u64 = live
            .iter()
            .filter_map(|(a, _)| self.entries[a].live.as_ref())
            .map(|l| u64::from(holding(l)))
            .sum();
        for (addr, _) in &live {
            let live = live_mut(&mut self.entries, addr);
            let target = targets.get(addr).copied().unwrap_or(0).min(live.max_rdy);
            if target > live.rdy_sent {
                let old = u64::from(holding(live));
                let others = used - old;
                let grant = rdy::grant(target, max, others);
                if grant > live.rdy_sent {
                    let _ = live.conn.send(Command::Rdy(grant));
                    live.rdy_sent = grant;
                    live.rdy_held = live.rdy_held.max(grant);
                    used = others + u64::from(holding(live));
                }
            }
        }
        let total: u64 = live
            .iter()
            .filter_map(|(a, _)| self.entries[a].live.as_ref())
            .map(|l| u64::from(l.rdy_sent))
            .sum();
        self.shared
            .counters
            .rdy_total
            .store(total, Ordering::Relaxed);
    }

    fn shutdown(self, grace: Duration, done: oneshot::Sender<ShutdownReport>) {
        let deadline = Instant::now() + grace;
        let mut tasks = Vec::new();
        // Keep the drain senders alive until the supervisors finish: a dropped sender reads as
        // "the control task is gone".
        let mut drains = Vec::new();
        for (_, entry) in self.entries {
            let _ = entry.drain.send(Some(deadline));
            tasks.push(entry.task);
            drains.push(entry.drain);
        }
        let shared = self.shared;
        drop(self.msg_tx);
        tokio::spawn(async move {
            let all = futures::future::join_all(tasks);
            let clean = tokio::time::timeout(grace + Duration::from_secs(1), all)
                .await
                .is_ok();
            let requeued_at_deadline =
                shared.counters.requeued_at_deadline.load(Ordering::Relaxed) as usize;
            drop(drains);
            let _ = done.send(ShutdownReport {
                requeued_unseen: 0,
                requeued_at_deadline,
                clean,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::connection::Outgoing;
    use crate::nsq::refusal::Role;

    /// A connection's handle and what is sent to it.
    type Recorded = (Arc<ConnHandle>, mpsc::UnboundedReceiver<Outgoing>);

    /// A control task with `max_in_flight` over two live connections, `a` and `b`, that
    /// record what is sent to them.
    fn two_connections(max_in_flight: u32) -> (ControlTask, [Recorded; 2]) {
        let mut config = ConsumerConfig::new("t", "c");
        config.max_in_flight = max_in_flight;
        let transport = config.transport.prepare_for(Role::Consumer).unwrap();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(ConsumerShared::new(&config, control_tx.clone()));
        let (msg_tx, _) = mpsc::unbounded_channel();
        let control = (control_tx, control_rx);
        let mut task = ControlTask::new(
            config,
            transport,
            shared,
            control,
            msg_tx,
            CancellationToken::new(),
        );
        let conns = ["a", "b"].map(|addr| {
            let (conn, commands) = ConnHandle::for_test(addr);
            let live = Live {
                conn: conn.clone(),
                max_rdy: 2500,
                rdy_sent: 0,
                rdy_held: 0,
                release_at: None,
            };
            let entry = Entry {
                from_lookupd: false,
                drain: watch::channel(None).0,
                retiring: false,
                task: tokio::spawn(async {}),
                live: Some(live),
            };
            task.entries.insert(addr.into(), entry);
            (conn, commands)
        });
        (task, conns)
    }

    /// The RDY counts sent to a connection since the last call.
    fn rdys(commands: &mut mpsc::UnboundedReceiver<Outgoing>) -> Vec<u32> {
        std::iter::from_fn(|| commands.try_recv().ok())
            .filter_map(|sent| match sent {
                Outgoing::One(Command::Rdy(count)) => Some(count),
                _ => None,
            })
            .collect()
    }

    /// Lets the control task run what is ready, without moving the (paused) clock.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Copies taken back on one connection while others are set aside on the other (two
    /// replicated nsqd): the second one's raise waits for the first one's lower RDY to settle,
    /// and no longer.
    #[tokio::test(start_paused = true)]
    async fn a_raise_waiting_for_a_lowered_rdy_comes_as_it_settles() {
        let (task, [(a, mut to_a), (b, mut to_b)]) = two_connections(2);
        let control = task.control_tx.clone();
        let running = tokio::spawn(task.run());
        settle().await;
        assert_eq!((rdys(&mut to_a), rdys(&mut to_b)), (vec![1], vec![1]));
        a.park(true);
        control.send(Control::Rebalance).unwrap();
        settle().await;
        assert_eq!(rdys(&mut to_a), [2], "a copy set aside raises its RDY");
        // Between two of the control task's ticks, its copy is taken back as one arrives on b.
        tokio::time::advance(CONTROL_TICK / 3).await;
        a.park(false);
        b.park(true);
        control.send(Control::Rebalance).unwrap();
        settle().await;
        assert_eq!(rdys(&mut to_a), [1]);
        assert_eq!(rdys(&mut to_b), [0u32; 0], "a's old RDY still counts");
        // A millisecond at a time, as the clock runs.
        for _ in 0..=RDY_SETTLE.as_millis() {
            tokio::time::advance(Duration::from_millis(1)).await;
            settle().await;
        }
        assert_eq!(rdys(&mut to_b), [2], "raised once a's lower RDY settled");
        running.abort();
    }
}
