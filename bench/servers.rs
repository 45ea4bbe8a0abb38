//! Store servers the benchmarks start themselves on free loopback ports, killed on drop, and
//! the CPU time a process has spent. (The bench binaries cannot use the tests' `support`
//! module.)

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store server process, killed on drop.
pub struct Server {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

impl Server {
    /// A redis-server without persistence (`$REDIS_SERVER_BIN`, else
    /// `/usr/bin/redis-server`).
    pub fn redis() -> Result<Self, String> {
        let port = free_port()?;
        let binary = std::env::var("REDIS_SERVER_BIN")
            .unwrap_or_else(|_| "/usr/bin/redis-server".to_owned());
        let mut command = Command::new(&binary);
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(std::env::temp_dir());
        Self::spawn(command, &binary, port)
    }

    /// A memcached with 4 worker threads (its default), 512 MB so nothing is evicted, no UDP
    /// (`$MEMCACHED_BIN`, else `/usr/bin/memcached`).
    pub fn memcached() -> Result<Self, String> {
        let port = free_port()?;
        let binary =
            std::env::var("MEMCACHED_BIN").unwrap_or_else(|_| "/usr/bin/memcached".to_owned());
        let mut command = Command::new(&binary);
        command
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-t", "4", "-m", "512"]);
        let is_root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
            .unwrap_or(false);
        if is_root {
            command.args(["-u", "root"]);
        }
        Self::spawn(command, &binary, port)
    }

    fn spawn(mut command: Command, binary: &str, port: u16) -> Result<Self, String> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {binary}: {e}"))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{binary} did not start"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Server {
            child,
            addr: addr.to_string(),
        })
    }

    /// The server's CPU time (user + system) so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Option<u64> {
        cpu_ticks(&self.child.id().to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// User plus system CPU time of process `pid` (or `self`) so far, in clock ticks (100 per
/// second on Linux unless the kernel was built otherwise).
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}
