//! Shares this consumer's distinct count with the other consumers of a shared store, for the
//! fleet's rate on the metrics page.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::dedup::backend::Backend;
use crate::dedup::fleet::{FleetCounters, FLEET_BUCKETS};
use crate::metrics::Metrics;

/// Starts [`fleet_loop`] for a shared store; the other stores have no fleet.
pub(super) fn spawn(store: &Backend, metrics: &Arc<Metrics>, stop: &CancellationToken) {
    match store {
        Backend::Memcached(store, _) => {
            tokio::spawn(fleet_loop(store.clone(), metrics.clone(), stop.clone()));
        }
        Backend::Redis(store, _) => {
            tokio::spawn(fleet_loop(store.clone(), metrics.clone(), stop.clone()));
        }
        _ => {}
    }
}

/// Shares this consumer's distinct count with the others of the shared store once per
/// `store.fleet_interval`, in the middle of each bucket, and records the fleet's rate once the
/// counters cover whole buckets of this consumer's.
async fn fleet_loop(
    store: impl FleetCounters + 'static,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut shared = metrics.distinct();
    let mut shares = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(store.until_next_share()) => {}
            _ = stop.cancelled() => return,
        }
        let now = metrics.distinct();
        match store.share_distinct(now - shared).await {
            Ok(rate) => {
                shared = now;
                shares += 1;
                // The first buckets read were written before this consumer counted in them.
                if shares > FLEET_BUCKETS {
                    metrics.rates.note_fleet(std::time::Instant::now(), rate);
                }
            }
            // Added to the next share instead.
            Err(error) => tracing::debug!(%error, "Sharing the distinct count failed."),
        }
    }
}
