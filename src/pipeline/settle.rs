//! Settles claims once the handler answered: the claims of delivered records are committed
//! and those of failed ones erased ([`Dedupe::settle`]); the writes the store failed are kept
//! and sent again before the next burst's claims ([`Dedupe::settle_unsettled`]).

use std::time::Instant;

use super::{Dedupe, Record};
use crate::dedup::{Digest, Store};
use crate::error::StoreError;
use crate::metrics::inc;
use crate::sink::{Handler, HandlerError};

impl<S: Store, H: Handler> Dedupe<S, H> {
    /// Commits the claims of the delivered records and erases those of the failed ones
    /// (before the REQ, so the retry is not taken for a copy), all at once. `handled` is when
    /// the handler answered. A handler whose accepted message is final had its records
    /// claimed done: nothing to commit.
    pub(super) async fn settle(
        &self,
        records: &[Record],
        results: &[Result<(), HandlerError>],
        handled: Instant,
    ) {
        let metrics = &*self.inner.metrics;
        let claimed_done = self.inner.handler.accepts_for_good();
        let committed: Vec<Digest> = records
            .iter()
            .zip(results)
            .filter(|(_, result)| result.is_ok() && !claimed_done)
            .filter_map(|(record, _)| record.digest)
            .collect();
        let erased: Vec<Digest> = records
            .iter()
            .zip(results)
            .filter(|(_, result)| result.is_err())
            .filter_map(|(record, _)| record.digest)
            .collect();
        let (commits, erases) =
            futures::future::join(self.commit_all(&committed), self.erase_all(&erased)).await;
        if !committed.is_empty() || !erased.is_empty() {
            let ok = commits.iter().chain(&erases).all(Result::is_ok);
            metrics.store_answered(handled.elapsed(), ok);
            if !ok {
                self.keep_unsettled(&committed, &commits, &erased, &erases);
            }
        }
        for result in commits {
            // Delivered all the same: a later copy may be delivered again, but this message
            // is done.
            if let Err(error) = result {
                self.store_error("commit", &error);
            }
        }
        for result in erases {
            match result {
                Ok(true) => inc(&metrics.erased),
                Ok(false) => {}
                Err(error) => self.store_error("erase", &error),
            }
        }
    }

    /// Keeps the commits and erases that failed with a store error, to send them again with
    /// the next burst (see `unsettled`).
    pub(super) fn keep_unsettled(
        &self,
        committed: &[Digest],
        commits: &[Result<bool, StoreError>],
        erased: &[Digest],
        erases: &[Result<bool, StoreError>],
    ) {
        let failed = |digests: &[Digest], answers: &[Result<bool, StoreError>]| -> Vec<Digest> {
            digests
                .iter()
                .zip(answers)
                .filter(|(_, answer)| answer.is_err())
                .map(|(digest, _)| *digest)
                .collect()
        };
        self.inner
            .unsettled
            .keep(&failed(committed, commits), &failed(erased, erases));
    }

    /// Sends again the commits and erases the store failed before; those that fail again are
    /// kept for the next burst. Their errors were counted when they first failed.
    pub(super) async fn settle_unsettled(&self) {
        let writes = self.inner.unsettled.take();
        if writes.is_empty() {
            return;
        }
        let (commits, erases) = futures::future::join(
            self.commit_all(&writes.commits),
            self.erase_all(&writes.erases),
        )
        .await;
        self.keep_unsettled(&writes.commits, &commits, &writes.erases, &erases);
        tracing::debug!(
            commits = writes.commits.len(),
            erases = writes.erases.len(),
            still_unsettled = self.inner.unsettled.len(),
            "Sent failed store writes again."
        );
    }

    /// Commits each digest; the results are in the order of `digests`.
    async fn commit_all(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        if digests.is_empty() {
            return Vec::new();
        }
        self.inner.store.commit_many(digests).await
    }

    /// Erases each digest; the results are in the order of `digests`.
    pub(super) async fn erase_all(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        if digests.is_empty() {
            return Vec::new();
        }
        self.inner.store.erase_many(digests).await
    }
}
