//! A commit through its claim's slot, without the script: the entry read (`GETRANGE` of its
//! 34 bytes) and, when it is still this digest's claim in flight by this owner, written whole
//! (`SETRANGE`: this digest, done, this owner), each step one pipeline per node. Two plain
//! commands cost the server less than half a script run's read and write.
//!
//! The read and the write are two round trips, not one atomic step: in between, a claim of
//! another consumer may take the slot (this entry pushed out by a new digest, or taken over
//! after the lease ran out exactly then). The write still loses nothing. It names only this
//! digest, which this owner delivered, so it never marks done a message that was not:
//! - the other digest's entry is overwritten: that digest is forgotten, so a copy of it may
//!   pass again (a duplicate, never a loss). Its claim, still in flight, finds its entry gone
//!   at its commit (answered not held) or its erase (nothing to erase; its message is
//!   requeued and claimed anew);
//! - an entry taken over is done again, by this owner: the other owner's erase finds it not
//!   its own, and its message, requeued, is a duplicate of the one this owner delivered;
//! - a key removed in between (a server restarted empty, a set evicted) is made again by the
//!   write, padded with zeros up to the entry, which the script reads as a set whose header
//!   is still to be written (`set.lua`).
//!
//! A digest without a hint, one whose entry the read did not find as its claim left it (then
//! the script reads the whole set, and a commit that lost its claim is answered not held), and
//! one this path could not read or write (an error reply: a slot that moved, a key of another
//! type; a node that failed) is committed by the script, as before.

use futures::future::join_all;
use redis::Value;
use tokio::time::Instant;

use super::entry::{self, State, ENTRY_BYTES};
use super::{RedisStore, Target};
use crate::dedup::shared::now_ms;
use crate::dedup::Digest;
use crate::error::StoreError;

/// The script's answer to a commit that found its entry held.
const HELD: i64 = 1;

/// What this path made of one commit.
#[derive(Clone)]
enum Step {
    /// Written or found done (held: the script's answer 1), or an error to report.
    Answered(Result<i64, StoreError>),
    /// Left to the script, through the hint: the entry was not read (an error).
    Script,
    /// Left to the script, which is to read the whole set: the entry was read and is not the
    /// claim as it was left.
    WholeSet,
}

impl RedisStore {
    /// Commits each digest of `targets` that has a hint as the module docs say; the answers
    /// are in the order of `targets`, as the script answers them (1: held), `None` for a digest
    /// left to the script (whose hint is taken out when the script is to read its whole set).
    pub(super) async fn write_commits(
        &self,
        targets: &mut [Target],
    ) -> Vec<Option<Result<i64, StoreError>>> {
        let mut answers = vec![None; targets.len()];
        let hinted: Vec<(usize, Digest, u8)> = targets
            .iter()
            .enumerate()
            .filter_map(|(i, &(digest, slot))| Some((i, digest, slot?)))
            .collect();
        if hinted.is_empty() {
            return answers;
        }
        let inner = &*self.inner;
        let runs = self.runs(hinted.len(), |j| hinted[j].1);
        let deadline = inner.link.deadline();
        let written = join_all(runs.iter().map(|run| {
            let run: Vec<(Digest, u8)> = run.iter().map(|&j| (hinted[j].1, hinted[j].2)).collect();
            async move { self.commit_run(&run, deadline).await }
        }))
        .await;
        for (run, written) in runs.iter().zip(written) {
            for (&j, step) in run.iter().zip(written) {
                let i = hinted[j].0;
                match step {
                    Step::Answered(answer) => answers[i] = Some(answer),
                    Step::Script => {}
                    Step::WholeSet => targets[i].1 = None,
                }
            }
        }
        answers
    }

    /// The read, then the write, of one run's entries, on the node of its first digest's set.
    async fn commit_run(&self, run: &[(Digest, u8)], deadline: Instant) -> Vec<Step> {
        let inner = &*self.inner;
        let mut key = String::with_capacity(inner.namespace.len() + 21);
        let mut node_slot = None;
        let mut reads = redis::Pipeline::with_capacity(run.len());
        for &(digest, slot) in run {
            self.write_key(&mut key, inner.geometry.set_of(digest));
            node_slot.get_or_insert_with(|| super::key_slot(key.as_bytes()));
            let at = entry::offset(slot);
            let mut cmd = entry::command("GETRANGE", 4, key.len() + 28);
            cmd.arg(key.as_str()).arg(at).arg(at + ENTRY_BYTES - 1);
            reads.add_command(cmd);
        }
        let Some(node_slot) = node_slot else {
            return Vec::new();
        };
        let entries = match inner
            .link
            .pipeline(node_slot, &reads, run.len(), deadline)
            .await
        {
            Ok(entries) if entries.len() == run.len() => entries,
            Ok(_) => return vec![Step::Script; run.len()],
            Err(error) => return fallback(error, deadline, run.len()),
        };
        let mut answers = vec![Step::Script; run.len()];
        let mut writes = redis::Pipeline::with_capacity(run.len());
        let mut writing = Vec::new();
        let time = self.done_time(now_ms());
        for (i, entry) in entries.iter().enumerate() {
            let (digest, slot) = run[i];
            let value = match entry {
                Value::BulkString(value) => value,
                // An error reply: the entry was not read.
                _ => continue,
            };
            // As the script decides a commit: done by anyone is held; in flight, only by
            // this owner.
            match entry::state_of(value, slot, digest) {
                Some((State::Done, _)) => answers[i] = Step::Answered(Ok(HELD)),
                Some((State::InFlight, owner)) if owner == inner.owner => {
                    let done = entry::entry(slot, digest, State::Done, time, inner.owner);
                    self.write_key(&mut key, inner.geometry.set_of(digest));
                    let mut cmd = entry::command("SETRANGE", 4, key.len() + ENTRY_BYTES + 16);
                    cmd.arg(key.as_str())
                        .arg(entry::offset(slot))
                        .arg(&done[..]);
                    writes.add_command(cmd);
                    writing.push(i);
                }
                _ => answers[i] = Step::WholeSet,
            }
        }
        if writing.is_empty() {
            return answers;
        }
        match inner
            .link
            .pipeline(node_slot, &writes, writing.len(), deadline)
            .await
        {
            Ok(lengths) if lengths.len() == writing.len() => {
                for (&i, length) in writing.iter().zip(lengths) {
                    // `SETRANGE` answers the string's new length.
                    if matches!(length, Value::Int(_)) {
                        answers[i] = Step::Answered(Ok(HELD));
                    }
                }
            }
            Ok(_) => {}
            Err(error) => {
                for (&i, answer) in writing.iter().zip(fallback(error, deadline, writing.len())) {
                    answers[i] = answer;
                }
            }
        }
        answers
    }
}

/// The answers of `count` commits whose pipeline failed with `error`: the error once out of
/// time (the script would wait again for a node that does not answer), else none, for the
/// script (which waits for a failed node's replica to take over).
fn fallback(error: StoreError, deadline: Instant, count: usize) -> Vec<Step> {
    if Instant::now() >= deadline {
        vec![Step::Answered(Err(error)); count]
    } else {
        vec![Step::Script; count]
    }
}
