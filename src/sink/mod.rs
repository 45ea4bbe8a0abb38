//! Where unique messages go: the [`Handler`] trait, the sidecar's sinks, and the dead-letter.
//!
//! A handler gets each unique body and answers success or a [`HandlerError`]: `Retry` (the
//! message is requeued with backoff; after `max_attempts` it goes to the dead-letter),
//! `RetryAfter` (the same, the backoff at least the delay the failure names) or
//! `Reject` (it goes to the dead-letter at once). The sidecar's sinks ([`Sink`]) are handlers;
//! library users implement [`Handler`] for their own type, or pass an async closure.
//!
//! The pipeline hands a handler every unique record of a burst at once
//! ([`Handler::handle_batch`]), with a result per record. A handler that only implements
//! [`Handler::handle`] gets each record of the batch in its own concurrent call. A handler
//! that learns its records' results at different times (the serve sink, whose consumers answer
//! each message on their own) answers them in parts ([`Handler::handle_in_parts`]), and the
//! pipeline settles each part as it comes.
//!
//! Each sink has its own module here, its room, and takes the traits from this one:
//! [`Handler`], and `BuiltIn` for what only the sidecar asks of its own sinks (their figures
//! for `/metrics`, an output closed or a server's refusal for good). A room also holds the
//! sink's keys of `[sink]`, their validation into its settings, its start-up summary and its
//! build (`room`). The sinks are listed once, at the end of this file, a line each: the list
//! makes [`SinkKind`], the [`Sink`] enum and its dispatch, [`SinkSettings`], the `[sink]`
//! section ([`RawSink`]) and the build. [`serve`], the serve sink, is public (the crate's
//! `serve`) for its settings, stats and errors.

mod batcher;
mod built_in;
mod dead_letter;
mod room;

use std::future::Future;

use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt};

pub(crate) use built_in::{BuiltIn, Watch, Watched};
pub(crate) use nsq::producer_config;
pub(crate) use room::Build;
use room::Room;

/// The HTTP client settings of [`HttpSinkConfig`] and the errors of [`HttpSink::new`].
pub use crate::http::{HttpClientConfig, HttpError};
pub use dead_letter::{DeadLetter, DeadLetterError, DeadLetterRecord};
pub use file::{
    FileSinkConfig, DEFAULT_DATETIME_FORMAT, DEFAULT_FILENAME_FORMAT, DEFAULT_GZIP_LEVEL,
};
pub use http::{
    with_content_type, BatchFormat, HttpMode, HttpSinkConfig, OneOrMany, DEFAULT_BATCH_TIMEOUT,
    DEFAULT_CONCURRENCY, DEFAULT_CONTENT_TYPE, DEFAULT_IDEMPOTENCY_HEADER,
};
pub use nsq::NsqSinkConfig;

/// Why a handler did not take a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// A transient failure (a timeout, a 5xx, a broken connection): try again later.
    #[error("{0}")]
    Retry(String),
    /// A transient failure whose server said when to come back (HTTP `Retry-After`): try
    /// again, no sooner than `after`.
    #[error("{reason}; retry after {after:?}")]
    RetryAfter {
        /// What failed.
        reason: String,
        /// The least delay before the retry.
        after: std::time::Duration,
    },
    /// The message can never be taken (a 4xx): send it to the dead-letter now.
    #[error("rejected: {0}")]
    Reject(String),
    /// Not a failure: the receiver asked to have the message again, `after` from now (a
    /// consumer's REQ through the serve sink). The message is requeued with that delay and
    /// its copies wait as long; it is neither counted as a failure nor sent to the
    /// dead-letter, since the receiver sees the attempts and gives up on its own.
    #[error("requeued by its receiver for {after:?}")]
    Requeued {
        /// The delay the receiver asked for (zero: at once).
        after: std::time::Duration,
    },
}

impl HandlerError {
    /// The least delay before a retry that the failure (or the receiver's requeue) asks for,
    /// if any.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            HandlerError::RetryAfter { after, .. } | HandlerError::Requeued { after } => {
                Some(*after)
            }
            HandlerError::Retry(_) | HandlerError::Reject(_) => None,
        }
    }
}

/// The results of some records of a handler call, each with the record's place in the call:
/// one part of the answer of [`Handler::handle_in_parts`].
pub type Part = Vec<(usize, Result<(), HandlerError>)>;

/// A unique record as the pipeline hands it on: the body, and what nsqd said of its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The payload.
    pub body: Bytes,
    /// How many times nsqd has delivered the message, this delivery included.
    pub attempts: u16,
    /// When nsqd first received the message, in nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
}

impl Delivery {
    /// The delivery of `message`.
    pub fn of(message: &crate::nsq::Message) -> Self {
        Delivery {
            body: message.body().clone(),
            attempts: message.attempts(),
            timestamp_ns: message.timestamp(),
        }
    }
}

/// Receives each unique message body.
///
/// Called concurrently from many tasks (up to `max_in_flight` at once); the message is
/// finished at nsqd only after the returned future resolves to `Ok`. A handler may take longer
/// than nsqd's message timeout: the pipeline TOUCHes the message and renews its claim meanwhile.
///
/// Any `Fn(Bytes) -> impl Future<Output = Result<(), HandlerError>>` is a handler:
///
/// ```
/// use bytes::Bytes;
/// use nsq_dedupe::sink::{Handler, HandlerError};
///
/// fn assert_handler<H: Handler>(_: &H) {}
/// let handler = |body: Bytes| async move {
///     if body.is_empty() {
///         return Err(HandlerError::Reject("empty body".into()));
///     }
///     Ok(())
/// };
/// assert_handler(&handler);
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Takes one body. `Ok` means it is delivered (the message will be finished).
    fn handle(&self, body: Bytes) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Takes the bodies of a burst; the answer holds one result per body, in their order.
    /// A message is finished only once its own result is `Ok`; a record whose result is an
    /// error is requeued (or dead-lettered) alone, so a sink whose write is all-or-nothing
    /// answers every record of a failed write with the error.
    ///
    /// Defaults to: [`handle`](Handler::handle) for each body, all at once; a call that panics
    /// fails its own record with [`HandlerError::Retry`].
    fn handle_batch(
        &self,
        bodies: Vec<Bytes>,
    ) -> impl Future<Output = Vec<Result<(), HandlerError>>> + Send {
        futures::future::join_all(bodies.into_iter().map(|body| {
            std::panic::AssertUnwindSafe(self.handle(body))
                .catch_unwind()
                .map(|outcome| outcome.unwrap_or_else(panicked))
        }))
    }

    /// Takes the records of a burst with their messages' attempts and timestamps, and answers
    /// them in parts, each as soon as it is known: each item of the stream is a [`Part`], the
    /// results of some records with their places in `deliveries`. What the pipeline calls. It
    /// settles each part as it comes (commits or erases the claims, answers the copies held
    /// beside the records, FINs or REQs their messages) and keeps alive only the records not
    /// answered yet, so a record answered early is not held back by a slow one of the same
    /// burst. Once every record is answered the stream is no longer polled; a record still
    /// without a result when the stream ends fails with [`HandlerError::Retry`], and a second
    /// result for a record is ignored. Only a handler whose records are answered at different
    /// times (the serve sink, whose consumers answer each message on their own) or that
    /// passes messages on with their attempts and timestamps needs more than
    /// [`handle_batch`](Handler::handle_batch).
    ///
    /// Defaults to: [`handle_batch`](Handler::handle_batch) of the bodies, answered in one part.
    fn handle_in_parts(&self, deliveries: Vec<Delivery>) -> impl Stream<Item = Part> + Send {
        let count = deliveries.len();
        in_one_part(
            count,
            self.handle_batch(deliveries.into_iter().map(|d| d.body).collect()),
        )
    }

    /// Whether [`handle_batch`](Handler::handle_batch) is the handler's own, made for
    /// batches. Then the pipeline hands it a burst's records in one call and answers their
    /// messages as the call answers them: once the whole call is done, or part by part
    /// ([`handle_in_parts`](Handler::handle_in_parts)). Otherwise each record is handed on in its own
    /// concurrent call and its message answered as soon as that call is done, so one slow
    /// record holds back no other. Defaults to: `false`.
    fn handles_batches(&self) -> bool {
        false
    }

    /// Whether a message is final once this handler is handed it: then the pipeline records
    /// a unique message as done when it claims it
    /// ([`Store::claim_done_many`](crate::Store::claim_done_many)), one store write per unique
    /// message, and neither commits it afterwards nor renews a lease while the handler works.
    /// A handler that answers `false` gets a claim held in flight under a lease, and a commit
    /// once it succeeded.
    ///
    /// A handler that answers `true` promises that it answers `Ok` for every record it is
    /// handed, without a panic, and that a record is delivered (or is no longer the
    /// pipeline's to retry) from the moment of the call: the null sink, or a handler that
    /// only counts or hands records to memory that cannot refuse them. Should it fail a record
    /// (or be dropped at shutdown) all the same, the record's entry is erased and its message
    /// requeued, as for any handler; but a copy that arrived in between was taken for a
    /// duplicate and finished, where a lease would have requeued it: a broken promise can lose
    /// a message. Defaults to: `false`.
    fn accepts_for_good(&self) -> bool {
        false
    }

    /// Whether a failure of this handler backs the upstream consumer off (go-nsq's backoff:
    /// RDY 0 for a while, then one message at a time), as it should when the handler's own
    /// destination is failing. A handler whose failures are its consumers' answers (the serve
    /// sink, whose consumers back off themselves) answers `false`: one consumer's REQ must
    /// not stall the stream for every other. Defaults to: `true`.
    fn backs_off(&self) -> bool {
        true
    }

    /// Told once, when the sidecar starts its graceful stop, before it waits for the records
    /// with the handler: a handler that takes work from outside stops taking it, and may hand
    /// back the records it can never finish (the serve sink closes its port, and with no
    /// consumer connected answers its waiting records as requeued). Defaults to: nothing.
    fn stopping(&self) {}

    /// Writes out anything buffered; called once at shutdown.
    fn flush(&self) -> impl Future<Output = Result<(), HandlerError>> + Send {
        async { Ok(()) }
    }
}

/// The results of a call for `count` records as one part; a call that answered another
/// number of results fails every record.
pub(crate) fn in_one_part(
    count: usize,
    results: impl Future<Output = Vec<Result<(), HandlerError>>> + Send,
) -> impl Stream<Item = Part> + Send {
    futures::stream::once(results.map(move |results| {
        if results.len() == count {
            return results.into_iter().enumerate().collect();
        }
        let error = HandlerError::Retry(format!(
            "the handler answered {} results for {count} records",
            results.len()
        ));
        (0..count)
            .map(|place| (place, Err(error.clone())))
            .collect()
    }))
}

/// The error of a handler call that panicked, with the panic's message.
pub(crate) fn panicked(panic: Box<dyn std::any::Any + Send>) -> Result<(), HandlerError> {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    Err(HandlerError::Retry(format!("handler panicked: {what}")))
}

impl<F, Fut> Handler for F
where
    F: Fn(Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    fn handle(&self, body: Bytes) -> impl Future<Output = Result<(), HandlerError>> + Send {
        self(body)
    }
}

/// Why a sink could not be built, by the kind of failure; the sidecar says which setting to
/// change.
#[derive(Debug)]
pub(crate) enum BuildError {
    /// The nsq sink's producer refused its settings.
    Nsq(crate::nsq::Error),
    /// The http sink's client could not be built (a CA file that cannot be used).
    Http(HttpError),
    /// The file sink's directories or formats are unusable: the key, and why.
    FileSink {
        /// The setting.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The serve sink could not start (a port that cannot be bound, TLS files that cannot
    /// be used).
    Serve(serve::ServeError),
}

// The sidecar's sinks, one line each: its variant, its name in the file and on the command
// line, its room (`pub` for a public module) and type, and its settings' type (none for a
// sink without settings). The list declares each room and re-exports its sink type. The
// first is the sink of a config without `sink.kind`. A new sink is its room and a line here
// (see `room`).
room::sinks! {
    /// One record per line on standard output.
    Stdout = "stdout", stdout::StdoutSink;
    /// Publish to a topic on one or more nsqd.
    Nsq = "nsq", nsq::NsqSink(NsqSinkConfig);
    /// POST to one or more URLs.
    Http = "http", http::HttpSink(HttpSinkConfig);
    /// Archive to files, as `nsq_to_file`.
    File = "file", file::FileSink(FileSinkConfig);
    /// Accept and discard everything (benchmarks, dry runs).
    Null = "null", null::NullSink;
    /// Serve NSQ consumers as nsqd does; a consumer's FIN delivers.
    Serve = "serve", pub serve::ServeSink(serve::ServeConfig);
}
