//! The dead-letter: where a message goes when it cannot be delivered, so it is never dropped.
//!
//! A message reaches it after a handler rejected it, or failed on its `max_attempts`-th
//! delivery. The pipeline finishes the message at nsqd only after the dead-letter accepted it;
//! if the dead-letter fails too, the message is requeued.

use std::io::Write as _;
use std::path::PathBuf;

use bytes::Bytes;

use crate::nsq::{Producer, ProducerConfig};
use crate::wording::Named;

/// What is written to a file dead-letter: one JSON object per line.
///
/// `body` holds the body if it is UTF-8; otherwise `body_hex` holds it in hexadecimal.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadLetterRecord<'a> {
    /// The nsqd the message came from.
    pub source: &'a str,
    /// The message ID at that nsqd.
    pub id: &'a str,
    /// Deliveries so far.
    pub attempts: u16,
    /// Why it could not be delivered.
    pub reason: &'a str,
    /// The body, if UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<&'a str>,
    /// The body in hexadecimal, if not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
}

/// A failed dead-letter write.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// Appending to the file failed.
    #[error("writing dead-letter file {path}: {cause} (check {setting})")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error, in the message so that a log line of this error alone says why.
        cause: std::io::Error,
        /// The setting that gives the file: `dead_letter.path`.
        setting: Named,
    },
    /// Publishing to the dead-letter topic failed.
    #[error("publishing to dead-letter topic {topic}: {cause}")]
    Nsq {
        /// The topic.
        topic: String,
        /// The NSQ error, in the message as above.
        cause: crate::nsq::Error,
    },
}

impl DeadLetterError {
    /// Appending to `path` failed with `cause`.
    fn file(path: PathBuf, cause: std::io::Error) -> DeadLetterError {
        DeadLetterError::File {
            path,
            cause,
            setting: Named::key("dead_letter.path"),
        }
    }
}

/// Where undeliverable messages go.
pub enum DeadLetter {
    /// Publish the original body to an NSQ topic.
    Nsq {
        /// Publishes to the dead-letter nsqd.
        producer: Producer,
        /// The topic.
        topic: String,
    },
    /// Append a JSON line per message to a file, synced to disk before it counts as accepted.
    File {
        /// The file's path.
        path: PathBuf,
        /// The open file. A `std` mutex: writes are short and no `.await` is held across it.
        file: std::sync::Mutex<std::fs::File>,
    },
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetter::Nsq { topic, .. } => write!(f, "DeadLetter::Nsq({topic})"),
            DeadLetter::File { path, .. } => write!(f, "DeadLetter::File({})", path.display()),
        }
    }
}

impl DeadLetter {
    /// A dead-letter topic, published to by a producer of `config`.
    ///
    /// # Errors
    ///
    /// The producer's configuration error.
    pub fn nsq(config: ProducerConfig, topic: String) -> Result<Self, crate::nsq::Error> {
        Ok(DeadLetter::Nsq {
            producer: Producer::new(config)?,
            topic,
        })
    }

    /// Completes with the first refusal of the dead-letter's nsqd that no retry changes; a
    /// file never completes.
    pub fn refused(
        &self,
    ) -> impl std::future::Future<Output = std::sync::Arc<crate::nsq::Error>> + Send + 'static {
        let refused = match self {
            DeadLetter::Nsq { producer, .. } => Some(producer.refused()),
            DeadLetter::File { .. } => None,
        };
        async move {
            match refused {
                Some(refused) => refused.await,
                None => std::future::pending().await,
            }
        }
    }

    /// A dead-letter file, opened for appending (created if missing).
    ///
    /// # Errors
    ///
    /// [`DeadLetterError::File`] if it cannot be opened.
    pub fn file(path: PathBuf) -> Result<Self, DeadLetterError> {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(file) => Ok(DeadLetter::File {
                path,
                file: std::sync::Mutex::new(file),
            }),
            Err(cause) => Err(DeadLetterError::file(path, cause)),
        }
    }

    /// Stores one message; `Ok` once it is durably accepted.
    ///
    /// # Errors
    ///
    /// [`DeadLetterError`]: the caller must then requeue the message.
    pub async fn accept(
        &self,
        source: &str,
        id: &str,
        attempts: u16,
        reason: &str,
        body: &Bytes,
    ) -> Result<(), DeadLetterError> {
        match self {
            DeadLetter::Nsq { producer, topic } => producer
                .publish(topic, body.clone())
                .await
                .map_err(|cause| DeadLetterError::Nsq {
                    topic: topic.clone(),
                    cause,
                }),
            DeadLetter::File { path, file } => {
                let text = std::str::from_utf8(body).ok();
                let record = DeadLetterRecord {
                    source,
                    id,
                    attempts,
                    reason,
                    body: text,
                    body_hex: match text {
                        Some(_) => None,
                        None => Some(body.iter().map(|b| format!("{b:02x}")).collect()),
                    },
                };
                let mut line = serde_json::to_vec(&record).expect("a record of strings serialises");
                line.push(b'\n');
                // Rare path (messages that failed max_attempts times): a blocking write and
                // fsync on the runtime thread are acceptable, and keep the order of lines.
                let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
                file.write_all(&line)
                    .and_then(|()| file.sync_data())
                    .map_err(|cause| DeadLetterError::file(path.clone(), cause))
            }
        }
    }
}
