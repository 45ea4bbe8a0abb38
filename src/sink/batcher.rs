//! One batcher for the sinks: records queued by many callers are gathered into batches, each
//! batch is handed to the sink's [`Flush`], and each record is answered with the result that
//! flush gave it, so a message is finished at nsqd only once its own record is written or
//! sent (group commit).
//!
//! A caller queues its records as one request ([`Batcher::submit`]) and waits for one result per
//! record, in their order. The batcher cuts a batch only once a flush may start
//! ([`Settings::flushes`]), so records queue up while the flushes run and the next batch takes
//! them all: the cost of a write, a sync or a request is paid once per batch, not per record.
//! A batch starts with the oldest request and takes the requests queued after it, in their
//! order, until the next one would take it past [`Settings::max_records`] or
//! [`Settings::max_bytes`] (that one starts the next batch; a request larger than the bounds
//! is a batch of its own), or until [`Settings::timeout`] has passed since its first request
//! was taken (with no timeout, it takes what is queued and waits for nothing). A request is
//! never split: its records are flushed together.
//!
//! Shutdown: [`Batcher::close`] (or dropping the batcher) stops it taking requests; what is
//! queued is still flushed and answered, then [`Flush::close`] is called (the file sink closes
//! its file there). A caller whose request the batcher can no longer take, or whose batcher
//! stopped before answering, gets [`HandlerError::Retry`] for each record: its message is
//! requeued, never lost.
//!
//! The flushes of a sink that blocks (a write to a pipe or a file) run on a thread of their
//! own ([`Batcher::spawn_thread`]), so a blocked write holds no runtime worker; the others
//! run as tasks ([`Batcher::spawn`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::HandlerError;

/// One result per record, in the records' order.
pub(super) type Results = Vec<Result<(), HandlerError>>;

/// How a [`Batcher`] cuts and flushes batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Settings {
    /// The most records in a batch (a lone request of more is flushed alone).
    max_records: usize,
    /// The most bytes of records in a batch (a lone request of more is flushed alone).
    /// Defaults to: unbounded.
    max_bytes: usize,
    /// How long a batch waits for more records after its first request. Defaults to: zero
    /// (a batch takes what is queued and leaves at once).
    timeout: Duration,
    /// Flushes running at once. Defaults to: 1 (each batch is flushed once the previous one
    /// is answered).
    flushes: usize,
    /// While nothing is queued, [`Flush::idle`] is called this often. Defaults to: never.
    idle: Option<Duration>,
}

impl Settings {
    /// Batches of up to `max_records` records, with the defaults above.
    pub(super) fn new(max_records: usize) -> Self {
        Settings {
            max_records: max_records.max(1),
            max_bytes: usize::MAX,
            timeout: Duration::ZERO,
            flushes: 1,
            idle: None,
        }
    }

    /// Bounds the bytes of records in a batch.
    pub(super) fn max_bytes(self, max_bytes: usize) -> Self {
        Settings { max_bytes, ..self }
    }

    /// Lets a batch wait up to `timeout` after its first request for more.
    pub(super) fn timeout(self, timeout: Duration) -> Self {
        Settings { timeout, ..self }
    }

    /// Runs up to `flushes` flushes at once (`usize::MAX`: as many as there are batches).
    pub(super) fn flushes(self, flushes: usize) -> Self {
        Settings {
            flushes: flushes.clamp(1, Semaphore::MAX_PERMITS),
            ..self
        }
    }

    /// Calls [`Flush::idle`] every `every` while nothing is queued.
    pub(super) fn idle(self, every: Duration) -> Self {
        Settings {
            idle: Some(every),
            ..self
        }
    }
}

/// What a [`Batcher`] hands its batches to: a sink's write or send.
///
/// Any `FnMut(Vec<Bytes>) -> impl Future<Output = Results>` is a flush with no idle or close
/// work.
pub(super) trait Flush: Send + 'static {
    /// Writes or sends `records` (at least one) and answers one result per record, in their
    /// order. Blocking work may be done before the future is returned by a flush that runs on
    /// a thread of its own ([`Batcher::spawn_thread`]); the future may run while the next
    /// batches are cut and flushed, up to [`Settings::flushes`] at once.
    fn flush(&mut self, records: Vec<Bytes>) -> impl Future<Output = Results> + Send + 'static;

    /// Called every [`Settings::idle`] while nothing is queued.
    fn idle(&mut self) {}

    /// Called once, when the batcher is closed and every flush is answered.
    fn close(&mut self) {}
}

impl<F, Fut> Flush for F
where
    F: FnMut(Vec<Bytes>) -> Fut + Send + 'static,
    Fut: Future<Output = Results> + Send + 'static,
{
    fn flush(&mut self, records: Vec<Bytes>) -> impl Future<Output = Results> + Send + 'static {
        self(records)
    }
}

/// Records of one caller, and where to answer them.
struct Request {
    records: Vec<Bytes>,
    /// The bytes of `records`.
    bytes: usize,
    reply: oneshot::Sender<Results>,
}

enum Message {
    Request(Request),
    /// Stop taking requests; answer once everything queued is flushed and answered.
    Close(oneshot::Sender<()>),
}

/// Hands records to the batcher's task or thread, which ends once this is dropped or
/// [closed](Batcher::close) and everything queued is answered.
#[derive(Debug)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Message>,
    /// What the batcher is, for the error of a record it cannot take ("the stdout writer").
    name: &'static str,
}

impl Batcher {
    /// Starts a batcher whose flushes run as tasks on the current runtime. `name` says what
    /// it is in the error of a record it cannot take ("the nsq sink's publisher").
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub(super) fn spawn(name: &'static str, settings: Settings, flush: impl Flush) -> Self {
        let (queue, messages) = mpsc::unbounded_channel();
        tokio::spawn(run(messages, settings, flush));
        Batcher { queue, name }
    }

    /// Starts a batcher on a thread of its own, named `thread`, for a flush that blocks.
    ///
    /// # Panics
    ///
    /// When the operating system does not start the thread.
    pub(super) fn spawn_thread(
        thread: &str,
        name: &'static str,
        settings: Settings,
        flush: impl Flush,
    ) -> Self {
        let (queue, messages) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime without I/O starts");
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || runtime.block_on(run(messages, settings, flush)))
            .expect("the operating system starts a thread");
        Batcher { queue, name }
    }

    /// Queues `records` as one request; answers one result per record, in their order,
    /// each the result its flush gave it. The request is queued at once, before the future
    /// is first polled, so requests keep the order of the calls.
    pub(super) fn submit(
        &self,
        records: Vec<Bytes>,
    ) -> impl Future<Output = Results> + Send + 'static {
        let count = records.len();
        let name = self.name;
        let answer = (count > 0)
            .then(|| {
                let (reply, answer) = oneshot::channel();
                let bytes = records.iter().map(Bytes::len).sum();
                let request = Request {
                    records,
                    bytes,
                    reply,
                };
                self.queue.send(Message::Request(request)).ok()?;
                Some(answer)
            })
            .flatten();
        async move {
            if count == 0 {
                return Vec::new();
            }
            let answered = match answer {
                Some(answer) => answer.await.ok(),
                None => None,
            };
            answered.unwrap_or_else(|| vec![Err(stopped(name)); count])
        }
    }

    /// Queues one record; answers the result its flush gave it.
    pub(super) fn submit_one(
        &self,
        record: Bytes,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'static {
        let answer = self.submit(vec![record]);
        let name = self.name;
        async move { answer.await.pop().unwrap_or_else(|| Err(stopped(name))) }
    }

    /// Stops taking requests, and returns once everything queued before is flushed and
    /// answered and [`Flush::close`] has run. Later requests are answered with an error.
    ///
    /// # Errors
    ///
    /// [`HandlerError::Retry`] when the batcher stopped before it was done (its thread or
    /// task panicked).
    pub(super) async fn close(&self) -> Result<(), HandlerError> {
        let (ack, closed) = oneshot::channel();
        if self.queue.send(Message::Close(ack)).is_err() {
            // Closed already: nothing is left to flush.
            return Ok(());
        }
        closed.await.map_err(|_| stopped(self.name))
    }
}

/// The error of a record that the batcher named `name` can no longer take or answer.
fn stopped(name: &str) -> HandlerError {
    HandlerError::Retry(format!("{name} has stopped"))
}

/// The batcher: cuts a batch whenever a flush may start, until it is closed (or every
/// [`Batcher`] is dropped) and everything queued is answered.
async fn run(
    mut messages: mpsc::UnboundedReceiver<Message>,
    settings: Settings,
    mut flush: impl Flush,
) {
    let slots = Arc::new(Semaphore::new(settings.flushes));
    // Each running flush holds a clone: `recv` answers `None` once every one is answered.
    let (running, mut all_answered) = mpsc::channel::<()>(1);
    let mut closers = Vec::new();
    let mut carried: Option<Request> = None;
    loop {
        // Wait for a slot first, so that records queue up into bigger batches meanwhile.
        let slot = Arc::clone(&slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let first = match carried.take() {
            Some(request) => request,
            None => match next_request(&mut messages, &settings, &mut flush, &mut closers).await {
                Some(request) => request,
                None => break,
            },
        };
        let (batch, next) = gather(first, &mut messages, &settings, &mut closers).await;
        carried = next;
        let done = flush.flush(batch.records);
        let running = running.clone();
        tokio::spawn(async move {
            answer(batch.replies, done.await);
            drop((slot, running));
        });
    }
    drop(running);
    let _ = all_answered.recv().await;
    flush.close();
    for closer in closers {
        let _ = closer.send(());
    }
}

/// Waits for the first request of a batch (calling [`Flush::idle`] meanwhile); `None` once
/// no request can come.
async fn next_request(
    messages: &mut mpsc::UnboundedReceiver<Message>,
    settings: &Settings,
    flush: &mut impl Flush,
    closers: &mut Vec<oneshot::Sender<()>>,
) -> Option<Request> {
    loop {
        let message = match settings.idle {
            Some(every) => match tokio::time::timeout(every, messages.recv()).await {
                Ok(message) => message,
                Err(_) => {
                    flush.idle();
                    continue;
                }
            },
            None => messages.recv().await,
        };
        match message? {
            Message::Request(request) => return Some(request),
            Message::Close(closer) => close(messages, closers, closer),
        }
    }
}

/// Stops `messages` taking more; what is queued is still received.
fn close(
    messages: &mut mpsc::UnboundedReceiver<Message>,
    closers: &mut Vec<oneshot::Sender<()>>,
    closer: oneshot::Sender<()>,
) {
    messages.close();
    closers.push(closer);
}

/// The records of a batch, and the callers to answer.
struct Batch {
    records: Vec<Bytes>,
    bytes: usize,
    /// Each request's reply, with its number of records, in their order.
    replies: Vec<(oneshot::Sender<Results>, usize)>,
}

impl Batch {
    fn new(first: Request) -> Self {
        Batch {
            replies: vec![(first.reply, first.records.len())],
            records: first.records,
            bytes: first.bytes,
        }
    }

    fn fits(&self, request: &Request, settings: &Settings) -> bool {
        self.records.len() + request.records.len() <= settings.max_records
            && self.bytes.saturating_add(request.bytes) <= settings.max_bytes
    }

    fn is_full(&self, settings: &Settings) -> bool {
        self.records.len() >= settings.max_records || self.bytes >= settings.max_bytes
    }

    fn push(&mut self, request: Request) {
        self.replies.push((request.reply, request.records.len()));
        self.records.extend(request.records);
        self.bytes += request.bytes;
    }
}

/// Cuts a batch starting with `first`: takes the requests queued after it (waiting up to the
/// timeout for more) while they fit. Returns the batch and the request that did not fit.
async fn gather(
    first: Request,
    messages: &mut mpsc::UnboundedReceiver<Message>,
    settings: &Settings,
    closers: &mut Vec<oneshot::Sender<()>>,
) -> (Batch, Option<Request>) {
    let mut batch = Batch::new(first);
    // Present while the batch may still wait for more.
    let mut deadline =
        (!settings.timeout.is_zero()).then(|| Box::pin(tokio::time::sleep(settings.timeout)));
    while !batch.is_full(settings) {
        let message = match &mut deadline {
            Some(sleep) => tokio::select! {
                message = messages.recv() => match message {
                    Some(message) => Some(message),
                    None => break,
                },
                () = sleep.as_mut() => None,
            },
            None => match messages.try_recv() {
                Ok(message) => Some(message),
                Err(_) => break,
            },
        };
        let Some(message) = message else {
            // Past the timeout: take what is queued by now, and go.
            deadline = None;
            continue;
        };
        match message {
            Message::Request(request) if batch.fits(&request, settings) => batch.push(request),
            Message::Request(request) => return (batch, Some(request)),
            Message::Close(closer) => close(messages, closers, closer),
        }
    }
    (batch, None)
}

/// Answers each request with its records' results. A flush that answered too few records
/// fails the rest (they are retried); the extra results of one that answered too many are
/// dropped.
fn answer(replies: Vec<(oneshot::Sender<Results>, usize)>, mut results: Results) {
    let count: usize = replies.iter().map(|(_, n)| n).sum();
    if results.len() != count {
        debug_assert_eq!(results.len(), count, "one result per record");
        results.resize(
            count,
            Err(HandlerError::Retry(
                "the sink gave no result for this record".into(),
            )),
        );
    }
    // A caller that stopped waiting (shutdown) has nothing to be told: its message is
    // requeued.
    if replies.len() == 1 {
        // The common case, a batch of one request: its results as they are.
        if let Some((reply, _)) = replies.into_iter().next() {
            let _ = reply.send(results);
        }
        return;
    }
    let mut results = results.into_iter();
    for (reply, n) in replies {
        let _ = reply.send(results.by_ref().take(n).collect());
    }
}

#[cfg(test)]
mod tests;
