//! The compact layout's operations that a burst's pipelines (`ifeq`) did not decide: a key
//! whose command was answered with an error (`MOVED` or `ASK` in a cluster whose slots moved,
//! `NOSCRIPT` from a restarted server), whose pipeline failed while the operation still has
//! time (a node that failed), or that kept changing under this store. Each such key is read
//! and written on its own through the compare-and-set script (`cas.lua`), each command
//! following redirections, loading the script where it is missing and waiting out a
//! failover ([`Link::eval`](super::conn::Link::eval)), and decided in the client between the
//! two as the pipelines decide it ([`Layout::decide`](super::layout::Layout::decide)).
//!
//! The compact layout has no script that decides: this is the path the set script is for the
//! layout of a key per set. A write that finds the key changed since its read writes nothing,
//! and the key is read and decided again after a pause that grows with each try (so that
//! writers of one key that keep meeting stop meeting), until the operation's time limit
//! ([`RedisConfig::timeout`](super::RedisConfig::timeout)) or [`MAX_TRIES`]; then its
//! operations fail as contended ([`StoreError::Contended`]), and the caller's
//! `on_store_error` decides.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use redis::Value;
use tokio::time::Instant;

use super::slots::key_slot;
use super::{Op, RedisStore};
use crate::dedup::shared::now_ms;
use crate::dedup::Digest;
use crate::error::StoreError;
use crate::fold_hash::IdHasher;

/// Reads and writes of one key before its operations fail as contended, within the time
/// limit.
const MAX_TRIES: u32 = 64;

/// The longest pause between two tries of one key, in microseconds: each try pauses up to
/// this much more, less a part that differs between owners.
const PAUSE_STEP_US: u64 = 200;

impl RedisStore {
    /// `op` on each digest of a table of the compact layout: the burst's pipelines (`ifeq`),
    /// then one key at a time here for what they left; the answers as the set script gives
    /// them.
    pub(super) async fn compact_many(
        &self,
        op: Op,
        digests: &[Digest],
    ) -> Vec<Result<i64, StoreError>> {
        let answers = self.ifeq_many(op, digests).await;
        self.items_rest(op, answers, digests).await
    }

    /// Each of `answers`, the ones it lacks decided here: `op` on those of `digests` (see the
    /// module docs), a key at a time, the keys at once.
    async fn items_rest(
        &self,
        op: Op,
        mut answers: Vec<Option<Result<i64, StoreError>>>,
        digests: &[Digest],
    ) -> Vec<Result<i64, StoreError>> {
        let inner = &*self.inner;
        let mut keys: Vec<(u64, Vec<usize>)> = Vec::new();
        let mut index: HashMap<u64, usize, IdHasher> = HashMap::default();
        for (i, &digest) in digests.iter().enumerate() {
            if answers[i].is_some() {
                continue;
            }
            let key = inner.layout.key_of(inner.geometry.set_of(digest));
            let at = *index.entry(key).or_insert_with(|| {
                keys.push((key, Vec::new()));
                keys.len() - 1
            });
            keys[at].1.push(i);
        }
        let decided = join_all(
            keys.iter()
                .map(|(key, ops)| self.key_by_script(op, *key, ops, digests)),
        )
        .await;
        for ((_, ops), decided) in keys.iter().zip(decided) {
            for (&i, answer) in ops.iter().zip(decided) {
                answers[i] = Some(answer);
            }
        }
        super::answered(answers)
    }

    /// `op` on the digests `ops` (indices into `digests`) of key number `key`: read, decided,
    /// and written if they changed it, until a write finds the key as it was read.
    async fn key_by_script(
        &self,
        op: Op,
        key: u64,
        ops: &[usize],
        digests: &[Digest],
    ) -> Vec<Result<i64, StoreError>> {
        let inner = &*self.inner;
        let name = self.key_of_set(key);
        let fail = |error: StoreError| vec![Err(error); ops.len()];
        let deadline = inner.link.deadline();
        let mut tries = 0;
        while tries < MAX_TRIES && (tries == 0 || Instant::now() < deadline) {
            if tries > 0 {
                // Owners differ by random ids: their pauses differ.
                let jitter = (inner.owner ^ u64::from(tries)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let pause = u64::from(tries) * PAUSE_STEP_US - jitter % PAUSE_STEP_US;
                tokio::time::sleep(Duration::from_micros(pause)).await;
            }
            tries += 1;
            let read = match self.compare_and_set(&name, &[]).await {
                Ok(Value::Nil) => None,
                Ok(Value::BulkString(bytes)) => Some(bytes),
                Ok(other) => {
                    return fail(StoreError::Protocol(format!(
                        "reading `{name}` answered {other:?}"
                    )))
                }
                Err(error) => return fail(error),
            };
            let facts = self.facts(now_ms());
            if read.is_some()
                && inner
                    .layout
                    .holds_nothing(read.as_deref(), key, inner.geometry, &facts)
            {
                // A statistic: no other memory depends on it.
                inner.unreadable.fetch_add(1, Ordering::Relaxed);
            }
            let decided = inner.layout.decide(
                (key, inner.geometry),
                read.as_deref(),
                op,
                ops.iter().map(|&i| (i, digests[i])),
                &facts,
            );
            let answers = decided
                .staged
                .iter()
                .map(|&(_, answer)| Ok(answer))
                .collect();
            let Some(value) = decided.value else {
                return answers;
            };
            let written = match &read {
                Some(old) => self.compare_and_set(&name, &[&value, old]).await,
                None => self.compare_and_set(&name, &[&value]).await,
            };
            match written {
                Ok(Value::Int(1)) => {
                    inner.ifeq.remember(key, value);
                    return answers;
                }
                Ok(Value::Int(0)) => inner.ifeq.conflicted(),
                Ok(other) => {
                    return fail(StoreError::Protocol(format!(
                        "writing `{name}` answered {other:?}"
                    )))
                }
                Err(error) => return fail(error),
            }
        }
        fail(StoreError::Contended { attempts: tries })
    }

    /// One run of the compare-and-set script on `key` with `args` (see `cas.lua`), following
    /// the key's slot.
    async fn compare_and_set(&self, key: &str, args: &[&[u8]]) -> Result<Value, StoreError> {
        let inner = &*self.inner;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(inner.script.get_hash()).arg(1).arg(key);
        for arg in args {
            evalsha.arg(*arg);
        }
        let slot = if inner.config.cluster {
            key_slot(key.as_bytes())
        } else {
            0
        };
        inner.link.eval(&inner.script, slot, &evalsha).await
    }
}
