//! The Redis side of a table's generations (the rules are in
//! [`crate::dedup::generational`]): the descriptor key `<prefix>:table`, read and replaced
//! by one script run (a compare-and-set Redis runs whole), and a claim's read-only look-up in
//! a previous shape's set, one read of the set's key decided as a claim would decide it.

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
        let mut sets: Vec<u64> = digests
            .iter()
            .map(|&digest| self.inner.geometry.set_of(digest))
            .collect();
        sets.sort_unstable();
        sets.dedup();
        let read = join_all(
            sets.iter()
                .map(|&set| async move { self.read_or_swap(&self.key_of_set(set), None).await }),
        )
        .await;
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
