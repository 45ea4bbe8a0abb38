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
mod tests {
    use super::*;
    use std::sync::Mutex;

    use tokio::time::Instant;

    use futures::future::join_all;
    use proptest::prelude::*;

    /// What a [`Probe`] saw.
    #[derive(Debug, Default)]
    struct Seen {
        /// Each flush's records, in the order the flushes started.
        batches: Vec<Vec<Bytes>>,
        /// Flushes whose future has not finished.
        running: usize,
        /// The most flushes running at once.
        most_running: usize,
        /// Calls of `idle`.
        idles: usize,
        /// Flushes that had finished when `close` was called, once it was.
        closed_after: Option<usize>,
        finished: usize,
    }

    /// A flush that records its batches, fails the flushes `fails` names (by their number,
    /// cycled; none when empty), and takes `takes(n)` to finish flush `n`.
    #[derive(Clone)]
    struct Probe {
        seen: Arc<Mutex<Seen>>,
        fails: Arc<Vec<bool>>,
        takes: fn(usize) -> Duration,
    }

    impl Probe {
        fn new() -> Self {
            Probe {
                seen: Arc::default(),
                fails: Arc::new(Vec::new()),
                takes: |_| Duration::ZERO,
            }
        }

        fn failing(fails: Vec<bool>) -> Self {
            Probe {
                fails: Arc::new(fails),
                ..Probe::new()
            }
        }

        /// A batcher flushing to this probe.
        fn start(&self, settings: Settings) -> Batcher {
            Batcher::spawn("the test batcher", settings, self.clone())
        }

        fn batches(&self) -> Vec<Vec<Bytes>> {
            self.seen.lock().unwrap().batches.clone()
        }
    }

    /// The result the record at `at` of flush `n` gets from a [`Probe`] failing `fails`:
    /// each failed record's error names it.
    fn outcome(fails: &[bool], n: usize, at: usize) -> Result<(), HandlerError> {
        match fails.is_empty() || !fails[n % fails.len()] {
            true => Ok(()),
            false => Err(HandlerError::Retry(format!("flush {n} failed record {at}"))),
        }
    }

    impl Flush for Probe {
        fn flush(&mut self, records: Vec<Bytes>) -> impl Future<Output = Results> + Send + 'static {
            let n = {
                let mut seen = self.seen.lock().unwrap();
                seen.batches.push(records.clone());
                seen.running += 1;
                seen.most_running = seen.most_running.max(seen.running);
                seen.batches.len() - 1
            };
            let (seen, takes) = (Arc::clone(&self.seen), (self.takes)(n));
            let results = (0..records.len())
                .map(|at| outcome(&self.fails, n, at))
                .collect();
            async move {
                tokio::time::sleep(takes).await;
                let mut seen = seen.lock().unwrap();
                seen.running -= 1;
                seen.finished += 1;
                results
            }
        }

        fn idle(&mut self) {
            self.seen.lock().unwrap().idles += 1;
        }

        fn close(&mut self) {
            let mut seen = self.seen.lock().unwrap();
            assert_eq!(seen.closed_after, None, "closed once");
            seen.closed_after = Some(seen.finished);
        }
    }

    fn records(range: std::ops::Range<usize>) -> Vec<Bytes> {
        range.map(|i| Bytes::from(format!("r{i:03}"))).collect()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_at_once_and_the_rest_waits_for_the_timeout() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(3).timeout(HOUR));
        let started = Instant::now();
        let answers: Vec<_> = records(0..4)
            .into_iter()
            .map(|r| batcher.submit_one(r))
            .collect();
        let mut answers = answers.into_iter();
        let first_three = join_all(answers.by_ref().take(3)).await;
        assert_eq!(first_three, vec![Ok(()); 3]);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a full batch does not wait"
        );
        assert_eq!(probe.batches(), vec![records(0..3)]);
        assert_eq!(answers.next().unwrap().await, Ok(()));
        assert_eq!(
            started.elapsed(),
            HOUR,
            "the last record waits for the timeout"
        );
        assert_eq!(probe.batches(), vec![records(0..3), records(3..4)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeout_sends_what_came_meanwhile() {
        let probe = Probe::new();
        let timeout = Duration::from_millis(50);
        let batcher = Arc::new(probe.start(Settings::new(100).timeout(timeout)));
        let started = Instant::now();
        let first = batcher.submit_one(records(0..1).remove(0));
        let later = tokio::spawn({
            let batcher = Arc::clone(&batcher);
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                batcher.submit(records(1..3)).await
            }
        });
        assert_eq!(first.await, Ok(()));
        assert_eq!(later.await.unwrap(), vec![Ok(()); 2]);
        assert_eq!(started.elapsed(), timeout);
        assert_eq!(probe.batches(), vec![records(0..3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_timeout_a_batch_takes_what_is_queued_and_waits_for_nothing() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(100));
        let started = Instant::now();
        let answers = join_all((0..5).map(|i| batcher.submit(records(i * 2..i * 2 + 2)))).await;
        assert_eq!(answers, vec![vec![Ok(()); 2]; 5]);
        assert_eq!(probe.batches(), vec![records(0..10)]);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn each_record_gets_its_own_result_in_order() {
        // A flush that fails the records whose text ends in an odd digit, each with its name.
        fn judged(record: &Bytes) -> Result<(), HandlerError> {
            match record.last().unwrap() % 2 {
                0 => Ok(()),
                _ => Err(HandlerError::Reject(format!("{record:?}"))),
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let flush = {
            let seen = Arc::clone(&seen);
            move |records: Vec<Bytes>| {
                seen.lock().unwrap().push(records.len());
                let results: Results = records.iter().map(judged).collect();
                async move { results }
            }
        };
        let batcher = Batcher::spawn("the test batcher", Settings::new(100), flush);
        let requests = [records(0..1), records(1..4), records(4..6)];
        let answers = join_all(requests.iter().map(|r| batcher.submit(r.clone()))).await;
        for (request, answer) in requests.iter().zip(&answers) {
            let expected: Results = request.iter().map(judged).collect();
            assert_eq!(answer, &expected);
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [6],
            "one flush for the three requests"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_flush_fails_exactly_its_records() {
        let probe = Probe::failing(vec![false, true, false]);
        let batcher = probe.start(Settings::new(2));
        // One at a time, so that each batch is cut from what is queued by then.
        let mut answers = Vec::new();
        for request in [records(0..2), records(2..4), records(4..6)] {
            answers.push(batcher.submit(request).await);
        }
        let failed = |at| Err(HandlerError::Retry(format!("flush 1 failed record {at}")));
        assert_eq!(
            answers,
            [vec![Ok(()); 2], vec![failed(0), failed(1)], vec![Ok(()); 2]]
        );
        assert_eq!(
            probe.batches(),
            [records(0..2), records(2..4), records(4..6)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_does_not_fit_starts_the_next_batch_and_is_never_split() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(4));
        let requests = [
            records(0..3),
            records(3..5),
            records(5..11),
            records(11..12),
        ];
        let answers = join_all(requests.iter().map(|r| batcher.submit(r.clone()))).await;
        assert!(answers.iter().flatten().all(Result::is_ok));
        assert_eq!(
            probe.batches(),
            [
                records(0..3),
                records(3..5),
                records(5..11),
                records(11..12)
            ],
            "a lone request larger than the bound is a batch of its own"
        );

        // Bytes bound the batch too: each record here is 4 bytes.
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(100).max_bytes(10));
        let answers = join_all(records(0..5).into_iter().map(|r| batcher.submit_one(r))).await;
        assert_eq!(answers, vec![Ok(()); 5]);
        assert_eq!(
            probe.batches(),
            [records(0..2), records(2..4), records(4..5)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn records_queue_up_while_the_flushes_run() {
        let mut probe = Probe::new();
        probe.takes = |_| Duration::from_millis(10);
        let batcher = probe.start(Settings::new(100).flushes(2));
        let mut answers = Vec::new();
        for i in 0..40 {
            answers.push(batcher.submit_one(records(i..i + 1).remove(0)));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(join_all(answers).await, vec![Ok(()); 40]);
        let seen = probe.seen.lock().unwrap();
        assert_eq!(seen.most_running, 2, "two flushes at once, no more");
        assert_eq!(
            seen.batches.concat(),
            records(0..40),
            "every record once, in order"
        );
        assert!(
            seen.batches.len() < 20,
            "records gather while both flushes run: {} batches for 40 records",
            seen.batches.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn close_flushes_what_is_queued_then_refuses_more() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(100).timeout(HOUR));
        let started = Instant::now();
        let queued = batcher.submit(records(0..3));
        batcher.close().await.unwrap();
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "close does not wait for the timeout"
        );
        assert_eq!(queued.await, vec![Ok(()); 3]);
        assert_eq!(probe.batches(), [records(0..3)]);
        assert_eq!(
            probe.seen.lock().unwrap().closed_after,
            Some(1),
            "closed after the flush"
        );
        assert_eq!(
            batcher.submit_one(Bytes::from_static(b"late")).await,
            Err(HandlerError::Retry("the test batcher has stopped".into()))
        );
        batcher.close().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_batcher_still_answers_what_is_queued() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(100).timeout(HOUR));
        let queued = batcher.submit(records(0..3));
        drop(batcher);
        assert_eq!(queued.await, vec![Ok(()); 3]);
        // The close follows the answers.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(probe.seen.lock().unwrap().closed_after, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_is_called_while_nothing_is_queued() {
        let probe = Probe::new();
        let batcher = probe.start(Settings::new(100).idle(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(probe.seen.lock().unwrap().idles, 3);
        batcher.close().await.unwrap();
    }

    #[test]
    fn a_batcher_on_its_own_thread_writes_in_order() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let flush = {
            let written = Arc::clone(&written);
            move |records: Vec<Bytes>| {
                // A write that blocks.
                std::thread::sleep(Duration::from_millis(5));
                written.lock().unwrap().push(records.clone());
                std::future::ready(vec![Ok(()); records.len()])
            }
        };
        let batcher = Batcher::spawn_thread(
            "batcher-test",
            "the test batcher",
            Settings::new(100),
            flush,
        );
        let answers = futures::executor::block_on(async {
            let answers = join_all((0..50).map(|i| batcher.submit(records(i..i + 1))));
            let answers = answers.await;
            batcher.close().await.unwrap();
            answers
        });
        assert_eq!(answers, vec![vec![Ok(())]; 50]);
        let written = written.lock().unwrap();
        assert_eq!(written.concat(), records(0..50));
        assert!(written.len() < 50, "records gathered while a write blocked");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Requests of random sizes at random times, flushes that fail at random and take
        /// random times, random bounds, closed at a random point: every record gets exactly
        /// one result, its flush's (or, once closed, the refusal), and batches keep the
        /// requests whole, in order, within the bounds.
        #[test]
        fn every_record_gets_exactly_one_reply(
            requests in prop::collection::vec((0usize..6, 0u64..4), 0..40),
            max_records in 1usize..8,
            max_bytes in prop::option::of(4usize..40),
            timeout_ms in 0u64..5,
            flushes in 1usize..4,
            fails in prop::collection::vec(any::<bool>(), 0..6),
            close_at in prop::option::of(0usize..40),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut probe = Probe::failing(fails.clone());
                probe.takes = |n| Duration::from_millis((n % 3) as u64);
                let mut settings = Settings::new(max_records)
                    .timeout(Duration::from_millis(timeout_ms))
                    .flushes(flushes);
                if let Some(max_bytes) = max_bytes {
                    settings = settings.max_bytes(max_bytes);
                }
                let batcher = probe.start(settings);
                let mut next = 0;
                let mut sent = Vec::new();
                let mut closed = false;
                for (i, (count, wait)) in requests.iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(*wait)).await;
                    let request = records(next..next + count);
                    next += count;
                    sent.push((request.clone(), closed, batcher.submit(request)));
                    if close_at == Some(i) {
                        batcher.close().await.unwrap();
                        closed = true;
                    }
                }
                batcher.close().await.unwrap();
                let mut results = std::collections::HashMap::new();
                // The first record of each request, with the request's size.
                let mut starts = std::collections::HashMap::new();
                let mut refused_records = std::collections::HashSet::new();
                for (request, refused, answer) in sent {
                    let answer = answer.await;
                    prop_assert_eq!(answer.len(), request.len());
                    if let Some(first) = request.first() {
                        starts.insert(first.clone(), request.len());
                    }
                    for (record, result) in request.into_iter().zip(answer) {
                        if refused {
                            prop_assert_eq!(&result, &Err(stopped("the test batcher")));
                            refused_records.insert(record.clone());
                        }
                        prop_assert!(results.insert(record, result).is_none());
                    }
                }
                let seen = probe.seen.lock().unwrap();
                prop_assert_eq!(seen.closed_after, Some(seen.batches.len()), "closed once, last");
                prop_assert!(seen.most_running <= flushes);
                let mut flushed = Vec::new();
                for (n, batch) in seen.batches.iter().enumerate() {
                    // Whole requests only.
                    let mut sizes = Vec::new();
                    let mut at = 0;
                    while at < batch.len() {
                        let size = starts.get(&batch[at]).copied();
                        prop_assert!(size.is_some(), "{:?} starts no request", batch[at]);
                        sizes.push(size.unwrap());
                        at += size.unwrap();
                    }
                    prop_assert_eq!(at, batch.len());
                    // Within the bounds, or a lone request.
                    let bytes: usize = batch.iter().map(Bytes::len).sum();
                    prop_assert!(
                        sizes.len() == 1
                            || (batch.len() <= max_records
                                && bytes <= max_bytes.unwrap_or(usize::MAX)),
                        "{:?}", sizes
                    );
                    for (at, record) in batch.iter().enumerate() {
                        prop_assert_eq!(&results[record], &outcome(&fails, n, at), "{:?}", record);
                    }
                    flushed.extend(batch.iter().cloned());
                }
                // Every record flushed at most once, in the order of the requests.
                prop_assert!(flushed.windows(2).all(|w| w[0] < w[1]));
                // A record is refused if, and only if, it came after the close.
                for (record, result) in &results {
                    prop_assert_eq!(
                        flushed.contains(record),
                        !refused_records.contains(record),
                        "{:?}: {:?}", record, result
                    );
                }
                Ok(())
            })?;
        }
    }
}
