//! A server process on a free loopback port, owned by one test: started and waited for until
//! it accepts connections, stopped and started again on the same port (an outage), and killed
//! on drop, so that every test cleans up even when it fails. `memcached` and `redis-server`
//! are launched through it (see [`super::memcached`] and [`super::redis`]).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports tried before giving up: another process may take a free port between our probe and
/// the server's bind.
const PORT_TRIES: usize = 5;

/// A server process on `127.0.0.1:<port>`, killed on drop.
#[derive(Debug)]
pub struct ServerProcess {
    /// The running process, or `None` while stopped.
    child: Option<Child>,
    port: u16,
    /// The program, and how to install it when it is missing (`apt-get install ...`).
    package: Package,
}

/// A server program the tests start, and how to install it.
#[derive(Debug, Clone, Copy)]
pub struct Package {
    /// What it is called in messages.
    pub name: &'static str,
    /// What to run to install it: `apt-get install memcached`.
    pub install: &'static str,
}

impl ServerProcess {
    /// Starts `command(port)` on a port from `free_port`, trying a few ports, and returns once
    /// it accepts connections. The command's output is discarded; `package` says how to
    /// install the program when it is missing.
    ///
    /// # Panics
    ///
    /// If the program is not installed or does not start within 10 s on any port: the tests
    /// that need it cannot run, and saying so loudly is better than skipping them.
    pub fn start(
        package: Package,
        free_port: fn() -> u16,
        command: impl Fn(u16) -> Command,
    ) -> ServerProcess {
        let mut last_error = String::new();
        for _ in 0..PORT_TRIES {
            let port = free_port();
            let mut server = ServerProcess {
                child: None,
                port,
                package,
            };
            match server.launch(command(port)) {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("could not start {}: {last_error}", package.name);
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

    /// Whether the process runs (it has not been stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the process (SIGKILL) and waits for it; the port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process, then starts `command` on the same port (memory starts empty).
    ///
    /// # Panics
    ///
    /// If it does not come back within 10 s.
    pub fn restart(&mut self, command: Command) {
        self.stop();
        if let Err(err) = self.launch(command) {
            panic!(
                "could not restart {} on port {}: {err}",
                self.package.name, self.port
            );
        }
    }

    /// Sends `signal` (a name such as `STOP`) to the process with `kill`.
    ///
    /// # Panics
    ///
    /// If the server is not running or `kill` fails.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server runs");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// Starts `command` and waits until the port accepts connections.
    fn launch(&mut self, mut command: Command) -> Result<(), String> {
        let program = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| {
                format!(
                    "cannot run {program} ({err}); install it with `{}`",
                    self.package.install
                )
            })?;
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{program} exited with {status} on port {}",
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
                    "{program} did not accept connections within {READY_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0 works on any test machine")
}
