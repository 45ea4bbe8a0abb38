//! Unit tests of the batcher: batches cut by size and by the timeout, each record answered
//! with its own result in order, flushes that overlap, and closing.

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
