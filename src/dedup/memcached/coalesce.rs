//! The coalescer: single operations that arrive while earlier pipelines are on the wire are
//! sent together in the next one.

use tokio::sync::{mpsc, oneshot};

use super::set::{Op, Outcome};
use super::{Inner, MemcachedStore};
use crate::dedup::Digest;
use crate::error::StoreError;

/// One single operation waiting for the coalescer.
pub(super) struct Request {
    pub(super) op: Op,
    pub(super) digest: Digest,
    /// The caller waits on the other end; if it gave up, the answer is dropped.
    pub(super) reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

/// The most operations one coalesced pipeline carries.
const MAX_COALESCED: usize = 512;

/// Collects single operations that arrive while earlier pipelines are on the wire and sends
/// them together: up to `slots` pipelines at once, each with whatever queued up meanwhile.
///
/// Holds only a weak reference to the store, so it ends when the last handle is dropped
/// (the queue's sender lives in the store).
pub(super) async fn coalesce(
    inner: std::sync::Weak<Inner>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    slots: usize,
) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(slots));
    loop {
        // Wait for a free pipeline first, so that requests queue up into bigger batches while
        // all pipelines are busy.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = requests.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_COALESCED {
            match requests.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let store = MemcachedStore { inner };
        tokio::spawn(async move {
            let ops: Vec<(Op, Digest)> = batch.iter().map(|r| (r.op, r.digest)).collect();
            let outcomes = store.run_ops(&ops).await;
            for (request, outcome) in batch.into_iter().zip(outcomes) {
                let _ = request.reply.send(outcome);
            }
            drop(slot);
        });
    }
}

pub(super) fn coalescer_gone() -> StoreError {
    StoreError::Unavailable {
        addr: "(coalescer)".into(),
        detail: "the task that batches operations stopped before answering, most likely because \
                 the tokio runtime it ran on shut down; the next operation starts a new one"
            .into(),
    }
}
