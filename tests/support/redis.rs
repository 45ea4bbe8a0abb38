//! Real `redis-server` processes on free loopback ports, owned by one test: a standalone
//! server ([`RedisServer`]) or a cluster of three masters with a replica each
//! ([`RedisCluster`]).
//!
//! Servers run without persistence, in a temporary directory of their own, and are killed on
//! drop, so every test cleans up even when it fails. `$REDIS_SERVER_BIN` and `$REDIS_CLI_BIN`
//! override `/usr/bin/redis-server` and `/usr/bin/redis-cli`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::server::ServerProcess;

/// How long a new cluster may take to agree on its slots.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

fn server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "/usr/bin/redis-server".to_owned())
}

fn cli_bin() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "/usr/bin/redis-cli".to_owned())
}

/// One `redis-server` on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
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
    /// Starts a standalone server without persistence on a free loopback port.
    ///
    /// # Panics
    ///
    /// If redis-server is not installed or does not start within 10 s: the tests that need
    /// it cannot run, and saying so loudly is better than skipping them.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts a standalone server with extra arguments (such as `--requirepass x`); `{port}`
    /// in an argument stands for the server's port (`--port 0 --tls-port {port}` serves only
    /// TLS there).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`].
    pub fn start_with_args(args: &[&str]) -> Self {
        let temp = tempfile::tempdir().expect("temp dir for redis");
        let dir = temp.path().to_owned();
        let mut server = Self::launch_on_free_port(&dir, args);
        server._temp = Some(temp);
        server
    }

    fn launch_on_free_port(dir: &Path, args: &[&str]) -> Self {
        let extra_args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let process = ServerProcess::start("redis-server", free_port, |port| {
            command(port, dir, &extra_args)
        });
        RedisServer {
            process,
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
        let command = command(self.port(), &self.dir, &self.extra_args);
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
        cli(self.port(), args)
    }
}

/// `redis-server` on `127.0.0.1:<port>` without persistence, in `dir`, with `extra_args`
/// (`{port}` in one stands for the port).
fn command(port: u16, dir: &Path, extra_args: &[String]) -> Command {
    let port = port.to_string();
    let mut command = Command::new(server_bin());
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
    _temp: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts six nodes (node timeout 1 s, so failover takes about two seconds), creates the
    /// cluster and waits until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// If a node does not start or the cluster does not form within 30 s.
    pub fn start() -> Self {
        Self::start_with_node_timeout(Duration::from_secs(1))
    }

    /// As [`RedisCluster::start`], with `cluster-node-timeout` set to `node_timeout`: how long
    /// a master may fail to answer before the others mark it failed and its replica takes
    /// over.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    pub fn start_with_node_timeout(node_timeout: Duration) -> Self {
        let node_timeout = node_timeout.as_millis().to_string();
        let temp = tempfile::tempdir().expect("temp dir for the cluster");
        let mut nodes = Vec::new();
        for i in 0..6 {
            let dir = temp.path().join(format!("node{i}"));
            std::fs::create_dir_all(&dir).expect("node dir");
            nodes.push(RedisServer::launch_on_free_port(
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
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let output = Command::new(cli_bin())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes, _temp: temp };
        cluster.wait_until_ok(&[]);
        cluster
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
                .map(|(_, node)| try_cli(node.port(), &["cluster", "info"]).unwrap_or_default())
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
        let nodes = cli(self.nodes[via].port(), &["cluster", "nodes"]);
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

/// `redis-cli -p <port> <args>`: its standard output.
///
/// # Panics
///
/// If redis-cli cannot run or fails.
pub fn cli(port: u16, args: &[&str]) -> String {
    try_cli(port, args).unwrap_or_else(|err| panic!("redis-cli {args:?}: {err}"))
}

fn try_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new(cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run redis-cli ({err}); install redis-tools"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
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
