//! A child process with a deadline: the `nsq-dedupe` binary (or any program) started by a test,
//! its stdout and stderr gathered as they come, waited for within a bound, and killed when the
//! bound passes or the test lets go of it, so that no test leaves a process behind or hangs.

use std::ffi::OsStr;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The output streams a test reads. The read end of the other one is closed at once, so
/// that the child's writes to it fail as on a closed pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    Both,
    Stdout,
    Stderr,
}

/// A running child, killed on drop.
#[derive(Debug)]
pub struct Child {
    child: std::process::Child,
    /// The command, for messages.
    what: String,
    stdout: Gathered,
    stderr: Gathered,
}

/// What a child wrote and how it ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// One output stream of the child, read into memory by a thread until the child closes it.
#[derive(Debug)]
struct Gathered {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Gathered {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Gathered {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let reader = pipe.map(|mut pipe| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    bytes.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            })
        });
        Gathered { bytes, reader }
    }

    fn so_far(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }

    /// Everything, once the child has closed the stream (it has exited or been killed; a
    /// grandchild that holds the stream open is not waited for longer than a second).
    fn all(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let deadline = Instant::now() + Duration::from_secs(1);
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        self.so_far()
    }
}

impl Child {
    /// Starts `command` with stdout and stderr gathered (stdin is as `command` sets it: the
    /// parent's unless set).
    ///
    /// # Panics
    ///
    /// If the program cannot be started.
    pub fn spawn(command: &mut Command) -> Child {
        Child::spawn_reading(command, Reading::Both)
    }

    /// As [`Child::spawn`], reading only the streams `reading` names.
    pub fn spawn_reading(command: &mut Command, reading: Reading) -> Child {
        let what = format!("{command:?}");
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {what}: {err}"));
        let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
        match reading {
            Reading::Both => {}
            Reading::Stdout => stderr = None,
            Reading::Stderr => stdout = None,
        }
        let stdout = Gathered::start(stdout);
        let stderr = Gathered::start(stderr);
        Child {
            child,
            what,
            stdout,
            stderr,
        }
    }

    /// Starts the `nsq-dedupe` binary with `args`, stdin empty.
    pub fn bin<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Child {
        Child::spawn(
            Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
                .args(args)
                .stdin(Stdio::null()),
        )
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What the child has written to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.so_far()
    }

    /// What the child has written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.so_far()
    }

    /// The first line of stderr that contains `text`, waiting for it at most `limit`; `None`
    /// once the child has exited, or `limit` has passed, without writing it.
    pub fn line_on_stderr(&mut self, text: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            // Looked at before the stream, so that what an exited child wrote is all there.
            let exited = self.has_exited() || Instant::now() > deadline;
            let written = if exited {
                self.stderr.all()
            } else {
                self.stderr()
            };
            // Only whole lines: the last one may still be written.
            let whole = written.rsplit_once('\n').map_or("", |(lines, _)| lines);
            let whole = if exited { written.as_str() } else { whole };
            if let Some(line) = whole.lines().find(|line| line.contains(text)) {
                return Some(line.to_owned());
            }
            if exited {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits at most `limit` for the child to write `n` bytes to stdout: they, or what it
    /// wrote until it exited or `limit` passed.
    pub fn first_stdout_bytes(&mut self, n: usize, limit: Duration) -> Vec<u8> {
        let deadline = Instant::now() + limit;
        loop {
            let exited = self.has_exited() || Instant::now() > deadline;
            if exited {
                // Everything the child wrote, read to the end.
                self.stdout.all();
            }
            let mut bytes = self.stdout.bytes.lock().unwrap().clone();
            if bytes.len() >= n || exited {
                bytes.truncate(n);
                return bytes;
            }
            drop(bytes);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the child has exited (it is reaped if so).
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().expect("the child's status").is_some()
    }

    /// Sends `signal` (a name such as `TERM`) to the child.
    ///
    /// # Panics
    ///
    /// If `kill` fails.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {} failed", self.id());
    }

    /// Waits for the child to exit, at most `limit` (blocking the thread): its status and
    /// output.
    ///
    /// # Panics
    ///
    /// After `limit`, having killed the child, with what it wrote to stderr.
    pub fn wait_within(self, limit: Duration) -> Finished {
        self.finish(Instant::now() + limit, limit, std::thread::sleep)
    }

    /// As [`Child::wait_within`], sleeping on the tokio timer between looks.
    pub async fn finish_within(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        while !self.has_exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.finish(deadline, limit, |_| {})
    }

    /// Sends `signal`, then as [`Child::wait_within`].
    pub fn stop_within(self, signal: &str, limit: Duration) -> Finished {
        self.signal(signal);
        self.wait_within(limit)
    }

    /// Looks until `deadline` (the end of `limit`), with `pause` between looks.
    fn finish(
        mut self,
        deadline: Instant,
        limit: Duration,
        mut pause: impl FnMut(Duration),
    ) -> Finished {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {limit:?}; stderr: {}",
                    self.what,
                    self.stderr.all()
                );
            }
            pause(Duration::from_millis(10));
        };
        Finished {
            status,
            stdout: self.stdout.all(),
            stderr: self.stderr.all(),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Finished {
    /// The exit code; `None` when a signal ended the child.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics, with stderr, unless the child exited with status 0.
    pub fn assert_success(&self) -> &Finished {
        assert!(
            self.status.success(),
            "exited with {}; stderr: {}",
            self.status,
            self.stderr
        );
        self
    }
}
