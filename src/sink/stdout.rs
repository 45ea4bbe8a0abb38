//! The `stdout` sink: each unique body as one line on standard output, group-committed.
//!
//! One writer thread owns standard output, behind the sink's [`Batcher`]. Each
//! [`handle_batch`](Handler::handle_batch) (or [`handle`](Handler::handle)) queues its records
//! as one request and waits; the thread takes every request queued by then, writes their
//! records with one `write` of one buffer, flushes, and only then answers each request, so a
//! message is finished at nsqd only after its line has left the process. Requests that arrive
//! while a write is in flight share the next one, so the cost of a write and a flush is paid
//! once per batch, not once per message, and a burst costs one wake-up. Records are written in
//! the order they were queued.
//!
//! A thread rather than a task: writing to a pipe blocks, and a blocked write must not hold a
//! runtime worker. A write error fails every record of its batch (their messages are
//! requeued); a closed stdout (`EPIPE`, the reader went away) also closes the sink, and the
//! sidecar stops (see [`StdoutSink::closed`]).

use std::future::Future;
use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use super::batcher::{Batcher, Flush, Results, Settings};
use super::{BuiltIn, Handler, HandlerError, Watch};

/// The most records one write carries (a request of more is written alone); a bound on the
/// buffer, not a wait.
const MAX_BATCH_RECORDS: usize = 4096;

/// Writes each body followed by a newline, and flushes, before reporting success; bodies are
/// written byte for byte (a body containing newlines spans several lines).
#[derive(Debug)]
pub struct StdoutSink {
    /// The writer thread's queue. The thread ends when this is dropped.
    batcher: Batcher,
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
        let (closed_tx, closed) = watch::channel(None);
        let writer = Writer {
            out,
            buffer: Vec::with_capacity(64 * 1024),
            closed: closed_tx,
        };
        let batcher = Batcher::spawn_thread(
            "nsq-dedupe-stdout",
            "the stdout writer",
            Settings::new(MAX_BATCH_RECORDS),
            writer,
        );
        StdoutSink { batcher, closed }
    }

    /// Completes, with the reason, once stdout is closed for good (its reader went away): the
    /// sink can never write again. Never completes while the sink can still write.
    pub fn closed(&self) -> impl Future<Output = io::Error> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            // The writer thread gone without a broken pipe: nothing more will be written.
            let stopped =
                || io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer has stopped");
            match closed.wait_for(Option::is_some).await {
                Ok(error) => error.as_ref().map_or_else(stopped, |error| {
                    io::Error::new(error.kind(), error.to_string())
                }),
                Err(_) => stopped(),
            }
        }
    }
}

/// The writer thread's side: one write and one flush per batch.
struct Writer<W> {
    out: W,
    buffer: Vec<u8>,
    /// Told when stdout is closed for good; dropped with the thread.
    closed: watch::Sender<Option<Arc<io::Error>>>,
}

impl<W: Write + Send + 'static> Flush for Writer<W> {
    fn flush(&mut self, records: Vec<Bytes>) -> impl Future<Output = Results> + Send + 'static {
        self.buffer.clear();
        for body in &records {
            self.buffer.extend_from_slice(body);
            self.buffer.push(b'\n');
        }
        let result = self
            .out
            .write_all(&self.buffer)
            .and_then(|()| self.out.flush())
            .map_err(|error| {
                let error = Arc::new(error);
                if error.kind() == io::ErrorKind::BrokenPipe {
                    self.closed.send_replace(Some(error.clone()));
                }
                failed(&error)
            });
        if self.buffer.capacity() > 16 * 1024 * 1024 {
            // One huge batch must not pin its buffer for the rest of the run.
            self.buffer = Vec::with_capacity(64 * 1024);
        }
        std::future::ready(vec![result; records.len()])
    }
}

fn failed(error: &io::Error) -> HandlerError {
    HandlerError::Retry(format!("writing to stdout failed: {error}"))
}

impl Handler for StdoutSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        self.batcher.submit_one(body).await
    }

    fn handles_batches(&self) -> bool {
        true
    }

    /// One request for the whole batch: its records are written by one `write`, and a failed
    /// write fails every one of them.
    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        self.batcher.submit(bodies).await
    }
}

impl BuiltIn for StdoutSink {
    fn watch(&self) -> Watch {
        Watch {
            closed: Some(Box::pin(self.closed())),
            ..Watch::default()
        }
    }
}

/// The stdout sink has no keys of `[sink]` but `sink.kind`, and no settings.
pub(crate) use super::room::no_sink_keys as sink_keys;

super::room::room_without_settings!(StdoutSink, "stdout", StdoutSink::default());

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
