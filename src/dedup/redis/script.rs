//! The set script's runs: a burst's digests sent to `set.lua` in runs of at most
//! [`MAX_RUN`], one `EVALSHA` each (standalone, in their order; in a cluster, one run per
//! master, or per set when its node refuses a run over several), the path of every operation
//! on a server without `SET … IFEQ`, and of whatever the other paths leave to it.

use std::sync::atomic::Ordering;

use futures::future::join_all;

use super::slots::key_slot;
use super::{Op, RedisStore};
use crate::dedup::shared::{now_ms, value_version};
use crate::dedup::{Digest, Geometry};
use crate::error::StoreError;

/// A digest of a script run, and the slot its entry was claimed in when known (a hint).
pub(super) type Target = (Digest, Option<u8>);

/// The most digests one script run decides: a run blocks the server while it runs (about a
/// microsecond a digest), so a huge burst goes in several runs, pipelined.
const MAX_RUN: usize = 256;

/// The indices of `digests` grouped by their set of `geometry`, in order of first appearance.
fn runs_by_set(geometry: Geometry, digests: &[Digest]) -> Vec<Vec<usize>> {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut run_of: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (i, &digest) in digests.iter().enumerate() {
        let run = *run_of.entry(geometry.set_of(digest)).or_insert_with(|| {
            runs.push(Vec::new());
            runs.len() - 1
        });
        runs[run].push(i);
    }
    runs
}

impl RedisStore {
    /// Runs the script for `op` on every digest, each with the slot of its entry when known
    /// (a hint, see `hints`); the answers are in the order of `digests`.
    ///
    /// The digests go in runs of at most [`MAX_RUN`], one script run each: standalone, in
    /// their order; in a cluster, grouped by the master of their set's slot (see the module
    /// docs). The runs go out together on the multiplexed connections, each within the time
    /// limit; a run that fails fails each of its digests, and wrote nothing.
    pub(super) async fn update_many(
        &self,
        op: Op,
        digests: &[Target],
    ) -> Vec<Result<i64, StoreError>> {
        let answers = self.update_runs(op, digests).await;
        if answers.iter().any(|answer| {
            matches!(
                answer,
                Err(StoreError::Unavailable { .. } | StoreError::Timeout(_))
            )
        }) {
            // The server may have restarted empty or been replaced: its entries may be gone.
            self.inner.hints.forget_all();
            self.inner.ifeq.forget_all();
        }
        answers
    }

    /// [`RedisStore::update_many`]'s runs.
    async fn update_runs(&self, op: Op, digests: &[Target]) -> Vec<Result<i64, StoreError>> {
        let inner = &*self.inner;
        let now = now_ms();
        if digests.is_empty() {
            return Vec::new();
        }
        if !inner.config.cluster && digests.len() <= MAX_RUN {
            // The common case: one run, whose answers are in order.
            return match self.run_script(op, now, digests.iter().copied()).await {
                Ok(codes) => codes.into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error); digests.len()],
            };
        }
        let runs = self.runs(digests.len(), |i| digests[i].0);
        let answers = join_all(
            runs.iter()
                .map(|run| self.run_or_split(op, now, digests, run)),
        )
        .await;
        let mut out: Vec<Option<Result<i64, StoreError>>> = Vec::new();
        out.resize_with(digests.len(), || None);
        for (run, answer) in runs.iter().zip(answers) {
            for (&i, code) in run.iter().zip(answer) {
                out[i] = Some(code);
            }
        }
        out.into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::Protocol(
                        "a digest was left out of every run".into(),
                    ))
                })
            })
            .collect()
    }

    /// The indices `0..count` of digests (`digest(i)` the `i`th) in runs of at most
    /// [`MAX_RUN`]: standalone, in their order; in a cluster, grouped by the master of the
    /// slot of their key (their set's, or in the compact layout their item's) in the slot map
    /// as last read (in order of first appearance).
    pub(super) fn runs(&self, count: usize, digest: impl Fn(usize) -> Digest) -> Vec<Vec<usize>> {
        let inner = &*self.inner;
        let mut key = String::with_capacity(inner.namespace.len() + 21);
        self.runs_by_slot(count, |i| {
            let set = inner.geometry.set_of(digest(i));
            self.write_key(&mut key, inner.layout.key_of(set));
            key_slot(key.as_bytes())
        })
    }

    /// The indices `0..count` in runs of at most [`MAX_RUN`]: standalone, in their order; in
    /// a cluster, grouped by the master of slot `slot(i)` in the slot map as last read (in
    /// order of first appearance). `slot` is asked only in a cluster.
    pub(super) fn runs_by_slot(
        &self,
        count: usize,
        mut slot: impl FnMut(usize) -> u16,
    ) -> Vec<Vec<usize>> {
        let inner = &*self.inner;
        let mut groups: Vec<(Option<String>, Vec<usize>)> = Vec::new();
        if inner.config.cluster {
            for i in 0..count {
                let master = inner.link.master_of(slot(i));
                match groups.iter_mut().find(|(m, _)| *m == master) {
                    Some((_, group)) => group.push(i),
                    None => groups.push((master, vec![i])),
                }
            }
        } else {
            groups.push((None, (0..count).collect()));
        }
        groups
            .into_iter()
            .flat_map(|(_, group)| {
                group
                    .chunks(MAX_RUN)
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// One script run of the digests at `run`; in a cluster, a run over several sets that
    /// its node refused (a key of a slot it no longer serves, or one being migrated) is sent
    /// again as one run per set, which follows `MOVED` and `ASK` as any command does. The
    /// answers are in the order of `run`.
    async fn run_or_split(
        &self,
        op: Op,
        now: u64,
        digests: &[Target],
        run: &[usize],
    ) -> Vec<Result<i64, StoreError>> {
        let error = match self
            .run_script(op, now, run.iter().map(|&i| digests[i]))
            .await
        {
            Ok(codes) => return codes.into_iter().map(Ok).collect(),
            Err(error) => error,
        };
        let sets = runs_by_set(
            self.inner.geometry,
            &run.iter().map(|&i| digests[i].0).collect::<Vec<_>>(),
        );
        // Only an answer of the node: a node that did not answer would not answer the
        // runs per set either, and waiting for each would hold the burst up.
        if !self.inner.config.cluster || sets.len() < 2 || !matches!(error, StoreError::Protocol(_))
        {
            return vec![Err(error); run.len()];
        }
        self.inner.link.mark_stale();
        let answers = join_all(
            sets.iter()
                .map(|set| self.run_script(op, now, set.iter().map(|&j| digests[run[j]]))),
        )
        .await;
        let mut out: Vec<Result<i64, StoreError>> = vec![Err(error); run.len()];
        for (set, answer) in sets.iter().zip(answers) {
            match answer {
                Ok(codes) => {
                    for (&j, code) in set.iter().zip(codes) {
                        out[j] = Ok(code);
                    }
                }
                Err(error) => {
                    for &j in set {
                        out[j] = Err(error.clone());
                    }
                }
            }
        }
        out
    }

    /// One `EVALSHA` of the script for `op` on `digests`, on the node of their slot (in a
    /// cluster, all of one set), within the time limit.
    async fn run_script(
        &self,
        op: Op,
        now: u64,
        digests: impl ExactSizeIterator<Item = Target> + Clone,
    ) -> Result<Vec<i64>, StoreError> {
        let inner = &*self.inner;
        let count = digests.len();
        // Per digest: its key (the namespace and a set number) and its 16 or 17 bytes; and 11
        // arguments of at most 20 bytes around them.
        let mut evalsha =
            redis::Cmd::with_capacity(11 + 2 * count, 220 + count * (inner.namespace.len() + 40));
        evalsha.arg("EVALSHA").arg(inner.script.get_hash()).arg(1);
        let mut key = String::with_capacity(inner.namespace.len() + 21);
        // The first digest's key routes the run: the only key declared.
        let (first, _) = digests
            .clone()
            .next()
            .ok_or_else(|| StoreError::Protocol("a script run needs at least one digest".into()))?;
        self.write_key(&mut key, inner.geometry.set_of(first));
        let slot = key_slot(key.as_bytes());
        evalsha
            .arg(key.as_str())
            .arg(op.code())
            .arg(&inner.owner.to_be_bytes()[..])
            .arg(now)
            .arg(now.saturating_add(self.lease_ms()));
        match inner.config.max_age {
            Some(age) => evalsha.arg(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            None => evalsha.arg(""),
        };
        evalsha
            .arg(inner.geometry.ways())
            .arg(value_version(inner.config.max_age));
        for (digest, slot) in digests.clone() {
            // A hint is the start of the entry: its slot, then the digest.
            let mut arg = [0u8; 17];
            arg[1..].copy_from_slice(&digest.to_bytes());
            match slot {
                Some(slot) => {
                    arg[0] = slot;
                    evalsha.arg(&arg[..]);
                }
                None => {
                    evalsha.arg(&arg[1..]);
                }
            }
        }
        for (digest, _) in digests {
            self.write_key(&mut key, inner.geometry.set_of(digest));
            evalsha.arg(key.as_str());
        }
        let value = inner.link.eval(&inner.script, slot, &evalsha).await?;
        let mut answers: Vec<i64> = redis::from_redis_value(&value).map_err(|error| {
            StoreError::Protocol(format!("the set script answered {value:?}: {error}"))
        })?;
        if answers.len() != count + 2 {
            return Err(StoreError::Protocol(format!(
                "the set script answered {} values to {count} digests",
                answers.len()
            )));
        }
        let created = answers.pop().unwrap_or(0);
        inner.filling.created_by_script(created);
        let unreadable = answers.pop().unwrap_or(0);
        if unreadable > 0 {
            // A statistic: no other memory depends on it.
            inner
                .unreadable
                .fetch_add(unreadable.unsigned_abs(), Ordering::Relaxed);
        }
        Ok(answers)
    }
}
