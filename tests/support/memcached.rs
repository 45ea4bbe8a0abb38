//! A real `memcached` on a free loopback port, owned by one test.
//!
//! [`MemcachedServer::start`] launches `/usr/bin/memcached` (or `$MEMCACHED_BIN`) on
//! `127.0.0.1`, with UDP off, and returns once it accepts connections. Dropping the server kills
//! the process, so every test cleans up even when it fails. [`MemcachedServer::stop`] and
//! [`MemcachedServer::restart`] (same port, empty memory) simulate an outage.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh memcached may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A memcached process on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct MemcachedServer {
    /// The running process, or `None` while stopped.
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
}

impl MemcachedServer {
    /// Starts memcached with its defaults (64 MB, 4 threads) on a free loopback port.
    ///
    /// # Panics
    ///
    /// If memcached is not installed or does not start within 10 s: the tests that need it
    /// cannot run, and saying so loudly is better than skipping them.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts memcached with extra command-line arguments (such as `-t 2`).
    ///
    /// # Panics
    ///
    /// As [`MemcachedServer::start`].
    pub fn start_with_args(args: &[&str]) -> Self {
        let extra_args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        // Another process may take the free port between our probe and memcached's bind, so
        // try a few ports.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = MemcachedServer {
                child: None,
                port,
                extra_args: extra_args.clone(),
            };
            match server.launch() {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("could not start memcached: {last_error}");
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process and waits for it to exit; the port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a new process on the same port (memcached's memory starts empty).
    ///
    /// # Panics
    ///
    /// If memcached does not come back within 10 s.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(err) = self.launch() {
            panic!("could not restart memcached on port {}: {err}", self.port);
        }
    }

    fn launch(&mut self) -> Result<(), String> {
        let binary =
            std::env::var("MEMCACHED_BIN").unwrap_or_else(|_| "/usr/bin/memcached".to_owned());
        let mut command = Command::new(&binary);
        command
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-U", "0"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if running_as_root() {
            // memcached refuses to run as root unless told which user to be.
            command.args(["-u", "root"]);
        }
        let mut child = command.spawn().map_err(|err| {
            format!("cannot run {binary} ({err}); install it with `apt-get install memcached`")
        })?;
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "memcached exited with {status} on port {}",
                    self.port
                ));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "memcached did not accept connections within {READY_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0 works on any test machine")
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .map(|uids| uids.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false)
}
