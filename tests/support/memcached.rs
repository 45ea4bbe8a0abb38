//! A real `memcached` on a free loopback port, owned by one test.
//!
//! [`MemcachedServer::start`] launches `/usr/bin/memcached` (or `$MEMCACHED_BIN`) on
//! `127.0.0.1`, with UDP off, and returns once it accepts connections. Dropping the server kills
//! the process, so every test cleans up even when it fails. [`MemcachedServer::stop`] and
//! [`MemcachedServer::restart`] (same port, empty memory) simulate an outage.

use std::process::Command;

use super::server::{free_port, Package, ServerProcess};

/// The Debian package.
const PACKAGE: Package = Package {
    name: "memcached",
    install: "apt-get install memcached",
};

/// A memcached process on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct MemcachedServer {
    process: ServerProcess,
    extra_args: Vec<String>,
}

/// The process: `addr`, `port`, `pid`, `stop`.
impl std::ops::Deref for MemcachedServer {
    type Target = ServerProcess;

    fn deref(&self) -> &ServerProcess {
        &self.process
    }
}

impl std::ops::DerefMut for MemcachedServer {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
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
        let process = ServerProcess::start(PACKAGE, free_port, |port| command(port, &extra_args));
        MemcachedServer {
            process,
            extra_args,
        }
    }

    /// Starts a new process on the same port (memcached's memory starts empty).
    ///
    /// # Panics
    ///
    /// If memcached does not come back within 10 s.
    pub fn restart(&mut self) {
        let command = command(self.port(), &self.extra_args);
        self.process.restart(command);
    }
}

/// `memcached` on `127.0.0.1:<port>` with UDP off, and `extra_args`.
fn command(port: u16, extra_args: &[String]) -> Command {
    let binary = std::env::var("MEMCACHED_BIN").unwrap_or_else(|_| "/usr/bin/memcached".to_owned());
    let mut command = Command::new(binary);
    command
        .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
        .args(extra_args);
    if running_as_root() {
        // memcached refuses to run as root unless told which user to be.
        command.args(["-u", "root"]);
    }
    command
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
