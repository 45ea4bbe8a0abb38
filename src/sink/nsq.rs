//! The `nsq` sink: republishes unique bodies to a topic (e.g. `<topic>.unique`), group-committed
//! into `MPUB`s.
//!
//! Each [`handle`](Handler::handle) queues its record and waits. A batching task takes every
//! record queued by the time a publish slot is free (up to [`MAX_BATCH_RECORDS`] records and
//! [`MAX_BATCH_BYTES`] bytes) and publishes them with one `MPUB` (one `PUB` for a lone record);
//! nsqd's one `OK` answers every record of the batch, and only then are their callers told, so
//! a source message is finished only once its copy is stored downstream. An error fails every
//! record of its batch: their messages are requeued, and none is lost. Up to
//! [`PUBLISH_SLOTS`] batches are on the wire at once, spread round-robin over the destination
//! nsqd with fail-over to the next one, as `nsq_to_nsq` does.
//!
//! A record larger than nsqd's default `--max-msg-size` (1 MiB) is never sent: nsqd would
//! close the connection over it, failing every record batched with it, again and again. It is
//! rejected to the dead-letter with that reason.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Handler, HandlerError};
use crate::nsq::{Producer, ProducerConfig};

/// The largest record sent: nsqd's default `--max-msg-size`.
pub(crate) const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// The most bytes of records in one `MPUB`: under nsqd's default `--max-body-size` (5 MiB),
/// with room for the 4-byte length of each record.
pub(crate) const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The most records in one `MPUB`.
pub(crate) const MAX_BATCH_RECORDS: usize = 1024;

/// Batches on the wire at once: enough to keep a pipeline to each of a few nsqd busy.
pub(crate) const PUBLISH_SLOTS: usize = 4;

/// A record waiting to be published, and where to tell its caller how it went.
struct Pending {
    body: Bytes,
    done: oneshot::Sender<Result<(), HandlerError>>,
}

/// Publishes each body to `topic`; success means nsqd answered `OK` to the `MPUB` (or `PUB`)
/// that carried it.
pub struct NsqSink {
    /// The batching task's queue; the task ends when this sender is dropped.
    queue: mpsc::UnboundedSender<Pending>,
    topic: String,
    producer: Arc<Producer>,
}

impl std::fmt::Debug for NsqSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsqSink")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl NsqSink {
    /// A sink publishing to `topic` with a producer of `config`.
    ///
    /// # Errors
    ///
    /// The producer's configuration error (no address).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn new(config: ProducerConfig, topic: String) -> Result<Self, crate::nsq::Error> {
        let producer = Arc::new(Producer::new(config)?);
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(publish_batches(producer.clone(), topic.clone(), requests));
        Ok(NsqSink {
            queue,
            topic,
            producer,
        })
    }

    /// Completes with the first refusal of an nsqd that no retry changes (see
    /// [`Producer::refused`]).
    pub fn refused(
        &self,
    ) -> impl std::future::Future<Output = Arc<crate::nsq::Error>> + Send + 'static {
        self.producer.refused()
    }

    /// The destination topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

/// The batching task: waits for a free publish slot, then publishes everything queued.
async fn publish_batches(
    producer: Arc<Producer>,
    topic: String,
    mut requests: mpsc::UnboundedReceiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(PUBLISH_SLOTS));
    let topic: Arc<str> = topic.into();
    // A record that did not fit the previous batch starts the next one.
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for a slot first, so that records queue up into bigger batches meanwhile.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(pending) => pending,
            None => match requests.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let mut bytes = first.body.len();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_RECORDS {
            match requests.try_recv() {
                Ok(pending) if bytes + pending.body.len() > MAX_BATCH_BYTES => {
                    carried = Some(pending);
                    break;
                }
                Ok(pending) => {
                    bytes += pending.body.len();
                    batch.push(pending);
                }
                Err(_) => break,
            }
        }
        let (producer, topic) = (producer.clone(), topic.clone());
        tokio::spawn(async move {
            let (bodies, replies): (Vec<Bytes>, Vec<_>) =
                batch.into_iter().map(|p| (p.body, p.done)).unzip();
            let result = match <[Bytes; 1]>::try_from(bodies) {
                Ok([body]) => producer.publish(&topic, body).await,
                Err(bodies) => producer.multi_publish(&topic, bodies).await,
            };
            let answer = result.map_err(|error| match error {
                // A bad topic name never gets better; everything else (a down nsqd,
                // E_MPUB_FAILED, a timeout) may.
                error @ crate::nsq::Error::Config { .. } => HandlerError::Reject(error.to_string()),
                error => HandlerError::Retry(error.to_string()),
            });
            for reply in replies {
                // A caller that stopped waiting has nothing to be told.
                let _ = reply.send(answer.clone());
            }
            drop(slot);
        });
    }
}

impl Handler for NsqSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        if body.len() > MAX_RECORD_BYTES {
            return Err(HandlerError::Reject(format!(
                "a body of {} bytes is larger than nsqd's default --max-msg-size ({MAX_RECORD_BYTES} \
                 bytes); nsqd would refuse it",
                body.len()
            )));
        }
        let (done, published) = oneshot::channel();
        let gone = || HandlerError::Retry("the nsq sink's publisher has stopped".into());
        self.queue
            .send(Pending { body, done })
            .map_err(|_| gone())?;
        published.await.unwrap_or_else(|_| Err(gone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_record_nsqd_would_refuse_goes_to_the_dead_letter_unsent() {
        // Nothing listens there: the record must be refused before any connection is tried.
        let sink =
            NsqSink::new(ProducerConfig::new(vec!["127.0.0.1:1".into()]), "t".into()).unwrap();
        let error = sink
            .handle(Bytes::from(vec![b'x'; MAX_RECORD_BYTES + 1]))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            HandlerError::Reject(format!(
                "a body of {} bytes is larger than nsqd's default --max-msg-size \
                 ({MAX_RECORD_BYTES} bytes); nsqd would refuse it",
                MAX_RECORD_BYTES + 1
            ))
        );
    }
}
