//! The `nsq` sink: republishes unique bodies to a topic (e.g. `<topic>.unique`).

use bytes::Bytes;

use super::{Handler, HandlerError};
use crate::nsq::{Producer, ProducerConfig};

/// Publishes each body to `topic` on one of several nsqd (round-robin, moving on when one is
/// down). Success means nsqd answered `OK` to the `PUB`, so the source message is finished only
/// once its copy is stored downstream.
pub struct NsqSink {
    producer: Producer,
    topic: String,
}

impl std::fmt::Debug for NsqSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsqSink")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl NsqSink {
    /// A sink publishing to `topic` on `nsqd_tcp_addresses`.
    ///
    /// # Errors
    ///
    /// The producer's configuration error (no address).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn new(nsqd_tcp_addresses: Vec<String>, topic: String) -> Result<Self, crate::nsq::Error> {
        let producer = Producer::new(ProducerConfig::new(nsqd_tcp_addresses))?;
        Ok(NsqSink { producer, topic })
    }

    /// The destination topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

impl Handler for NsqSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        match self.producer.publish(&self.topic, body).await {
            Ok(()) => Ok(()),
            // A bad topic name never gets better; everything else (a down nsqd, E_PUB_FAILED,
            // a timeout) may.
            Err(error @ crate::nsq::Error::Config { .. }) => {
                Err(HandlerError::Reject(error.to_string()))
            }
            Err(error) => Err(HandlerError::Retry(error.to_string())),
        }
    }
}
