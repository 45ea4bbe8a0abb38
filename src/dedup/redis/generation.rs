//! The Redis side of a table's generations (the rules are in
//! [`crate::dedup::generational`]): the descriptor key `<prefix>:table`, read and replaced
//! by one script run (a compare-and-set Redis runs whole), and a claim's read-only look-up in
//! a previous shape's set, one read of the key that holds the set (a pipelined `GET`) decided
//! as a claim would decide it, in either layout (`layout`).

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;

use super::layout::{ITEMS_FORMAT, SETS_FORMAT};
use super::slots::key_slot;
use super::{claim_answer, Op, RedisStore};
use crate::dedup::generational::{Generation, Shape, DESCRIPTOR_SUFFIX};
use crate::dedup::shared::now_ms;
use crate::dedup::{Claim, Digest, Geometry};
use crate::error::StoreError;

/// Reads a key (`ARGV[1]` = `0`), or (`ARGV[1]` = `1`) replaces it with `ARGV[3]` where it
/// holds `ARGV[2]` (`''`: nothing). Answers what the key held before.
static READ_OR_SWAP: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "local held = redis.call('GET', KEYS[1])\n\
         if ARGV[1] == '1' and (held or '') == ARGV[2] then\n\
           redis.call('SET', KEYS[1], ARGV[3])\n\
         end\n\
         return held",
    )
});

/// Sets of the layout of a key per set read to find whether a namespace without a
/// descriptor holds a table of it.
const PROBED_SETS: u64 = 64;

impl RedisStore {
    /// What `key` holds (`None`: nothing), and with `swap = Some((expected, new))` writes
    /// `new` where it holds `expected`, in one script run.
    async fn read_or_swap(
        &self,
        key: &str,
        swap: Option<(Option<&str>, &str)>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let inner = &*self.inner;
        let script = &*READ_OR_SWAP;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(1).arg(key);
        match swap {
            None => evalsha.arg("0"),
            Some((expected, new)) => evalsha.arg("1").arg(expected.unwrap_or("")).arg(new),
        };
        let slot = if inner.config.cluster {
            key_slot(key.as_bytes())
        } else {
            0
        };
        match inner.link.eval(script, slot, &evalsha).await? {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => Ok(Some(bytes)),
            other => Err(StoreError::Protocol(format!(
                "reading `{key}` answered {other:?}"
            ))),
        }
    }
}

impl RedisStore {
    /// The value of each of `sets` (sorted, distinct), read-only: a pipeline of `GET`s per
    /// node (a claim's extra cost during a resize is these reads, no script run), and any
    /// the pipeline did not read (a slot that moved, a node that failed) read again one by
    /// one, each following redirections and failovers within the time limit.
    async fn read_previous_sets(&self, sets: &[u64]) -> Vec<Result<Option<Vec<u8>>, StoreError>> {
        let inner = &*self.inner;
        let keys: Vec<String> = sets.iter().map(|&set| self.key_of_set(set)).collect();
        let runs = self.runs_of_keys(&keys);
        let deadline = inner.link.deadline();
        let mut read: Vec<Option<Result<Option<Vec<u8>>, StoreError>>> = vec![None; sets.len()];
        let piped = join_all(runs.iter().map(|run| {
            let keys = &keys;
            async move {
                let mut pipe = redis::Pipeline::with_capacity(run.len());
                for &i in run {
                    pipe.cmd("GET").arg(keys[i].as_str());
                }
                let slot = key_slot(keys[run[0]].as_bytes());
                inner.link.pipeline(slot, &pipe, run.len(), deadline).await
            }
        }))
        .await;
        for (run, values) in runs.iter().zip(piped) {
            let Ok(values) = values else { continue };
            if values.len() != run.len() {
                continue;
            }
            for (&i, value) in run.iter().zip(values) {
                match value {
                    Value::Nil => read[i] = Some(Ok(None)),
                    Value::BulkString(bytes) => read[i] = Some(Ok(Some(bytes))),
                    // An error reply: read again below.
                    _ => {}
                }
            }
        }
        let keys = &keys;
        let again = join_all(
            read.iter()
                .enumerate()
                .filter(|(_, value)| value.is_none())
                .map(|(i, _)| async move { (i, self.read_or_swap(&keys[i], None).await) }),
        )
        .await;
        for (i, value) in again {
            read[i] = Some(value);
        }
        read.into_iter()
            .map(|value| {
                value.unwrap_or_else(|| Err(StoreError::Protocol("a set not read".into())))
            })
            .collect()
    }

    /// The indices of `keys` in pipelines of at most `MAX_RUN`, as a script's runs are made:
    /// standalone, in order; in a cluster, grouped by the master of their slot.
    fn runs_of_keys(&self, keys: &[String]) -> Vec<Vec<usize>> {
        self.runs_by_slot(keys.len(), |i| key_slot(keys[i].as_bytes()))
    }
}

impl Generation for RedisStore {
    fn format(&self) -> u8 {
        self.inner.layout.format()
    }

    /// Its own format, and the other of the two layouts: a key per set (format 2), which a
    /// table moves from, and the compact layout (format 3).
    fn reads_format(&self, format: u8) -> bool {
        format == SETS_FORMAT || format == ITEMS_FORMAT
    }

    fn table(&self) -> Geometry {
        self.inner.geometry
    }

    fn max_age(&self) -> Option<Duration> {
        self.inner.config.max_age
    }

    /// The table of a key per set (key format 2) at this store's geometry, when a key of it
    /// is found among 64 sets spread over the table (`PROBED_SETS`, one pipeline of reads
    /// per node): a table that versions before descriptors kept. A table whose probed sets
    /// are all absent holds little (most of its sets are empty) and is not read.
    async fn earlier_table(&self) -> Result<Option<Shape>, StoreError> {
        if self.inner.layout.format() != ITEMS_FORMAT {
            return Ok(None);
        }
        let geometry = self.inner.geometry;
        let earlier = RedisStore::new_lazy_in(self.inner.config.clone(), geometry, SETS_FORMAT)?;
        let sets = geometry.sets();
        let mut probed: Vec<u64> = (0..PROBED_SETS).map(|i| i * sets / PROBED_SETS).collect();
        probed.dedup();
        for read in earlier.read_previous_sets(&probed).await {
            if read?.is_some() {
                return Ok(Some(Shape {
                    format: SETS_FORMAT,
                    geometry,
                }));
            }
        }
        Ok(None)
    }

    fn reshaped(&self, shape: Shape) -> Result<Self, StoreError> {
        let store =
            RedisStore::new_lazy_in(self.inner.config.clone(), shape.geometry, shape.format)?;
        // The same servers: what this store learnt of `IFEQ`, and said, holds for it.
        store.inner.ifeq.inherit(&self.inner.ifeq);
        Ok(store)
    }

    async fn look_up_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let (geometry, layout) = (self.inner.geometry, self.inner.layout);
        let mut sets: Vec<u64> = digests
            .iter()
            .map(|&digest| layout.key_of(geometry.set_of(digest)))
            .collect();
        sets.sort_unstable();
        sets.dedup();
        let read = self.read_previous_sets(&sets).await;
        let facts = self.facts(now_ms());
        digests
            .iter()
            .map(|&digest| {
                let set = layout.key_of(geometry.set_of(digest));
                let at = sets
                    .binary_search(&set)
                    .map_err(|_| StoreError::Protocol("a look-up lost its set".into()))?;
                let held = read[at].as_ref().map_err(Clone::clone)?;
                // Decided as a claim would decide, on a copy that is never written back.
                let decided = layout.decide(
                    (set, geometry),
                    held.as_deref(),
                    Op::Claim,
                    std::iter::once((0, digest)),
                    &facts,
                );
                let answer = decided.staged.first().map_or(0, |&(_, answer)| answer);
                claim_answer(answer)
            })
            .collect()
    }

    async fn descriptor(
        &self,
        replace: Option<(Option<&str>, &str)>,
    ) -> Result<Option<String>, StoreError> {
        let key = self.descriptor_key();
        self.read_or_swap(&key, replace)
            .await?
            .map(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|_| StoreError::Protocol(format!("`{key}` does not hold text")))
            })
            .transpose()
    }

    fn descriptor_key(&self) -> String {
        format!("{}:{DESCRIPTOR_SUFFIX}", self.inner.config.namespace)
    }
}
