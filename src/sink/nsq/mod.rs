//! The `nsq` sink: republishes unique bodies to a topic (e.g. `<topic>.unique`), group-committed
//! into `MPUB`s.
//!
//! Each [`handle_batch`](Handler::handle_batch) queues its burst's records as requests of at
//! most [`MAX_BATCH_RECORDS`] records and [`MAX_BATCH_BYTES`] bytes, and waits;
//! [`handle`](Handler::handle) queues a request of one record. The sink's [`Batcher`] takes
//! every request queued by the time a publish slot is free (within the same bounds) and publishes
//! their records with one `MPUB` (one `PUB` for a lone record); nsqd's one `OK` answers every
//! record of the batch, and only then are their callers told, so a source message is finished
//! only once its copy is stored downstream. An error fails every record of its `MPUB`
//! together: their messages are requeued, and none is lost. Up to
//! [`PUBLISH_SLOTS`] batches are on the wire at once, spread round-robin over the destination
//! nsqd with fail-over to the next one, as `nsq_to_nsq` does.
//!
//! A record larger than nsqd's default `--max-msg-size` (1 MiB) is never sent: nsqd would
//! close the connection over it, failing every record batched with it, again and again. It is
//! rejected to the dead-letter with that reason.

mod settings;

use std::sync::Arc;

use bytes::Bytes;

use super::batcher::{Batcher, Results, Settings};
use super::{BuiltIn, Handler, HandlerError, Watch};
use crate::nsq::{Producer, ProducerConfig};
pub use settings::NsqSinkConfig;
pub(crate) use settings::{producer_config, sink_keys};

/// The largest record sent: nsqd's default `--max-msg-size`.
pub(crate) const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// The most bytes of records in one `MPUB`: under nsqd's default `--max-body-size` (5 MiB),
/// with room for the 4-byte length of each record.
pub(crate) const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The most records in one `MPUB`.
pub(crate) const MAX_BATCH_RECORDS: usize = 1024;

/// Batches on the wire at once: enough to keep a pipeline to each of a few nsqd busy.
pub(crate) const PUBLISH_SLOTS: usize = 4;

/// Publishes each body to `topic`; success means nsqd answered `OK` to the `MPUB` (or `PUB`)
/// that carried it.
pub struct NsqSink {
    /// The batching task's queue; the task ends when this is dropped.
    batcher: Batcher,
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
        let settings = Settings::new(MAX_BATCH_RECORDS)
            .max_bytes(MAX_BATCH_BYTES)
            .flushes(PUBLISH_SLOTS);
        let publish = {
            let (producer, topic): (_, Arc<str>) = (producer.clone(), topic.as_str().into());
            move |bodies: Vec<Bytes>| publish(Arc::clone(&producer), Arc::clone(&topic), bodies)
        };
        Ok(NsqSink {
            batcher: Batcher::spawn("the nsq sink's publisher", settings, publish),
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

/// Publishes one batch with one `MPUB` (one `PUB` for a lone record); nsqd's answer is every
/// record's.
async fn publish(producer: Arc<Producer>, topic: Arc<str>, bodies: Vec<Bytes>) -> Results {
    let count = bodies.len();
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
    vec![answer; count]
}

/// The refusal of a record nsqd would refuse, or `None`.
fn too_large(body: &Bytes) -> Option<HandlerError> {
    (body.len() > MAX_RECORD_BYTES).then(|| {
        HandlerError::Reject(format!(
            "a body of {} bytes is larger than nsqd's default --max-msg-size ({MAX_RECORD_BYTES} \
             bytes); nsqd would refuse it",
            body.len()
        ))
    })
}

impl Handler for NsqSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        if let Some(refusal) = too_large(&body) {
            return Err(refusal);
        }
        self.batcher.submit_one(body).await
    }

    fn handles_batches(&self) -> bool {
        true
    }

    /// The burst's records go out in as few `MPUB`s as the bounds allow; every record of an
    /// `MPUB` gets its answer. A record nsqd would refuse is rejected alone, unsent.
    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        let mut results: Vec<Result<(), HandlerError>> = Vec::with_capacity(bodies.len());
        // Each request, with the places in `results` of its records.
        let mut requests = Vec::new();
        let mut chunk: Vec<Bytes> = Vec::new();
        let mut chunk_bytes = 0;
        let mut chunk_slots: Vec<usize> = Vec::new();
        for body in bodies {
            if let Some(refusal) = too_large(&body) {
                results.push(Err(refusal));
                continue;
            }
            if !chunk.is_empty()
                && (chunk.len() >= MAX_BATCH_RECORDS || chunk_bytes + body.len() > MAX_BATCH_BYTES)
            {
                let slots = std::mem::take(&mut chunk_slots);
                requests.push((self.batcher.submit(std::mem::take(&mut chunk)), slots));
                chunk_bytes = 0;
            }
            chunk_bytes += body.len();
            chunk_slots.push(results.len());
            results.push(Ok(()));
            chunk.push(body);
        }
        if !chunk.is_empty() {
            requests.push((self.batcher.submit(chunk), chunk_slots));
        }
        let (answers, slots): (Vec<_>, Vec<_>) = requests.into_iter().unzip();
        let answers = futures::future::join_all(answers).await;
        for (answer, slots) in answers.into_iter().zip(slots) {
            for (slot, result) in slots.into_iter().zip(answer) {
                results[slot] = result;
            }
        }
        results
    }
}

impl BuiltIn for NsqSink {
    fn watch(&self) -> Watch {
        Watch {
            refused: Some(Box::pin(self.refused())),
            ..Watch::default()
        }
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
