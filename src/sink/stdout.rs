//! The `stdout` sink: each unique body as one line on standard output, group-committed.
//!
//! One writer thread owns standard output. Each [`handle_batch`](Handler::handle_batch) (or
//! [`handle`](Handler::handle)) queues its records as one request and waits; the thread takes
//! every request queued by then, writes their records with one `write` of one buffer, flushes,
//! and only then answers each request, so a message is finished at nsqd only after its line
//! has left the process. Requests that arrive while a write is in flight share the next one, so
//! the cost of a write and a flush is paid once per batch, not once per message, and a burst
//! costs one wake-up. Records are written in the order they were queued.
//!
//! A thread rather than a task: writing to a pipe blocks, and a blocked write must not hold a
//! runtime worker. A write error fails every record of its batch (their messages are
//! requeued); a closed stdout (`EPIPE`, the reader went away) also closes the sink, and the
//! sidecar stops (see [`Handler::closed`]).

use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use super::{Handler, HandlerError};

/// The most records one write carries (beyond one request's); a bound on the buffer, not a
/// wait.
const MAX_BATCH_RECORDS: usize = 4096;

/// Records waiting for the writer, and where to tell their caller how the write went.
struct Pending {
    bodies: Vec<Bytes>,
    done: oneshot::Sender<Result<(), Arc<io::Error>>>,
}

/// Writes each body followed by a newline, and flushes, before reporting success; bodies are
/// written byte for byte (a body containing newlines spans several lines).
#[derive(Debug)]
pub struct StdoutSink {
    /// The writer thread's queue. The thread ends when this sender is dropped.
    queue: mpsc::UnboundedSender<Pending>,
    /// Set by the writer thread when stdout is closed for good.
    closed: watch::Receiver<Option<Arc<io::Error>>>,
}

impl Default for StdoutSink {
    fn default() -> Self {
        StdoutSink::new(io::stdout())
    }
}

impl StdoutSink {
    /// A sink writing to `out` from a thread of its own (standard output in service; any
    /// writer in tests).
    pub fn new<W: Write + Send + 'static>(out: W) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let (closed_tx, closed) = watch::channel(None);
        std::thread::Builder::new()
            .name("nsq-dedupe-stdout".into())
            .spawn(move || write_batches(out, requests, &closed_tx))
            .expect("the operating system starts a thread");
        StdoutSink { queue, closed }
    }
}

/// The writer thread: one write and one flush per batch of queued records.
fn write_batches<W: Write>(
    mut out: W,
    mut requests: mpsc::UnboundedReceiver<Pending>,
    closed: &watch::Sender<Option<Arc<io::Error>>>,
) {
    let mut batch: Vec<Pending> = Vec::new();
    let mut buffer: Vec<u8> = Vec::with_capacity(64 * 1024);
    while let Some(first) = requests.blocking_recv() {
        let mut records = first.bodies.len();
        batch.push(first);
        while records < MAX_BATCH_RECORDS {
            match requests.try_recv() {
                Ok(pending) => {
                    records += pending.bodies.len();
                    batch.push(pending);
                }
                Err(_) => break,
            }
        }
        buffer.clear();
        for body in batch.iter().flat_map(|pending| &pending.bodies) {
            buffer.extend_from_slice(body);
            buffer.push(b'\n');
        }
        let result = out
            .write_all(&buffer)
            .and_then(|()| out.flush())
            .map_err(Arc::new);
        if let Err(error) = &result {
            if error.kind() == io::ErrorKind::BrokenPipe {
                closed.send_replace(Some(error.clone()));
            }
        }
        for pending in batch.drain(..) {
            // A caller that stopped waiting has nothing to be told.
            let _ = pending.done.send(result.clone());
        }
        if buffer.capacity() > 16 * 1024 * 1024 {
            // One huge batch must not pin its buffer for the rest of the run.
            buffer = Vec::with_capacity(64 * 1024);
        }
    }
}

fn failed(error: &io::Error) -> HandlerError {
    HandlerError::Retry(format!("writing to stdout failed: {error}"))
}

impl StdoutSink {
    /// Writes `bodies` with one request to the writer thread; one result for all of them.
    async fn write(&self, bodies: Vec<Bytes>) -> Result<(), HandlerError> {
        let (done, written) = oneshot::channel();
        let gone = || HandlerError::Retry("the stdout writer has stopped".into());
        self.queue
            .send(Pending { bodies, done })
            .map_err(|_| gone())?;
        match written.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(failed(&error)),
            Err(_) => Err(gone()),
        }
    }
}

impl Handler for StdoutSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.write(vec![body]).await
    }

    fn handles_batches(&self) -> bool {
        true
    }

    /// One request for the whole batch: its records are written by one `write`, and a failed
    /// write fails every one of them.
    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        let count = bodies.len();
        if count == 0 {
            return Vec::new();
        }
        vec![self.write(bodies).await; count]
    }

    async fn closed(&self) -> io::Error {
        let mut closed = self.closed.clone();
        let error = match closed.wait_for(Option::is_some).await {
            Ok(error) => error.clone(),
            // The writer thread is gone without a broken pipe: nothing more will be written.
            Err(_) => None,
        };
        match error {
            Some(error) => io::Error::new(error.kind(), error.to_string()),
            None => io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer has stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that records each `write` call and can be told to fail.
    #[derive(Clone, Default)]
    struct Recording {
        writes: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
        fail: Option<io::ErrorKind>,
    }

    impl Write for Recording {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(kind) = self.fail {
                return Err(kind.into());
            }
            self.writes.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_queued_together_share_one_write_in_order() {
        let out = Recording::default();
        let sink = Arc::new(StdoutSink::new(out.clone()));
        let mut tasks = Vec::new();
        for i in 0..2000 {
            let sink = sink.clone();
            tasks.push(tokio::spawn(async move {
                sink.handle(Bytes::from(format!("record {i:04}"))).await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let writes = out.writes.lock().unwrap().clone();
        let all: Vec<u8> = writes.concat();
        let mut lines: Vec<&[u8]> = all.split(|&b| b == b'\n').collect();
        assert_eq!(
            lines.pop(),
            Some(&b""[..]),
            "every record ends with a newline"
        );
        assert_eq!(lines.len(), 2000);
        let mut sorted = lines.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 2000, "each record exactly once");
        assert!(
            writes.len() < 2000,
            "2000 concurrent records took {} writes",
            writes.len()
        );
    }

    #[tokio::test]
    async fn a_batch_is_written_in_order_with_one_result_per_record() {
        let out = Recording::default();
        let sink = StdoutSink::new(out.clone());
        let bodies = ["a", "b", "", "c"].map(Bytes::from).to_vec();
        let results = sink.handle_batch(bodies).await;
        assert_eq!(results, vec![Ok(()); 4]);
        assert_eq!(out.writes.lock().unwrap().concat(), b"a\nb\n\nc\n");
        let failing = StdoutSink::new(Recording {
            fail: Some(io::ErrorKind::Other),
            ..Recording::default()
        });
        let results = failing
            .handle_batch(["x", "y"].map(Bytes::from).to_vec())
            .await;
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(Result::is_err), "{results:?}");
    }

    #[tokio::test]
    async fn one_caller_keeps_its_order() {
        let out = Recording::default();
        let sink = StdoutSink::new(out.clone());
        for body in ["a", "b\nc", "", "d"] {
            sink.handle(Bytes::from(body)).await.unwrap();
        }
        assert_eq!(out.writes.lock().unwrap().concat(), b"a\nb\nc\n\nd\n");
    }

    #[tokio::test]
    async fn a_broken_pipe_fails_the_records_and_closes_the_sink() {
        let out = Recording {
            fail: Some(io::ErrorKind::BrokenPipe),
            ..Recording::default()
        };
        let sink = StdoutSink::new(out);
        let error = sink.handle(Bytes::from_static(b"x")).await.unwrap_err();
        assert!(
            matches!(&error, HandlerError::Retry(text) if text.starts_with("writing to stdout failed")),
            "{error:?}"
        );
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), sink.closed())
            .await
            .expect("the sink reports that it is closed");
        assert_eq!(closed.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn other_write_errors_fail_the_records_but_keep_the_sink() {
        let out = Recording {
            fail: Some(io::ErrorKind::Other),
            ..Recording::default()
        };
        let sink = StdoutSink::new(out);
        assert!(sink.handle(Bytes::from_static(b"x")).await.is_err());
        let still_open =
            tokio::time::timeout(std::time::Duration::from_millis(100), sink.closed()).await;
        assert!(
            still_open.is_err(),
            "a transient error does not close the sink"
        );
    }
}
