//! A claim of a set that holds nothing, without the script: `SET key <the set of its one new
//! entry> NX GET`, pipelined per node, the very command the script reads a claim's set with
//! (`set.lua`). Redis answers nil when it wrote the set, which it does only if the key held
//! nothing: the claim is new, in slot 0, decided by that one atomic command. Otherwise it
//! wrote nothing and answers what the key holds, and the script decides the claim as before
//! (reading the set again, in the same run as its write).
//!
//! While a table fills, most claims find no set, and such a claim costs the server one plain
//! command instead of its share of a script run. On a table that holds entries, a `SET … NX
//! GET` that finds its set is wasted (the script then reads it anyway), so the store sends
//! claims this way only while most of its last claims created their set (`Filling`), and
//! through the script alone otherwise; the script reports the sets it created, which turns
//! this way on again (a server restarted empty).
//!
//! Digests of one set in one burst: the first creates the set, the next find it and go to
//! the script, which decides them after it, in order. A pipeline that fails (a node that
//! failed) leaves every claim of it to the script, which waits out a failover; a set it did
//! create before failing is then found by the script in flight, as after a script run whose
//! answer was lost: its message waits out the lease and is claimed anew.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::join_all;
use redis::Value;
use tokio::time::Instant;

use super::entry::{self, State, SET_OF_ONE_BYTES};
use super::{Op, RedisStore};
use crate::dedup::shared::{now_ms, value_version};
use crate::dedup::Digest;
use crate::error::StoreError;

/// Whether the table looked as if it were filling at the last claims: most of them created
/// their set. It starts so (a new namespace holds nothing). Hints for the next burst:
/// nothing else depends on them.
#[derive(Debug)]
pub(super) struct Filling {
    filling: AtomicBool,
    /// The server refused `NX` with `GET` (before Redis 7.0): never this way.
    refused: AtomicBool,
    /// Sets the script created, as its runs report them.
    by_script: AtomicU64,
}

impl Default for Filling {
    fn default() -> Self {
        Filling {
            filling: AtomicBool::new(true),
            refused: AtomicBool::new(false),
            by_script: AtomicU64::new(0),
        }
    }
}

impl Filling {
    pub(super) fn get(&self) -> bool {
        self.filling.load(Ordering::Relaxed) && !self.refused.load(Ordering::Relaxed)
    }

    /// Learns from `created` sets made by `claims` claims.
    pub(super) fn learn(&self, created: u64, claims: usize) {
        let claims = u64::try_from(claims).unwrap_or(u64::MAX);
        self.filling
            .store(created.saturating_mul(2) > claims, Ordering::Relaxed);
    }

    /// Counts the sets a script run reports it created.
    pub(super) fn created_by_script(&self, created: i64) {
        self.by_script
            .fetch_add(created.unsigned_abs(), Ordering::Relaxed);
    }

    /// The sets the script created so far.
    pub(super) fn by_script(&self) -> u64 {
        self.by_script.load(Ordering::Relaxed)
    }
}

/// What this path made of one claim: the script's answer (0: new, in slot 0), an error to
/// report, or nothing (the script decides it).
type Created = Option<Result<i64, StoreError>>;

impl RedisStore {
    /// Claims (`op`: a claim, or a claim written done) each digest whose set holds nothing,
    /// as the module docs say; the answers are in the order of `digests`.
    pub(super) async fn create_sets(&self, op: Op, digests: &[Digest]) -> Vec<Created> {
        let inner = &*self.inner;
        let Ok(ways) = u8::try_from(inner.geometry.ways()) else {
            return vec![None; digests.len()];
        };
        let runs = self.runs(digests.len(), |i| digests[i]);
        let now = now_ms();
        let version = value_version(inner.config.max_age);
        let (state, time) = match op {
            Op::ClaimDone => (State::Done, self.done_time(now)),
            _ => (State::InFlight, now.saturating_add(self.lease_ms())),
        };
        let deadline = inner.link.deadline();
        let created = join_all(runs.iter().map(|run| {
            let sets = run.iter().map(|&i| {
                let entry = entry::entry(0, digests[i], state, time, inner.owner);
                (digests[i], entry::set_of_one(version, ways, &entry))
            });
            self.create_run(sets, deadline)
        }))
        .await;
        let mut answers: Vec<Created> = vec![None; digests.len()];
        let mut made = 0;
        for (run, created) in runs.iter().zip(created) {
            for (&i, answer) in run.iter().zip(created) {
                made += u64::from(matches!(answer, Some(Ok(_))));
                answers[i] = answer;
            }
        }
        inner.filling.learn(made, digests.len());
        answers
    }

    /// One pipeline of `SET … NX GET`s of `sets` (a digest and the set its claim makes), to
    /// the node of the first digest's set.
    async fn create_run(
        &self,
        sets: impl ExactSizeIterator<Item = (Digest, [u8; SET_OF_ONE_BYTES])>,
        deadline: Instant,
    ) -> Vec<Created> {
        let inner = &*self.inner;
        let count = sets.len();
        let mut pipe = redis::Pipeline::with_capacity(count);
        let mut key = String::with_capacity(inner.namespace.len() + 21);
        let mut node_slot = None;
        for (digest, set) in sets {
            self.write_key(&mut key, inner.geometry.set_of(digest));
            node_slot.get_or_insert_with(|| super::key_slot(key.as_bytes()));
            let mut cmd = entry::command("SET", 5, key.len() + SET_OF_ONE_BYTES + 16);
            cmd.arg(key.as_str()).arg(&set[..]).arg("NX").arg("GET");
            pipe.add_command(cmd);
        }
        let Some(node_slot) = node_slot else {
            return Vec::new();
        };
        match inner.link.pipeline(node_slot, &pipe, count, deadline).await {
            // Nil: the key held nothing, and now holds the new set.
            Ok(answers) if answers.len() == count => answers
                .into_iter()
                .map(|answer| match answer {
                    Value::Nil => Some(Ok(0)),
                    Value::ServerError(error)
                        if error.details().is_some_and(|d| d.contains("syntax error")) =>
                    {
                        inner.filling.refused.store(true, Ordering::Relaxed);
                        None
                    }
                    _ => None,
                })
                .collect(),
            Ok(_) => vec![None; count],
            // Out of time: the script would wait again for a node that does not answer.
            Err(error) if Instant::now() >= deadline => vec![Some(Err(error)); count],
            Err(_) => vec![None; count],
        }
    }
}
