//! One round of a run of the `IFEQ` path (see `ifeq`): the reads of the sets it has no value
//! for, one pipeline; the decisions; the conditional writes of the sets that changed, one
//! pipeline; and what a failed pipeline leaves.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::super::layout::Layout;
use super::super::recycle;
use super::super::resp::{Commands, Replies, Reply};
use super::super::value::Facts;
use super::super::{key_slot, Op, RedisStore};
use super::{is_syntax_error, Answers, Held, SetWork, REFUSED};
use crate::dedup::Digest;
use crate::error::StoreError;

/// A set's planned write: its index in the run, its new value, and the answers the write
/// makes true (a digest's index in the run, and its answer).
pub(super) struct Planned {
    set: usize,
    value: Vec<u8>,
    staged: Vec<(usize, i64)>,
}

/// A read: its set, and the set a `SET … NX GET` would create, with its claim's answer.
type Read = (usize, Option<(Vec<u8>, i64)>);

/// A run's sets and the indices of those still to decide.
pub(super) type Pending<'a> = (&'a mut [SetWork], &'a mut Vec<usize>);

impl RedisStore {
    /// Gives each pending set of `sets` the value to decide on: in the first round, the one
    /// this store wrote last if it kept it; else a read, one pipeline to the run's node. While
    /// the table fills, a claim's set is read in the first round with `SET … NX GET` of the
    /// set of its one new entry: answered nil, it created the set, and that claim is decided.
    /// Sets answered with an error are the script's. The values read lie in the replies
    /// answered (empty when nothing was read).
    ///
    /// # Errors
    ///
    /// The pipeline's: none of its commands is known to have run.
    pub(super) async fn read_sets(
        &self,
        (op, run): (Op, &[Digest]),
        (sets, pending): Pending<'_>,
        (round, deadline): (usize, Instant),
        (facts, answers): (&Facts, &mut Answers),
    ) -> Result<Replies, StoreError> {
        let inner = &*self.inner;
        let (layout, geometry) = (inner.layout, inner.geometry);
        let claiming = matches!(op, Op::Claim | Op::ClaimDone);
        let reads = self.kept_or_read((op, run), (sets, pending), round, facts);
        let Some(&(first, _)) = reads.first() else {
            return Ok(Replies::default());
        };
        let commands = read_commands(sets, &reads);
        let slot = key_slot(sets[first].key.as_bytes());
        let mut replies = inner.link.send_commands(slot, &commands, deadline).await?;
        drop(commands);
        let values = replies.take_list();
        if values.len() != reads.len() {
            return Err(StoreError::Protocol(format!(
                "{} answers to {} reads",
                values.len(),
                reads.len()
            )));
        }
        let (mut no_set, mut unreadable) = (0, 0);
        let count = reads.len();
        for ((s, create), answer) in reads.into_iter().zip(values) {
            let work = &mut sets[s];
            match (answer, create) {
                (Reply::Nil, Some((created, claim))) => {
                    // Written: the key held nothing. Its first claim is decided.
                    answers[work.ops[0]] = Some(Ok(claim));
                    work.settled = 1;
                    inner.ifeq.remember(work.set, recycle::copy_of(&created));
                    work.hold(Some(Held::Own(created)));
                    work.as_written = true;
                    no_set += 1;
                }
                (Reply::Nil, None) => {
                    work.hold(None);
                    no_set += 1;
                }
                (Reply::Bulk(span), _) => {
                    // Checked once: a value as this store writes it is decided on as it is.
                    let stored = replies.bulk(span);
                    work.as_written = layout.is_as_written(stored, work.set, geometry, facts);
                    if !work.as_written
                        && layout.holds_nothing(Some(stored), work.set, geometry, facts)
                    {
                        no_set += 1;
                        unreadable += 1;
                    }
                    work.hold(Some(Held::Read(span)));
                }
                // An error reply (a slot that moved, a key of another type): the script's.
                (reply, _) => {
                    self.note_refused(&reply);
                    work.to_script = true;
                }
            }
        }
        if claiming {
            inner.filling.learn(no_set, count);
        }
        if unreadable > 0 {
            // A statistic: no other memory depends on it.
            inner.unreadable.fetch_add(unreadable, Ordering::Relaxed);
        }
        Ok(replies)
    }

    /// Gives each pending set of a commit, an erase or a renew the value this store wrote
    /// last, in the first round and if it kept it; the others are to read (with the set a
    /// claim's `SET … NX GET` creates, while the table fills).
    fn kept_or_read(
        &self,
        (op, run): (Op, &[Digest]),
        (sets, pending): Pending<'_>,
        round: usize,
        facts: &Facts,
    ) -> Vec<Read> {
        let inner = &*self.inner;
        let claiming = matches!(op, Op::Claim | Op::ClaimDone);
        let creating = claiming && round == 0 && inner.filling.get();
        let mut reads: Vec<Read> = Vec::with_capacity(pending.len());
        let mut known = (round == 0).then(|| inner.ifeq.known());
        for &s in pending.iter() {
            let work = &mut sets[s];
            // A claim reads its set (see the module docs).
            let kept = known
                .as_mut()
                .filter(|_| !claiming)
                .and_then(|known| known.remove(&work.set));
            if let Some(kept) = kept {
                work.hold(Some(Held::Own(kept)));
                work.kept = true;
                work.as_written = true;
                continue;
            }
            work.kept = false;
            let create = (creating && work.settled == 0).then(|| {
                let first = work.ops[0];
                let created = inner.layout.decide(
                    (work.set, inner.geometry),
                    None,
                    op,
                    std::iter::once((first, run[first])),
                    facts,
                );
                let answer = created.staged.first().map_or(0, |&(_, answer)| answer);
                (created.value.unwrap_or_default(), answer)
            });
            reads.push((s, create));
        }
        reads
    }

    /// Decides the operations of each pending set on its value, in order: the sets that
    /// changed, to write; the answers of the sets read that did not, in `answers`; the sets
    /// decided on a kept value that did not change, pending again (to be read). The values
    /// read lie in `replies`.
    pub(super) fn decide(
        &self,
        (op, run): (Op, &[Digest]),
        (sets, pending): Pending<'_>,
        (facts, replies): (&Facts, &Replies),
        answers: &mut Answers,
    ) -> Vec<Planned> {
        let mut writes = Vec::new();
        let mut again = Vec::new();
        for &s in pending.iter() {
            let work = &sets[s];
            if work.to_script {
                continue;
            }
            let decided = self.inner.layout.decide_on(
                (work.set, self.inner.geometry),
                (work.value(replies), work.as_written),
                op,
                work.ops[work.settled..].iter().map(|&i| (i, run[i])),
                facts,
            );
            let staged = decided.staged;
            match decided.value {
                Some(value) => writes.push(Planned {
                    set: s,
                    value,
                    staged,
                }),
                // Nothing written checks a kept value: read it.
                _ if work.kept => again.push(s),
                _ => {
                    for (i, answer) in staged {
                        answers[i] = Some(Ok(answer));
                    }
                }
            }
        }
        *pending = again;
        writes
    }

    /// Writes each planned set, one pipeline to the run's node: `SET key new IFEQ old
    /// KEEPTTL`, or `SET key new NX` where the key held nothing. A write that succeeded makes
    /// its answers true and its value kept; one whose compare failed puts its set back in
    /// `pending`, to be read and decided again. The values read (each write's old value) lie
    /// in `replies`.
    ///
    /// # Errors
    ///
    /// The pipeline's; every planned set is then back in `pending`.
    pub(super) async fn write_sets(
        &self,
        (sets, pending): Pending<'_>,
        (writes, replies): (Vec<Planned>, &Replies),
        deadline: Instant,
        answers: &mut Answers,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let Some(first) = writes.first() else {
            return Ok(());
        };
        let slot = key_slot(sets[first.set].key.as_bytes());
        // The compact layout on servers without IFEQ compares and sets by script.
        let by_script =
            (inner.layout != Layout::Sets && !inner.ifeq.on()).then(|| inner.script.get_hash());
        let commands = write_commands((sets, replies), &writes, by_script);
        let replies = match inner.link.send_commands(slot, &commands, deadline).await {
            Ok(mut replies) if replies.len() == writes.len() => replies.take_list(),
            Ok(replies) => {
                pending.extend(writes.iter().map(|write| write.set));
                return Err(StoreError::Protocol(format!(
                    "{} answers to {} writes",
                    replies.len(),
                    writes.len()
                )));
            }
            Err(error) => {
                pending.extend(writes.iter().map(|write| write.set));
                return Err(error);
            }
        };
        for (write, reply) in writes.into_iter().zip(replies) {
            let work = &mut sets[write.set];
            match reply {
                Reply::Okay | Reply::Int(1) => {
                    for (i, answer) in write.staged {
                        answers[i] = Some(Ok(answer));
                    }
                    inner.ifeq.remember(work.set, write.value);
                }
                // The set is not what it was decided on (or, for NX, exists now).
                Reply::Nil | Reply::Int(0) => {
                    inner.ifeq.conflicted();
                    pending.push(write.set);
                }
                reply => {
                    self.write_refused(&reply);
                    work.to_script = true;
                }
            }
        }
        Ok(())
    }

    /// What a write's error reply means: a syntax error is a server without `IFEQ` after
    /// all (a failover to a replica of an older version), which turns the path off.
    fn write_refused(&self, reply: &Reply) {
        if is_syntax_error(reply) {
            self.inner.ifeq.support.store(REFUSED, Ordering::Relaxed);
        } else {
            self.note_refused(reply);
        }
    }

    /// Learns from a command's error reply: a slot that moved (`MOVED`) has the slot map
    /// read again before the next operation routes by it, and counts with an `ASK` among the
    /// redirections (the script follows them, for the operations this path leaves to it).
    fn note_refused(&self, reply: &Reply) {
        let link = &self.inner.link;
        match reply.error_code() {
            Some("MOVED") => link.mark_stale(),
            Some("ASK") => {}
            _ => return,
        }
        // A statistic: nothing else depends on it.
        link.redirects.fetch_add(1, Ordering::Relaxed);
    }

    /// The answers of a run whose pipeline failed with `error`: each operation of the pending
    /// sets not yet decided fails with it once out of time (the script would wait again for a
    /// node that does not answer), else is left to the script, which waits out a failover.
    /// The kept values are forgotten: the server may have restarted.
    pub(super) fn pipeline_failed(
        &self,
        error: StoreError,
        deadline: Instant,
        (sets, pending): (&[SetWork], &[usize]),
        mut answers: Answers,
    ) -> Answers {
        self.inner.ifeq.forget_all();
        if Instant::now() >= deadline {
            for &s in pending {
                for &i in &sets[s].ops[sets[s].settled..] {
                    answers[i] = Some(Err(error.clone()));
                }
            }
        }
        answers
    }
}

/// The read of each of `reads`: `SET key <set> NX GET` where it creates a set, else `GET key`.
fn read_commands(sets: &[SetWork], reads: &[Read]) -> Commands {
    let bytes: usize = reads
        .iter()
        .map(|(s, create)| sets[*s].key.len() + create.as_ref().map_or(0, |(set, _)| set.len()))
        .sum();
    let mut commands = Commands::with_capacity(bytes + 48 * reads.len());
    for (s, create) in reads {
        let key = sets[*s].key.as_bytes();
        match create {
            Some((set, _)) => commands.push(&[b"SET", key, set, b"NX", b"GET"]),
            None => commands.push(&[b"GET", key]),
        }
    }
    commands
}

/// The write of each of `writes` (see [`RedisStore::write_sets`]), the values read lying in
/// `replies`: with `by_script`, the compare-and-set script's hash, a key that held a value is
/// written by that script (`EVALSHA <hash> 1 key new old`) instead of `SET … IFEQ`.
fn write_commands(
    (sets, replies): (&[SetWork], &Replies),
    writes: &[Planned],
    by_script: Option<&str>,
) -> Commands {
    let bytes: usize = writes
        .iter()
        .map(|write| {
            let work = &sets[write.set];
            let old = work.value(replies).map_or(0, <[u8]>::len);
            work.key.len() + write.value.len() + old
        })
        .sum();
    let mut commands = Commands::with_capacity(bytes + 96 * writes.len());
    for write in writes {
        let work = &sets[write.set];
        let (key, value) = (work.key.as_bytes(), &write.value[..]);
        match (work.value(replies), by_script) {
            (Some(old), Some(hash)) => {
                commands.push(&[b"EVALSHA", hash.as_bytes(), b"1", key, value, old]);
            }
            (Some(old), None) => commands.push(&[b"SET", key, value, b"IFEQ", old, b"KEEPTTL"]),
            (None, _) => commands.push(&[b"SET", key, value, b"NX"]),
        }
    }
    commands
}
