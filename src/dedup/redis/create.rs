//! A claim of a set that holds nothing, without the script: `SET key <the set of its one new
//! entry> NX GET`, pipelined per node, the very command the script reads a claim's set with
//! (`set.lua`). Redis answers nil when it wrote the set, which it does only if the key held
//! nothing: the claim is new, in slot 0, decided by that one atomic command. Otherwise it
//! wrote nothing and answers what the key holds, which is decided on as a `GET`'s answer
//! (`read`).
//!
//! While a table fills, most claims find no set, and such a claim costs the server one plain
//! command instead of its share of a script run. On a table that holds entries, a `SET … NX
//! GET` that finds its set costs more than a `GET` (a new set built and sent for nothing), so
//! the store sends claims this way only while most of its last claims created their set
//! (`Filling`), and reads their sets with `GET` otherwise; the script reports the sets it
//! created (a `GET` that found nothing leaves its claim to the script), which turns this way
//! on again (a server restarted empty).
//!
//! Digests of one set in one burst: the first creates the set, the next find it and are
//! decided on it (`read`), whose write finds the header changed when two of them are new, and
//! leaves the second to the script. A pipeline that fails (a node that failed) leaves every
//! claim of it to the script, which waits out a failover; a set it did create before failing
//! is then found by the script in flight, as after a script run whose answer was lost: its
//! message waits out the lease and is claimed anew.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::Value;

use super::entry;
use super::read::Read;
use super::{Op, RedisStore};
use crate::dedup::shared::now_ms;
use crate::dedup::Digest;

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

impl RedisStore {
    /// Claims (`op`: a claim, or a claim written done) each digest whose set holds nothing,
    /// as the module docs say, and reads the others' sets (for `read`); the answers are in
    /// the order of `digests`.
    pub(super) async fn create_sets(&self, op: Op, digests: &[Digest]) -> Vec<Read> {
        let inner = &*self.inner;
        let Some(rules) = self.rules(op, now_ms()) else {
            return vec![Read::Script; digests.len()];
        };
        let deadline = inner.link.deadline();
        let answers = self
            .plain_runs(
                digests,
                deadline,
                |key, digest| {
                    let entry = entry::entry(0, digest, rules.state, rules.time, rules.owner);
                    let set = entry::set_of_one(rules.version, rules.ways, &entry);
                    let mut cmd = entry::command("SET", 5, key.len() + set.len() + 16);
                    cmd.arg(key).arg(&set[..]).arg("NX").arg("GET");
                    cmd
                },
                |answer| match answer {
                    // Nil: the key held nothing, and now holds the new set.
                    Value::Nil => Read::Decided(Ok(0)),
                    Value::BulkString(value) => Read::Found(value),
                    Value::ServerError(error)
                        if error.details().is_some_and(|d| d.contains("syntax error")) =>
                    {
                        inner.filling.refused.store(true, Ordering::Relaxed);
                        Read::Script
                    }
                    _ => Read::Script,
                },
            )
            .await;
        let made = answers
            .iter()
            .filter(|answer| matches!(answer, Read::Decided(Ok(_))))
            .count();
        inner
            .filling
            .learn(u64::try_from(made).unwrap_or(u64::MAX), digests.len());
        answers
    }
}
