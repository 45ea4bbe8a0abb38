//! How the commands write their output: stdout at once, and a closed stdout told from an
//! error (a reader that went away is how `nsq-dedupe filter | head` ends, with status 0).

use std::io::{self, Write};

/// Writes `bytes` to stdout and flushes it.
pub(crate) fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()
}

/// Whether `err` comes from writing to a pipe whose reader went away.
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<crate::filter::FilterError>()
                .is_some_and(|f| matches!(f, crate::filter::FilterError::Io(io) if io.kind() == io::ErrorKind::BrokenPipe))
    })
}
