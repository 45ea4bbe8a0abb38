//! A handler call's records while the handler has them ([`Handed`]): those not answered yet,
//! by their place in the call, taken out part by part as the handler answers them
//! ([`Handler::handle_in_parts`](crate::sink::Handler::handle_in_parts)); the digests they
//! opened in [`Held`]; and their count in the pipeline's `handling`.
//!
//! It is also the call's drop guard: dropped mid-way (a burst's task dropped), it closes the
//! digests still open, whose copies, dropped, requeue themselves, and counts its records out.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::held::{Held, Owner};
use super::Record;
use crate::dedup::Digest;
use crate::nsq::Message;
use crate::sink::{HandlerError, Part};

/// A handler call's records, see the module docs.
pub(super) struct Handed<'a> {
    /// The records not answered yet, by their place in the call.
    unanswered: Vec<Option<Record>>,
    /// How many of `unanswered` are there.
    left: usize,
    /// The digest each record opened in `held`, by its place, until it is closed.
    open: Vec<Option<(Digest, Owner)>>,
    /// How many of `open` are there.
    opened: usize,
    held: &'a Held,
    /// The pipeline's count of records with the handler.
    handling: &'a AtomicUsize,
    /// How many records this call still counts in `handling`.
    counted: usize,
}

/// The records of one part, in the call's order, each with its place and its result.
#[derive(Default)]
pub(super) struct Answered {
    pub(super) places: Vec<usize>,
    pub(super) records: Vec<Record>,
    pub(super) results: Vec<Result<(), HandlerError>>,
}

impl<'a> Handed<'a> {
    /// The records of a call, counted in `handling` until they are answered.
    pub(super) fn new(held: &'a Held, handling: &'a AtomicUsize, records: Vec<Record>) -> Self {
        let count = records.len();
        handling.fetch_add(count, Ordering::Relaxed);
        let open: Vec<_> = records
            .iter()
            .map(|r| Some((r.digest?, r.held_by?)))
            .collect();
        Handed {
            opened: open.iter().flatten().count(),
            open,
            unanswered: records.into_iter().map(Some).collect(),
            left: count,
            held,
            handling,
            counted: count,
        }
    }

    /// The records not answered yet, in the call's order.
    pub(super) fn unanswered(&self) -> impl Iterator<Item = &Record> {
        self.unanswered.iter().flatten()
    }

    /// How many records are not answered yet.
    pub(super) fn left(&self) -> usize {
        self.left
    }

    /// Takes the records `part` answers, in the call's order. A result for a record answered
    /// already, or for a place beyond the call, is ignored (and logged).
    pub(super) fn take(&mut self, mut part: Part) -> Answered {
        // Stable: of two results for one record in a part, the first is kept.
        part.sort_by_key(|(place, _)| *place);
        let mut answered = Answered {
            places: Vec::with_capacity(part.len()),
            records: Vec::with_capacity(part.len()),
            results: Vec::with_capacity(part.len()),
        };
        let mut ignored = 0;
        for (place, result) in part {
            match self.unanswered.get_mut(place).and_then(Option::take) {
                Some(record) => {
                    answered.places.push(place);
                    answered.records.push(record);
                    answered.results.push(result);
                }
                None => ignored += 1,
            }
        }
        if ignored > 0 {
            tracing::warn!(
                ignored,
                "The handler answered records it had answered already, or was never handed; those results are ignored."
            );
        }
        self.left -= answered.records.len();
        answered
    }

    /// Takes every record not answered yet, each failed with `error`: the handler's answer
    /// ended without them, or it panicked.
    pub(super) fn fail_rest(&mut self, error: &Result<(), HandlerError>) -> Answered {
        let part = (0..self.unanswered.len())
            .filter(|&place| self.unanswered[place].is_some())
            .map(|place| (place, error.clone()))
            .collect();
        self.take(part)
    }

    /// Takes every record not answered yet, to requeue (abandoned at shutdown).
    pub(super) fn abandon(&mut self) -> Vec<Record> {
        self.fail_rest(&Ok(())).records
    }

    /// Closes every digest still open: the copies held beside their records.
    pub(super) fn close_all(&mut self) -> Vec<Message> {
        let places: Vec<usize> = (0..self.open.len()).collect();
        self.close_many(&places).into_iter().flatten().collect()
    }

    /// Whether any record still has its digest open in `held`.
    pub(super) fn any_open(&self) -> bool {
        self.opened > 0
    }

    /// Closes the digests the records at `places` opened, their records settled: the copies
    /// held beside each, in the order of `places`, for the caller to answer.
    pub(super) fn close_many(&mut self, places: &[usize]) -> Vec<Vec<Message>> {
        let mut at = Vec::with_capacity(places.len());
        let mut opened = Vec::with_capacity(places.len());
        for (i, &place) in places.iter().enumerate() {
            if let Some(open) = self.open.get_mut(place).and_then(Option::take) {
                at.push(i);
                opened.push(open);
            }
        }
        let mut copies: Vec<Vec<Message>> = std::iter::repeat_with(Vec::new)
            .take(places.len())
            .collect();
        if opened.is_empty() {
            return copies;
        }
        self.opened -= opened.len();
        for (i, held) in at.into_iter().zip(self.held.close_many(&opened)) {
            copies[i] = held;
        }
        copies
    }

    /// `count` records are answered: counted out of `handling`.
    pub(super) fn answered(&mut self, count: usize) {
        let count = count.min(self.counted);
        self.counted -= count;
        self.handling.fetch_sub(count, Ordering::Relaxed);
    }
}

impl Drop for Handed<'_> {
    fn drop(&mut self) {
        drop(self.close_all());
        self.handling.fetch_sub(self.counted, Ordering::Relaxed);
    }
}
