//! The `stdout` sink: each unique body as one line on standard output.

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, Stdout};
use tokio::sync::Mutex;

use super::{Handler, HandlerError};

/// Writes each body followed by a newline, and flushes, before reporting success; bodies are
/// written byte for byte (a body containing newlines spans several lines).
#[derive(Debug)]
pub struct StdoutSink {
    /// An async mutex: the write and flush are awaited while it is held, so that records
    /// never interleave.
    out: Mutex<Stdout>,
}

impl Default for StdoutSink {
    fn default() -> Self {
        StdoutSink {
            out: Mutex::new(tokio::io::stdout()),
        }
    }
}

impl Handler for StdoutSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        let mut line = Vec::with_capacity(body.len() + 1);
        line.extend_from_slice(&body);
        line.push(b'\n');
        let mut out = self.out.lock().await;
        let written = async {
            out.write_all(&line).await?;
            out.flush().await
        };
        written
            .await
            .map_err(|error| HandlerError::Retry(format!("writing to stdout failed: {error}")))
    }

    async fn flush(&self) -> Result<(), HandlerError> {
        self.out
            .lock()
            .await
            .flush()
            .await
            .map_err(|error| HandlerError::Retry(format!("flushing stdout failed: {error}")))
    }
}
