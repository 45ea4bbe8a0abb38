//! Saves the in-process table to its file: a snapshot every `store.snapshot_interval` (sooner
//! when the journal fills), and the last one when the sidecar stops.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::dedup::backend::Backend;
use crate::dedup::table_file::{SaveReport, TableFile};
use crate::pipeline::Dedupe;
use crate::sink::Handler;

/// Writes a snapshot of the in-process table every `every` until `stop`.
pub(super) async fn snapshot_loop<H: Handler>(
    file: Arc<TableFile>,
    dedupe: Dedupe<Backend, H>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let journal = match dedupe.store() {
        Backend::Journalled(_, journal) => Some(journal.clone()),
        _ => None,
    };
    let mut unjournalled = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // The journal's half is half full: a snapshot now starts an empty one.
            () = async {
                match &journal {
                    Some(journal) => journal.wants_snapshot().await,
                    None => std::future::pending().await,
                }
            } => tick.reset(),
            _ = stop.cancelled() => return,
        }
        if let Some(journal) = &journal {
            let now = journal.unjournalled();
            if now > unjournalled {
                tracing::warn!(
                    journal = %journal.path().display(),
                    unjournalled = now - unjournalled,
                    "Commits found the journal full (snapshots fall behind or fail); a kill -9 before the next snapshot forgets them."
                );
                unjournalled = now;
            }
        }
        match save_snapshot(file.clone(), dedupe.clone()).await {
            Ok(report) => {
                tracing::debug!(table_file = %file.path().display(), bytes = report.bytes, took = ?report.took, "Table snapshot written.");
            }
            // The previous snapshot is still in place; the next tick tries again.
            Err(error) => tracing::warn!(%error, "Writing the table snapshot failed."),
        }
    }
}

/// Writes one snapshot on a blocking thread (it is a few hundred megabytes at most, written
/// sequentially).
pub(super) async fn save_snapshot<H: Handler>(
    file: Arc<TableFile>,
    dedupe: Dedupe<Backend, H>,
) -> Result<SaveReport, RunError> {
    tokio::task::spawn_blocking(move || match dedupe.store() {
        // The table cannot take a new generation while it is written (see `LocalTable`).
        Backend::Memory(table) => table.with(|t| file.save(t)).map_err(RunError::from),
        Backend::Journalled(table, journal) => table
            .with(|t| journal.save(&file, t))
            .map_err(RunError::from),
        _ => unreachable!("a table file goes with the in-process table"),
    })
    .await
    .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))
}
