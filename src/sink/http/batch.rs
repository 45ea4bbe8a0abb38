//! Batches for the http sink: records from concurrent `handle` calls gathered into one request
//! body, each caller answered with its batch's outcome.
//!
//! A batch is sent when it holds `batch_size` records or `batch_timeout` after its first
//! record, whichever comes first. Its records keep their order of arrival. A record that
//! cannot be framed (in `lines`, one holding a `\n` or an empty one; in `json-array`, one that
//! is not a JSON value) never joins a batch: it is refused, and so goes to the dead-letter
//! with the reason, while the rest of the stream goes on.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};

use super::config::BatchFormat;
use super::{digest, Poster};
use crate::sink::HandlerError;

/// A record waiting for its batch, and who waits for the outcome.
struct Pending {
    body: Bytes,
    digest: u128,
    done: oneshot::Sender<Result<(), HandlerError>>,
}

/// Hands records to the task that gathers them; that task ends when this is dropped.
#[derive(Debug)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    format: BatchFormat,
}

impl Batcher {
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
        let (queue, records) = mpsc::unbounded_channel();
        tokio::spawn(gather(records, poster, size.max(1), timeout, format));
        Batcher { queue, format }
    }

    /// Sends `body` in the next batch; answers with that batch's outcome.
    pub(super) async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        check(self.format, &body).map_err(HandlerError::Reject)?;
        let stopped = || HandlerError::Retry("the http sink's batcher has stopped".into());
        let (done, outcome) = oneshot::channel();
        let digest = digest(&body);
        self.queue
            .send(Pending { body, digest, done })
            .map_err(|_| stopped())?;
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Gathers batches until every [`Batcher`] handle is gone; each batch is sent in its own task,
/// so that a slow request does not hold back the next batch (the endpoint's connection bound
/// still applies).
async fn gather(
    mut records: mpsc::UnboundedReceiver<Pending>,
    poster: Arc<Poster>,
    size: usize,
    timeout: Duration,
    format: BatchFormat,
) {
    let mut batch = Vec::with_capacity(size);
    loop {
        if records.recv_many(&mut batch, size).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while batch.len() < size {
            let room = size - batch.len();
            tokio::select! {
                taken = records.recv_many(&mut batch, room) => if taken == 0 { break },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let full = std::mem::replace(&mut batch, Vec::with_capacity(size));
        tokio::spawn(send(Arc::clone(&poster), full, format));
    }
}

/// Sends one batch and answers each of its records.
async fn send(poster: Arc<Poster>, batch: Vec<Pending>, format: BatchFormat) {
    let body = frame(format, batch.iter().map(|p| &p.body));
    // The key of a batch: a digest of its records' digests, in order.
    let mut digests = Vec::with_capacity(batch.len() * 16);
    for pending in &batch {
        digests.extend_from_slice(&pending.digest.to_le_bytes());
    }
    let outcome = poster.deliver(body, digest(&digests)).await;
    for pending in batch {
        // A caller that gave up (shutdown) no longer listens; its message is requeued.
        let _ = pending.done.send(outcome.clone());
    }
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
