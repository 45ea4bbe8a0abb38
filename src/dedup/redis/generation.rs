//! The Redis side of a table's generations (the rules are in
//! [`crate::dedup::generational`]): the descriptor key `<prefix>:table`, read and replaced
//! by one script run (a compare-and-set Redis runs whole), and a claim's read-only look-up in
//! a previous shape's set, one read of the set's key (a pipelined `GET`) decided as a claim
//! would decide it.

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;

use super::slots::key_slot;
use super::value::{self, Stored};
use super::{Op, RedisStore};
use crate::dedup::generational::{Generation, Shape, DESCRIPTOR_SUFFIX};
use crate::dedup::shared::{now_ms, REDIS_KEY_VERSION};
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
        REDIS_KEY_VERSION
    }

    fn table(&self) -> Geometry {
        self.inner.geometry
    }

    fn max_age(&self) -> Option<Duration> {
        self.inner.config.max_age
    }

    fn reshaped(&self, shape: Shape) -> Result<Self, StoreError> {
        RedisStore::new_lazy(self.inner.config.clone(), shape.geometry)
    }

    async fn look_up_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        let geometry = self.inner.geometry;
        let mut sets: Vec<u64> = digests
            .iter()
            .map(|&digest| geometry.set_of(digest))
            .collect();
        sets.sort_unstable();
        sets.dedup();
        let read = self.read_previous_sets(&sets).await;
        let facts = self.facts(now_ms());
        digests
            .iter()
            .map(|&digest| {
                let set = self.inner.geometry.set_of(digest);
                let at = sets
                    .binary_search(&set)
                    .map_err(|_| StoreError::Protocol("a look-up lost its set".into()))?;
                let held = read[at].clone()?;
                // Decided as a claim would decide, on a copy that is never written back.
                let (answer, _) = value::apply(&mut Stored(held), Op::Claim, digest, &facts);
                Ok(match answer & 3 {
                    1 => Claim::InFlight,
                    2 => Claim::Duplicate,
                    _ => Claim::New,
                })
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
