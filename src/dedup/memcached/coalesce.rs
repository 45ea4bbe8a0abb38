//! The coalescer: single operations that arrive while earlier pipelines are on the wire are
//! sent together in the next one ([`MemcachedStore::update`] queues them).

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::set::{Op, Outcome};
use super::{Inner, MemcachedStore};
use crate::dedup::Digest;
use crate::error::StoreError;

impl MemcachedStore {
    /// Applies `op` to the set of `digest`: through the coalescer if it is on, else in a
    /// pipeline of its own.
    pub(super) async fn update(&self, digest: Digest, op: Op) -> Result<Outcome, StoreError> {
        match self.coalescer() {
            Some(queue) => {
                let (reply, answer) = oneshot::channel();
                if queue.send(Request { op, digest, reply }).is_err() {
                    return Err(coalescer_gone());
                }
                // The batch's own steps are time-limited; this bounds the wait for a free
                // pipeline too.
                let limit = self.operation_limit();
                match tokio::time::timeout(limit, answer).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(coalescer_gone()),
                    Err(_) => Err(StoreError::Timeout(limit)),
                }
            }
            None => self
                .run_ops(&[(op, digest)])
                .await
                .pop()
                .unwrap_or_else(|| {
                    Err(StoreError::Protocol("an operation went unanswered".into()))
                }),
        }
    }

    /// The longest one operation may take: a connect plus a read and a write per attempt.
    fn operation_limit(&self) -> Duration {
        let config = &self.inner.config;
        let steps = config.max_cas_retries.saturating_mul(2).saturating_add(1);
        config.timeout.saturating_mul(steps)
    }

    /// The queue of the task that coalesces concurrent single operations into pipelines, or
    /// `None` if coalescing is off or we are not inside a tokio runtime.
    ///
    /// The task starts on first use, on the current runtime. If that runtime has shut down
    /// since (the task is gone), a new task starts on the current one.
    fn coalescer(&self) -> Option<mpsc::UnboundedSender<Request>> {
        if !self.inner.config.coalesce {
            return None;
        }
        // A `std` mutex: held only to clone or replace the sender, never across an `.await`;
        // a panic cannot leave the `Option` half-written, so a poisoned lock is still usable.
        let mut slot = self
            .inner
            .coalescer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match &*slot {
            Some(queue) if !queue.is_closed() => Some(queue.clone()),
            previous => {
                let handle = tokio::runtime::Handle::try_current().ok()?;
                if previous.is_some() {
                    // The old task's runtime is gone, and with it the I/O driver that idle
                    // connections were registered with: they would fail on first use.
                    for server in &self.inner.servers {
                        server.pipes.clear();
                    }
                }
                let (queue, requests) = mpsc::unbounded_channel();
                let inner = std::sync::Arc::downgrade(&self.inner);
                handle.spawn(coalesce(inner, requests, self.inner.config.pool_size));
                *slot = Some(queue.clone());
                Some(queue)
            }
        }
    }
}

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
