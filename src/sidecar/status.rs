//! The status line: the counters logged every `status_interval` and once at the end, with a
//! warning when the table is too small for the recent rate; and the table's view the status
//! line and the metrics page read.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::dedup::backend::Backend;
use crate::metrics::{get, TableView};
use crate::pipeline::Dedupe;
use crate::sink::Handler;
use crate::Store;

/// The window the table was sized for, and the catch probability it should keep.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target {
    pub(super) window: Duration,
    pub(super) probability: f64,
    /// Whether the user gave the probability (`store.probability`); else it is the default,
    /// and the warning says so rather than name a target nobody set.
    pub(super) given: bool,
    /// Whether the table sizes itself (`store.probability` without `store.rate`): it grows,
    /// and warns itself when it cannot, so the status line names no remedy.
    pub(super) sizes_itself: bool,
}

/// What the store says of its table now, for the status line and the metrics page.
pub(super) fn table_view(store: &Backend, target: Target) -> TableView {
    TableView {
        geometry: store.geometry(),
        occupancy: store.occupancy(),
        resizing: store.resizing(),
        near: store.near_stats(),
        window: target.window,
        target: target.probability,
        ejections: store.ejections(),
        cluster_retries: store.cluster_retries(),
    }
}

/// Keeps the nsqd connection gauge current (every second) and logs the status line every
/// `every`.
pub(super) async fn status_loop<H: Handler>(
    dedupe: Dedupe<Backend, H>,
    connections: crate::nsq::ConnectionCount,
    every: Duration,
    target: Target,
    stop: CancellationToken,
) {
    let metrics = dedupe.metrics().clone();
    let gauge = |count: &crate::nsq::ConnectionCount| {
        metrics
            .nsqd_connections
            .store(count.get(), std::sync::atomic::Ordering::Relaxed);
    };
    let mut status = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut refresh = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = refresh.tick() => {
                gauge(&connections);
                metrics.sample_rate();
            }
            _ = status.tick() => {
                gauge(&connections);
                log_status(&dedupe, target, "Status.");
            }
        }
    }
}

/// Logs the counters as `what`, and warns when the table is too small for the recent rate.
pub(super) fn log_status<H: Handler>(dedupe: &Dedupe<Backend, H>, target: Target, what: &str) {
    let m = dedupe.metrics();
    let view = table_view(dedupe.store(), target);
    tracing::info!(
        nsqd_connections = get(&m.nsqd_connections),
        received = m.received_total(),
        rate = format_args!("{:.1}", m.received_rate()),
        unique = get(&m.unique),
        duplicates = get(&m.duplicates),
        in_flight_requeues = get(&m.in_flight_requeues),
        copies_held = get(&m.copies_held),
        deferred_copies = get(&m.deferred_copies),
        handler_requeues = get(&m.handler_requeues),
        keyless = get(&m.keyless),
        failures = get(&m.handler_failures),
        dead_lettered = get(&m.dead_lettered),
        store_errors = get(&m.store_errors),
        occupancy = view.occupancy.map(|o| format!("{o:.4}")),
        previous_slots = view.resizing.flatten().map(|r| r.previous_slots),
        previous_inserts_left = view.resizing.flatten().map(|r| r.inserts_left),
        previous_seconds_left = view.resizing.flatten().and_then(|r| r.seconds_left),
        distinct_rate = format_args!("{:.1}", m.distinct_rate()),
        distinct_rate_peak = format_args!("{:.1}", m.distinct_rate_peak()),
        catch_probability = m.catch_probability(&view).map(|p| format!("{p:.6}")),
        "{what}"
    );
    let (Some(small), Some(geometry)) = (m.too_small(&view), view.geometry) else {
        return;
    };
    if target.sizes_itself {
        return;
    }
    if let Backend::Memory(table) | Backend::Journalled(table, _) = dedupe.store() {
        if table.is_growable() {
            // It grows for the rate it meets, and warns itself when it cannot (`grow`).
            return;
        }
    }
    let (window, probability) = (target.window, target.probability);
    let below = if target.given {
        format!("the target {probability}")
    } else {
        format!("the default target {probability} (no --probability was given)")
    };
    let (buckets, ways) = (small.suggested.slots(), geometry.ways());
    let remedy = match dedupe.store() {
        // Whole MiB, rounded up, so the flag's value is at least the size.
        Backend::Memory(_) | Backend::Journalled(..) => format!(
            "--buckets {buckets} or --memory {}MiB (with --ways {ways}) would meet it, or \
             --probability {probability} --window {} with no --rate, --buckets or --memory lets \
             the table size itself (a restart at a new size keeps what the table holds only with \
             --table-file)",
            small.suggested.memory_bytes().div_ceil(1 << 20),
            crate::units::format_duration(window),
        ),
        Backend::None(_) => return,
        shared => {
            let remedy = resize_remedy(&shared.namespace().unwrap_or_default(), buckets, ways);
            match view.resizing.flatten() {
                // A second resize now would forget the size still read: wait for it.
                Some(previous) => format!(
                    "a resize is under way (the previous size, {} buckets, is still read{}): \
                     once it is no longer read, {remedy}",
                    previous.previous_slots,
                    previous.seconds_left.map_or_else(String::new, |s| format!(
                        " for another {}",
                        crate::units::format_duration(std::time::Duration::from_secs(s))
                    )),
                ),
                None => remedy,
            }
        }
    };
    let whose = if m.rates.fleet().is_some() {
        "the fleet's count"
    } else {
        "this consumer's count"
    };
    let uptime = m.uptime();
    let over = if uptime < window {
        format!("since the start {} ago", format_span(uptime))
    } else {
        format!("in the last {}", crate::units::format_duration(window))
    };
    let count = small.rate * window.as_secs_f64();
    tracing::warn!(
        catch_probability = format_args!("{:.6}", small.probability),
        target = probability,
        target_given = target.given,
        window_distinct = format_args!("{count:.0}"),
        window = %crate::units::format_duration(window),
        buckets = geometry.slots(),
        suggested_buckets = buckets,
        "The table is too small for its window: after the {count:.0} distinct messages {over} \
         ({whose}), a copy one window ({}) late is caught with probability {:.4}, below \
         {below}; {remedy}.",
        crate::units::format_duration(window),
        small.probability,
    );
}

/// A rate's span in whole seconds (at least one), as the too-small warning says it.
fn format_span(span: std::time::Duration) -> String {
    crate::units::format_duration(std::time::Duration::from_secs(
        span.as_secs_f64().round().max(1.0) as u64,
    ))
}

/// The `resize` command that would give a shared table of `namespace` `buckets` slots.
fn resize_remedy(namespace: &str, buckets: u64, ways: u32) -> String {
    format!(
        "`nsq-dedupe resize --namespace {namespace} --buckets {buckets}` (with --ways {ways} and \
         the store's flags) resizes the table of every consumer to meet it, without forgetting \
         what it holds"
    )
}
