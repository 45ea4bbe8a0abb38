//! Batches for the http sink: a burst's records cut into request bodies of `batch_size`
//! records, or records from concurrent `handle` calls gathered into one; each record answered
//! with its batch's outcome.
//!
//! A burst ([`BatchPoster::handle_batch`]) is cut at once, in order, into batches of
//! `batch_size` records, all sent concurrently; what is left, fewer than `batch_size`, is gathered with the
//! records that follow, as the records of single `handle` calls are, by the sinks' batcher
//! ([`crate::sink::batcher`]), each record a request of its own: a gathered batch is sent
//! when it holds `batch_size` records or `batch_timeout` after its first record, whichever
//! comes first. So a slow stream still makes full batches, at the cost of up to
//! `batch_timeout` of delay for a burst's last records. A batch's records keep their order of
//! arrival. A record that
//! cannot be framed (in `lines`, one holding a `\n` or an empty one; in `json-array`, one that
//! is not a JSON value) never joins a batch: it is refused, and so goes to the dead-letter
//! with the reason, while the rest of the stream goes on.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use super::config::BatchFormat;
use super::{digest, Poster};
use crate::sink::batcher::{self, Settings};
use crate::sink::HandlerError;

/// Sends full batches, and hands the other records to the task that gathers them; that task
/// ends when this is dropped.
#[derive(Debug)]
pub(super) struct BatchPoster {
    /// Gathers records into batches and sends each in a task of its own, so that a slow
    /// request does not hold back the next batch (the endpoint's connection bound still
    /// applies).
    gathered: batcher::Batcher,
    poster: Arc<Poster>,
    size: usize,
    format: BatchFormat,
}

impl BatchPoster {
    /// Starts gathering batches of up to `size` records for `poster`.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub(super) fn start(
        poster: Arc<Poster>,
        size: usize,
        timeout: Duration,
        format: BatchFormat,
    ) -> Self {
        let size = size.max(1);
        let settings = Settings::new(size).timeout(timeout).flushes(usize::MAX);
        let send = {
            let poster = Arc::clone(&poster);
            move |records: Vec<Bytes>| send(Arc::clone(&poster), records, format)
        };
        BatchPoster {
            gathered: batcher::Batcher::spawn("the http sink's batcher", settings, send),
            poster,
            size,
            format,
        }
    }

    /// Sends the records of a burst in full batches cut from it in order, all at once, and
    /// gathers the rest with the records that follow; answers each record with its batch's
    /// outcome, or with the reason it cannot be framed.
    pub(super) async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        let mut outcomes = vec![Ok(()); bodies.len()];
        // The framable records, with their place in the burst.
        let mut records = Vec::with_capacity(bodies.len());
        for (at, body) in bodies.into_iter().enumerate() {
            match check(self.format, &body) {
                Ok(()) => records.push((at, body)),
                Err(reason) => outcomes[at] = Err(HandlerError::Reject(reason)),
            }
        }
        let (full, rest) = records.split_at(records.len() / self.size * self.size);
        let sent = full.chunks(self.size).map(|batch| async move {
            let outcome = deliver(
                &self.poster,
                self.format,
                batch.iter().map(|(_, body)| body),
            )
            .await;
            (batch, outcome)
        });
        let gathered = rest
            .iter()
            .map(|(at, body)| async move { (*at, self.gathered.submit_one(body.clone()).await) });
        let (sent, gathered) = futures::future::join(
            futures::future::join_all(sent),
            futures::future::join_all(gathered),
        )
        .await;
        for (batch, outcome) in sent {
            for (at, _) in batch {
                outcomes[*at] = outcome.clone();
            }
        }
        for (at, outcome) in gathered {
            outcomes[at] = outcome;
        }
        outcomes
    }

    /// Sends `body` in the next gathered batch; answers with that batch's outcome.
    pub(super) async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        check(self.format, &body).map_err(HandlerError::Reject)?;
        self.gathered.submit_one(body).await
    }
}

/// Sends one gathered batch; its outcome is each of its records'.
async fn send(
    poster: Arc<Poster>,
    records: Vec<Bytes>,
    format: BatchFormat,
) -> Vec<Result<(), HandlerError>> {
    let outcome = deliver(&poster, format, records.iter()).await;
    vec![outcome; records.len()]
}

/// Sends `records`, each of which has passed [`check`], as one batch. Its idempotency key is
/// a digest of its records' digests, in order.
async fn deliver<'a>(
    poster: &Poster,
    format: BatchFormat,
    records: impl ExactSizeIterator<Item = &'a Bytes> + Clone,
) -> Result<(), HandlerError> {
    let mut digests = Vec::with_capacity(records.len() * 16);
    for record in records.clone() {
        digests.extend_from_slice(&digest(record).to_le_bytes());
    }
    poster
        .deliver(frame(format, records), digest(&digests))
        .await
}

/// Why `body` cannot be a record of a `format` batch, if it cannot.
pub(super) fn check(format: BatchFormat, body: &[u8]) -> Result<(), String> {
    match format {
        BatchFormat::Lines if body.is_empty() => {
            Err("an empty record cannot be framed in `lines` batches (it would be a blank line, which receivers skip)".into())
        }
        BatchFormat::Lines => match memchr::memchr(b'\n', body) {
            Some(at) => Err(format!(
                "the record holds a line break (at byte {at}), so `lines` batches cannot frame it"
            )),
            None => Ok(()),
        },
        BatchFormat::JsonArray => serde_json::from_slice::<serde::de::IgnoredAny>(body)
            .map(|_| ())
            .map_err(|error| {
                format!("the record is not a JSON value ({error}), so `json-array` batches cannot frame it")
            }),
    }
}

/// The request body of `records` in `format`; each record has passed [`check`].
pub(super) fn frame<'a>(
    format: BatchFormat,
    records: impl ExactSizeIterator<Item = &'a Bytes> + Clone,
) -> Bytes {
    let n = records.len();
    let size: usize = records.clone().map(Bytes::len).sum::<usize>() + n + 2;
    let mut body = BytesMut::with_capacity(size);
    match format {
        BatchFormat::Lines => {
            for record in records {
                body.put_slice(record);
                body.put_u8(b'\n');
            }
        }
        BatchFormat::JsonArray => {
            body.put_u8(b'[');
            for (i, record) in records.enumerate() {
                if i > 0 {
                    body.put_u8(b',');
                }
                body.put_slice(record);
            }
            body.put_u8(b']');
        }
    }
    body.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(texts: &[&'static str]) -> Vec<Bytes> {
        texts
            .iter()
            .map(|t| Bytes::from_static(t.as_bytes()))
            .collect()
    }

    #[test]
    fn lines_end_each_record_with_a_newline() {
        let r = records(&["a", "bc", "d"]);
        assert_eq!(frame(BatchFormat::Lines, r.iter()), "a\nbc\nd\n");
    }

    #[test]
    fn json_arrays_join_the_records_with_commas() {
        let r = records(&[r#"{"a":1}"#, "2", r#""x""#]);
        assert_eq!(
            frame(BatchFormat::JsonArray, r.iter()),
            r#"[{"a":1},2,"x"]"#
        );
        let one = records(&["[]"]);
        assert_eq!(frame(BatchFormat::JsonArray, one.iter()), "[[]]");
    }

    #[test]
    fn records_that_cannot_be_framed_are_named() {
        assert!(check(BatchFormat::Lines, b"a b").is_ok());
        assert_eq!(
            check(BatchFormat::Lines, b"a\nb").unwrap_err(),
            "the record holds a line break (at byte 1), so `lines` batches cannot frame it"
        );
        assert!(check(BatchFormat::Lines, b"")
            .unwrap_err()
            .starts_with("an empty record cannot be framed"));
        assert!(check(BatchFormat::JsonArray, b" {\"a\": [1, 2]}\n").is_ok());
        assert!(check(BatchFormat::JsonArray, b"{\"a\":")
            .unwrap_err()
            .starts_with("the record is not a JSON value"));
        assert!(check(BatchFormat::JsonArray, b"1 2").is_err());
    }
}
