//! Which of the standard streams (stdin, stdout, stderr) the process was started without, and
//! the check a command makes before it uses one.
//!
//! A shell's `>&-` starts a program with descriptor 1 closed. Rust's runtime then opens
//! `/dev/null` on every closed descriptor among 0, 1 and 2 before `main` (so that a file opened
//! later cannot take that number and receive what was meant for stdout), and the program
//! writes into it without an error: `run` would FIN every message and write it nowhere, and
//! `filter --table-file` would save a table that makes the next run drop every record as a
//! copy. So a command refuses to start without a stream it needs; one redirected to
//! `/dev/null` on purpose (`>/dev/null`) is open, and used as asked.
//!
//! We record the closed descriptors in a constructor that the C runtime calls before Rust's
//! runtime reopens them (std's `sanitize_standard_fds` runs from the C `main`, after every
//! `.init_array` constructor), and ask the descriptor itself: `fcntl(F_GETFD)` fails with
//! `EBADF` only on a closed one. Comparing what descriptor 1 is later (a `/dev/null` opened
//! read-write, where a shell's `>/dev/null` opens it write-only) would be a guess: a
//! supervisor may pass its own read-write `/dev/null` on purpose. The record is exact.
//!
//! The check is the binary's: a program using the library chooses its own streams.
//! Elsewhere than on Linux nothing is recorded, and no stream counts as closed.

use std::sync::atomic::{AtomicU8, Ordering};

/// One bit per standard descriptor (bit `fd`) closed when the process started; written once by
/// [`record_closed_streams`] before `main`, read after.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

/// Called by the C runtime with the other constructors, before `main` and so before Rust's
/// runtime puts `/dev/null` on the closed standard descriptors.
// SAFETY: `.init_array` holds pointers to functions the C runtime (glibc, musl) calls once,
// single-threaded, before `main`, with `(argc, argv, envp)`; a function of the C ABI that
// takes no argument ignores them, as every C constructor does. The function it points to only
// calls `fcntl` and stores to an atomic: it needs nothing of Rust's runtime (no allocation,
// no I/O handle, no thread-local), and cannot panic.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static RECORD_CLOSED_STREAMS: extern "C" fn() = record_closed_streams;

#[cfg(target_os = "linux")]
extern "C" fn record_closed_streams() {
    let mut closed = 0;
    for fd in 0..3 {
        // SAFETY: F_GETFD reads the descriptor's flags and takes no third argument: nothing
        // is passed by pointer, and any integer is a valid argument (a closed descriptor
        // gives -1 with EBADF, its only possible error here).
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    // Relaxed: stored before `main`, while no other thread exists; starting a thread orders
    // this store before everything the thread does, and `main` follows it in this one.
    CLOSED_AT_START.store(closed, Ordering::Relaxed);
}

/// A standard stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdin,
    Stdout,
    Stderr,
}

impl Stream {
    fn fd(self) -> u8 {
        match self {
            Stream::Stdin => 0,
            Stream::Stdout => 1,
            Stream::Stderr => 2,
        }
    }
}

/// A command needs a stream that was closed when the process started. `run` exits with 78
/// (`EX_CONFIG`) on it, as for a setting it cannot use; the other commands with 1.
#[derive(Debug)]
pub(crate) struct ClosedAtStart {
    stream: Stream,
    /// What the command does with the stream, as `` `filter` writes the unique records ``.
    purpose: &'static str,
}

impl std::fmt::Display for ClosedAtStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, short, redirect) = match self.stream {
            Stream::Stdin => ("standard input", "stdin", "</dev/null"),
            Stream::Stdout => ("standard output", "stdout", ">/dev/null"),
            Stream::Stderr => ("standard error", "stderr", "2>/dev/null"),
        };
        let (consequence, on_purpose) = match self.stream {
            Stream::Stdin => ("from there: the input would be empty", "for no input"),
            Stream::Stdout | Stream::Stderr => (
                "there: the output would go nowhere",
                "to discard the output",
            ),
        };
        write!(
            f,
            "{name} (descriptor {}) was closed when nsq-dedupe started, and {} {consequence}. \
             Start it with {short} open, or redirect it (`{redirect}`) {on_purpose} on purpose",
            self.stream.fd(),
            self.purpose,
        )
    }
}

impl std::error::Error for ClosedAtStart {}

/// Refuses to go on when `stream` was closed when the process started.
///
/// # Errors
///
/// [`ClosedAtStart`], which says `purpose`: what the command does with the stream, as
/// `` `filter` writes the unique records ``.
pub(crate) fn require(stream: Stream, purpose: &'static str) -> Result<(), ClosedAtStart> {
    if CLOSED_AT_START.load(Ordering::Relaxed) & (1 << stream.fd()) == 0 {
        Ok(())
    } else {
        Err(ClosedAtStart { stream, purpose })
    }
}
