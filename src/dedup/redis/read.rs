//! Claims decided on a plain read of their sets: each set read with a `GET` (or the answer
//! of the `SET … NX GET` that found it, see `create`), pipelined per master, and decided here
//! by the rules `set.lua` decides a claim by. A copy found (a duplicate, or a claim in flight)
//! is answered with no write at all. An absent digest of a full set is written by
//! `write.lua`, one run per master, only if the set's header is still the one the read found:
//! the new entry in the cursor's slot, and the header with the cursor moved on. Such a run
//! costs the server a header read and two small writes per claim, where `set.lua` reads the
//! whole set into Lua, searches it and builds its write.
//!
//! A claim that adds an entry to a full set moves its cursor, but one into an erased slot
//! (`set.lua`), so an unchanged header means no claim added an entry since the read, and two
//! consumers that read a set at once (the copies of one message, say) cannot both add to it:
//! the second write is refused, and its claim goes to `set.lua`, which finds the first. The
//! entries between the header and the new one are not written, so a commit or an erase made
//! since the read stands.
//!
//! What the header does not show, and what it costs (a duplicate, never a loss): `ways`
//! claims of one set between the read and the write bring its cursor back where it was; a
//! slot erased in between may take a claim of the same digest; a set removed and made again
//! in between (evicted) may have the header read. The digest is then claimed new twice. Each
//! needs other consumers to change the same set within one round trip.
//!
//! Everything else goes to `set.lua`, as before: a set that is not full (it grows by a
//! whole new value, which Redis allocates at its length, where a write past its end would
//! double its allocation), that holds an erased slot, of one way (the classic table, whose
//! cursor never moves), or that cannot be read as one (not of this shape, a header of
//! zeros); a digest found whose entry is to be taken over (a lease that ran out, a commit
//! older than `max_age`); a key that holds nothing; a claim of a set that an earlier claim of
//! the same burst may write (`set.lua` decides it after that write, in the burst's order);
//! and every claim whose read or write failed or was refused.
//!
//! While a table's sets still grow, a read decides few claims and is a command for nothing:
//! the store then sends claims to `set.lua` alone, and reads one burst in 16 to learn when
//! the sets are full (`Reads`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use futures::future::join_all;
use redis::Value;
use tokio::time::Instant;

use super::entry::{self, State, ENTRY_BYTES, HEADER_BYTES};
use super::{Op, RedisStore};
use crate::dedup::shared::{now_ms, value_version};
use crate::dedup::Digest;
use crate::error::StoreError;

/// Whether the last claims' reads decided most of the sets they found (the sets are full),
/// so that the next claims read first. A read that decides nothing (a set that still grows)
/// is a command for nothing: then claims go through the script alone, but for one burst in
/// [`PROBE`], whose reads tell when the sets are full. A hint for the next bursts only.
#[derive(Debug)]
pub(super) struct Reads {
    useful: AtomicBool,
    skipped: AtomicU32,
}

/// While reads decide little, one burst in this many reads first all the same.
const PROBE: u32 = 16;

impl Default for Reads {
    fn default() -> Self {
        Reads {
            useful: AtomicBool::new(true),
            skipped: AtomicU32::new(0),
        }
    }
}

impl Reads {
    /// Whether the next burst reads its sets first.
    pub(super) fn first(&self) -> bool {
        self.useful.load(Ordering::Relaxed)
            || self.skipped.fetch_add(1, Ordering::Relaxed) % PROBE == PROBE - 1
    }

    /// Learns from a burst whose reads found `found` sets and decided `decided` claims.
    fn learn(&self, decided: usize, found: usize) {
        if found > 0 {
            self.useful.store(decided * 2 > found, Ordering::Relaxed);
        }
    }
}

/// What a plain read made of one claim.
#[derive(Debug, Clone)]
pub(super) enum Read {
    /// Decided: the script's answer (0: new, in slot 0), or an error to report.
    Decided(Result<i64, StoreError>),
    /// The set as stored, to decide here.
    Found(Vec<u8>),
    /// Left to the script.
    Script,
}

/// What `set.lua` needs to decide a claim, for one burst.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    pub(super) now: u64,
    /// `max_age` in milliseconds.
    pub(super) max_age: Option<u64>,
    pub(super) ways: u8,
    /// The value format to write (`value_version`).
    pub(super) version: u8,
    /// The state and time of a new entry: in flight until its lease ends, or done (a claim
    /// written done).
    pub(super) state: State,
    pub(super) time: u64,
    pub(super) owner: u64,
}

/// A claim decided on its set as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// Answered without a write: the script's answer (the code plus 4 times the slot).
    Answer(i64),
    /// Absent from a full set: new in `entry`'s slot (the cursor's) if `entry` and
    /// `new_header` are written while the set's header is still `header`.
    Write {
        header: [u8; HEADER_BYTES],
        entry: [u8; ENTRY_BYTES],
        new_header: [u8; HEADER_BYTES],
    },
    /// Left to the script.
    Script,
}

/// The script's answer codes of a claim, below 4 times its slot.
const IN_FLIGHT: i64 = 1;
const DUPLICATE: i64 = 2;

/// An erased entry's digest field (`set.lua`).
const FREE: [u8; 16] = [0xFF; 16];

/// Decides the claim of `digest` on `value`, its set as read, as `set.lua`'s `claim` would.
pub(super) fn decide(value: &[u8], digest: Digest, rules: &Rules) -> Decision {
    let ways = usize::from(rules.ways);
    let len = value.len();
    let size = HEADER_BYTES + ENTRY_BYTES * ways;
    if len < HEADER_BYTES || len > size || !(len - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
        return Decision::Script;
    }
    let (version, cursor) = (value[0], value[1]);
    if !(version == 1 || version == 2) || usize::from(cursor) >= ways || value[2] != rules.ways {
        return Decision::Script;
    }
    let entries = value[HEADER_BYTES..].chunks_exact(ENTRY_BYTES);
    let count = entries.len();
    let digest_bytes = digest.to_bytes();
    let mut erased = false;
    for (slot, entry) in entries.enumerate() {
        let state = entry[17];
        if state == 0 {
            erased |= entry[1..17] == FREE;
            continue;
        }
        if entry[1..17] != digest_bytes {
            continue;
        }
        let mut time = [0u8; 8];
        time.copy_from_slice(&entry[18..26]);
        let time = u64::from_be_bytes(time);
        let at = 4 * i64::try_from(slot).unwrap_or(i64::MAX / 8);
        let expired = if state == State::Done as u8 {
            // Committed longer ago than max_age: a body sent again on purpose.
            time != 0
                && rules
                    .max_age
                    .is_some_and(|age| rules.now.saturating_sub(time) > age)
        } else {
            // The owner let the lease lapse.
            time <= rules.now
        };
        return match (expired, state == State::Done as u8) {
            // Taken over: a write of the entry alone, which the script makes.
            (true, _) => Decision::Script,
            (false, true) => Decision::Answer(at + DUPLICATE),
            (false, false) => Decision::Answer(at + IN_FLIGHT),
        };
    }
    // A set of one way keeps its header at every write: a write checked by it would not
    // see another claim's.
    if erased || count < ways || ways == 1 {
        return Decision::Script;
    }
    let header = [value[0], cursor, rules.ways];
    let next = u8::try_from((usize::from(cursor) + 1) % ways).unwrap_or(0);
    Decision::Write {
        header,
        entry: entry::entry(cursor, digest, rules.state, rules.time, rules.owner),
        new_header: [rules.version, next, rules.ways],
    }
}

impl RedisStore {
    /// The rules of a burst of claims `op` at `now`.
    pub(super) fn rules(&self, op: Op, now: u64) -> Option<Rules> {
        let inner = &*self.inner;
        let (state, time) = match op {
            Op::ClaimDone => (State::Done, self.done_time(now)),
            _ => (State::InFlight, now.saturating_add(self.lease_ms())),
        };
        Some(Rules {
            now,
            max_age: inner
                .config
                .max_age
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            ways: u8::try_from(inner.geometry.ways()).ok()?,
            version: value_version(inner.config.max_age),
            state,
            time,
            owner: inner.owner,
        })
    }

    /// Reads the set of each digest with a `GET`, one pipeline per master.
    pub(super) async fn read_sets(&self, digests: &[Digest]) -> Vec<Read> {
        let inner = &*self.inner;
        let deadline = inner.link.deadline();
        self.plain_runs(
            digests,
            deadline,
            |key, _| {
                let mut cmd = entry::command("GET", 2, key.len() + 8);
                cmd.arg(key);
                cmd
            },
            |answer| match answer {
                Value::BulkString(value) => Read::Found(value),
                _ => Read::Script,
            },
        )
        .await
    }

    /// One command per digest (`command(key, digest)`), a pipeline per master; each answer
    /// as `read` makes it, and every claim of a pipeline that failed left to the script (or
    /// answered the error, once out of time: the script would wait again for a node that
    /// does not answer). The answers are in the order of `digests`.
    pub(super) async fn plain_runs(
        &self,
        digests: &[Digest],
        deadline: Instant,
        command: impl Fn(&str, Digest) -> redis::Cmd,
        read: impl Fn(Value) -> Read,
    ) -> Vec<Read> {
        let inner = &*self.inner;
        let runs = self.runs(digests.len(), |i| digests[i]);
        let answers = join_all(runs.iter().map(|run| {
            let mut pipe = redis::Pipeline::with_capacity(run.len());
            let mut key = String::with_capacity(inner.namespace.len() + 21);
            let mut node_slot = 0;
            for (j, &i) in run.iter().enumerate() {
                self.write_key(&mut key, inner.geometry.set_of(digests[i]));
                if j == 0 {
                    node_slot = super::key_slot(key.as_bytes());
                }
                pipe.add_command(command(&key, digests[i]));
            }
            async move {
                inner
                    .link
                    .pipeline(node_slot, &pipe, run.len(), deadline)
                    .await
            }
        }))
        .await;
        let mut out = vec![Read::Script; digests.len()];
        for (run, answer) in runs.iter().zip(answers) {
            match answer {
                Ok(values) if values.len() == run.len() => {
                    for (&i, value) in run.iter().zip(values) {
                        out[i] = read(value);
                    }
                }
                Ok(_) => {}
                Err(error) if Instant::now() >= deadline => {
                    for &i in run {
                        out[i] = Read::Decided(Err(error.clone()));
                    }
                }
                Err(_) => {}
            }
        }
        out
    }

    /// Decides each claim `op` whose set was read: answered, or written by `write.lua`; the
    /// answers are in the order of `digests`, `None` for a claim left to the script.
    pub(super) async fn decide_reads(
        &self,
        op: Op,
        digests: &[Digest],
        reads: Vec<Read>,
    ) -> Vec<Option<Result<i64, StoreError>>> {
        let mut answers = vec![None; digests.len()];
        let Some(rules) = self.rules(op, now_ms()) else {
            return answers;
        };
        let mut writes = Vec::new();
        // The sets that an earlier claim of this burst may still write (here, or through the
        // script): a later claim of one was read before that write, so the script decides
        // it, after the writes, as the burst's order has it.
        let mut pending = HashSet::new();
        let found = reads
            .iter()
            .filter(|read| matches!(read, Read::Found(_)))
            .count();
        let mut answered = 0;
        for (i, read) in reads.into_iter().enumerate() {
            let set = self.inner.geometry.set_of(digests[i]);
            let decision = match read {
                Read::Decided(answer) => {
                    answers[i] = Some(answer);
                    continue;
                }
                Read::Found(_) if pending.contains(&set) => Decision::Script,
                Read::Found(value) => decide(&value, digests[i], &rules),
                Read::Script => Decision::Script,
            };
            match decision {
                Decision::Answer(code) => {
                    answered += 1;
                    answers[i] = Some(Ok(code));
                }
                Decision::Script => {
                    pending.insert(set);
                }
                write @ Decision::Write { .. } => {
                    pending.insert(set);
                    writes.push((i, write));
                }
            }
        }
        if writes.is_empty() {
            self.inner.reads.learn(answered, found);
            return answers;
        }
        let runs = self.runs(writes.len(), |j| digests[writes[j].0]);
        let written = join_all(runs.iter().map(|run| {
            let run: Vec<(Digest, &Decision)> = run
                .iter()
                .map(|&j| (digests[writes[j].0], &writes[j].1))
                .collect();
            async move { self.write_run(&run).await }
        }))
        .await;
        for (run, written) in runs.iter().zip(written) {
            for (&j, answer) in run.iter().zip(written) {
                answered += usize::from(matches!(answer, Some(Ok(_))));
                answers[writes[j].0] = answer;
            }
        }
        self.inner.reads.learn(answered, found);
        answers
    }

    /// One run of `write.lua` on `writes`, on the node of the first one's set: each claim's
    /// answer when written (new, in its slot), else `None` (to the script).
    async fn write_run(
        &self,
        writes: &[(Digest, &Decision)],
    ) -> Vec<Option<Result<i64, StoreError>>> {
        let inner = &*self.inner;
        let count = writes.len();
        let mut evalsha = redis::Cmd::with_capacity(
            5 + 4 * count,
            100 + count * (inner.namespace.len() + 50 + 2 * HEADER_BYTES + ENTRY_BYTES),
        );
        evalsha
            .arg("EVALSHA")
            .arg(inner.write_script.get_hash())
            .arg(1);
        let mut key = String::with_capacity(inner.namespace.len() + 21);
        let mut slot = 0;
        let decisions = writes
            .iter()
            .filter_map(|(digest, decision)| match decision {
                Decision::Write {
                    header,
                    entry,
                    new_header,
                } => Some((*digest, header, entry, new_header)),
                _ => None,
            });
        for (j, (digest, ..)) in decisions.clone().enumerate() {
            self.write_key(&mut key, inner.geometry.set_of(digest));
            if j == 0 {
                slot = super::key_slot(key.as_bytes());
                // The first key routes the run.
                evalsha.arg(key.as_str());
            }
            evalsha.arg(key.as_str());
        }
        for (_, header, ..) in decisions.clone() {
            evalsha.arg(&header[..]);
        }
        for (_, _, entry, _) in decisions.clone() {
            evalsha.arg(&entry[..]);
        }
        for (.., new_header) in decisions {
            evalsha.arg(&new_header[..]);
        }
        let deadline = inner.link.deadline();
        let answers = match inner.link.eval(&inner.write_script, slot, &evalsha).await {
            Ok(value) => redis::from_redis_value::<Vec<i64>>(&value).ok(),
            Err(error) if Instant::now() >= deadline => {
                return vec![Some(Err(error)); count];
            }
            Err(_) => None,
        };
        match answers {
            Some(answers) if answers.len() == count => writes
                .iter()
                .zip(answers)
                .map(|((_, decision), written)| match decision {
                    // New, in the entry's slot.
                    Decision::Write { entry, .. } if written == 1 => {
                        Some(Ok(4 * i64::from(entry[0])))
                    }
                    _ => None,
                })
                .collect(),
            _ => vec![None; count],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            now: 1_000,
            max_age: None,
            ways: 2,
            version: 1,
            state: State::InFlight,
            time: 61_000,
            owner: 9,
        }
    }

    fn digest(n: u8) -> Digest {
        Digest::from_bytes([n; 16])
    }

    fn set(cursor: u8, entries: &[[u8; ENTRY_BYTES]]) -> Vec<u8> {
        let mut value = vec![1, cursor, 2];
        for entry in entries {
            value.extend_from_slice(entry);
        }
        value
    }

    #[test]
    fn a_copy_found_is_answered_without_a_write() {
        let done = entry::entry(0, digest(1), State::Done, 0, 5);
        let flying = entry::entry(1, digest(2), State::InFlight, 2_000, 5);
        let value = set(0, &[done, flying]);
        assert_eq!(decide(&value, digest(1), &rules()), Decision::Answer(2));
        assert_eq!(decide(&value, digest(2), &rules()), Decision::Answer(4 + 1));
    }

    #[test]
    fn an_absent_digest_of_a_full_set_is_written_in_the_cursors_slot() {
        let first = entry::entry(0, digest(1), State::Done, 0, 5);
        let second = entry::entry(1, digest(2), State::Done, 0, 5);
        assert_eq!(
            decide(&set(1, &[first, second]), digest(3), &rules()),
            Decision::Write {
                header: [1, 1, 2],
                entry: entry::entry(1, digest(3), State::InFlight, 61_000, 9),
                new_header: [1, 0, 2],
            }
        );
        let done = Rules {
            version: 2,
            state: State::Done,
            time: 1_000,
            ..rules()
        };
        assert_eq!(
            decide(&set(0, &[first, second]), digest(3), &done),
            Decision::Write {
                header: [1, 0, 2],
                entry: entry::entry(0, digest(3), State::Done, 1_000, 9),
                new_header: [2, 1, 2],
            },
            "the header is written in the version of the claim"
        );
    }

    #[test]
    fn takeovers_erased_slots_and_strange_sets_go_to_the_script() {
        let lapsed = entry::entry(0, digest(1), State::InFlight, 1_000, 5);
        assert_eq!(
            decide(&set(1, &[lapsed]), digest(1), &rules()),
            Decision::Script
        );
        let old = entry::entry(0, digest(1), State::Done, 100, 5);
        let aged = Rules {
            max_age: Some(500),
            ..rules()
        };
        assert_eq!(decide(&set(1, &[old]), digest(1), &aged), Decision::Script);
        assert_eq!(
            decide(&set(1, &[old]), digest(1), &rules()),
            Decision::Answer(2)
        );
        let mut erased = [0u8; ENTRY_BYTES];
        erased[1..17].copy_from_slice(&FREE);
        assert_eq!(
            decide(&set(0, &[old, erased]), digest(3), &rules()),
            Decision::Script
        );
        assert_eq!(
            decide(&set(1, &[old]), digest(3), &rules()),
            Decision::Script,
            "grows"
        );
        let one_way = Rules { ways: 1, ..rules() };
        let full_of_one = [&[1, 0, 1][..], &old[..]].concat();
        assert_eq!(
            decide(&full_of_one, digest(3), &one_way),
            Decision::Script,
            "one way"
        );
        assert_eq!(
            decide(&[0, 0, 0], digest(3), &rules()),
            Decision::Script,
            "zero header"
        );
        assert_eq!(
            decide(&[1, 0, 4], digest(3), &rules()),
            Decision::Script,
            "other ways"
        );
        assert_eq!(
            decide(&[1, 0], digest(3), &rules()),
            Decision::Script,
            "short"
        );
        assert_eq!(
            decide(&[1, 2, 2], digest(3), &rules()),
            Decision::Script,
            "cursor"
        );
    }
}
