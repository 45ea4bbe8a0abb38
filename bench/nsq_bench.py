"""What the end-to-end benchmarks share: child processes that die with the benchmark, free
loopback ports, a process's CPU from /proc, a real nsqd to publish to and read /stats from,
and the connections seen on a server port. Imported by bench/sidecar-vs-go.sh and
bench/http-small-server.sh."""

import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
# Messages per /mpub request when publishing.
CHUNK = 10000

# Children must not inherit settings meant for someone's own sidecar.
CHILD_ENV = {k: v for k, v in os.environ.items() if not k.startswith("NSQ_DEDUPE_")}
children = []
libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    # A child outlives a killed benchmark otherwise (PR_SET_PDEATHSIG = 1).
    libc.prctl(1, signal.SIGKILL)


def spawn(argv, log, stdout=subprocess.DEVNULL):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout,
                         stderr=open(log, "wb"), env=CHILD_ENV, preexec_fn=die_with_parent)
    children.append(p)
    return p


def stop(p, grace=15.0):
    """SIGTERM, then SIGKILL after `grace` seconds; returns (exit status, rusage or None)."""
    if p in children:
        children.remove(p)
    if p.returncode is not None:  # already reaped by poll(): no rusage left
        return p.returncode, None
    try:
        p.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    pid = 0
    while not pid and time.monotonic() < deadline:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if not pid:
            time.sleep(0.02)
    if not pid:
        p.kill()
        pid, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru


def kill_children():
    """Kills and reaps every child still running."""
    for p in list(children):
        try:
            p.kill()
            p.wait()
        except ProcessLookupError:
            pass
        if p in children:
            children.remove(p)


def exit_on_signals():
    """On SIGTERM or SIGINT: kill the children, exit 130."""
    def cleanup(*_):
        kill_children()
        sys.exit(130)
    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGINT, cleanup)


def run(main, work, keep):
    """Runs `main`, which returns whether some run failed; then, however it ended, stops every
    child and removes `work` unless `keep`. Exits 1 if some run failed."""
    try:
        failed = main()
    finally:
        kill_children()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print("\nsome runs timed out, lost messages or exited with an error; run again with --keep "
              "to read their logs", file=sys.stderr)
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User+sys time of a live process, exited threads included."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_served(sidecar, http_port, log):
    """Waits until the sidecar `sidecar` (--sink serve) answers /ping on `http_port`: a
    consumer such as nsq_tail gives up on a port that does not answer yet. Exits with the
    end of `log` if it stops or does not answer within 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ping", timeout=1).read()
            return
        except OSError:
            if sidecar.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sidecar did not serve:\n{tail(log)}")
            time.sleep(0.05)


class Nsqd:
    """A fresh nsqd from `nsq_dir` with its data under `work`/`name`, holding up to
    `mem_queue_size` messages per topic in memory; HTTPS too when `tls` has a cert and key."""

    def __init__(self, nsq_dir, work, name, mem_queue_size, tls=None):
        self.tcp, self.http_port = free_port(), free_port()
        self.data = os.path.join(work, name)
        os.makedirs(self.data)
        self.log = self.data + ".nsqd.log"
        argv = [f"{nsq_dir}/nsqd", "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.tcp}", f"--http-address=127.0.0.1:{self.http_port}",
                f"--data-path={self.data}", f"--mem-queue-size={mem_queue_size}", "--log-level=warn"]
        self.https_port = None
        if tls:
            self.https_port = free_port()
            argv += [f"--https-address=127.0.0.1:{self.https_port}",
                     f"--tls-cert={tls['cert']}", f"--tls-key={tls['key']}"]
        self.proc = spawn(argv, self.log)
        self.conn = None
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.request("GET", "/ping") == b"OK":
                    break
            except OSError:
                self.conn = None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"nsqd did not start:\n{tail(self.log)}")
            time.sleep(0.05)

    def request(self, method, path, body=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        try:
            self.conn.request(method, path, body)
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise
        if r.status != 200:
            raise SystemExit(f"nsqd {method} {path}: HTTP {r.status} {data[:200]!r}")
        return data

    def own_port(self):
        return self.conn.sock.getsockname()[1] if self.conn and self.conn.sock else None

    def channel(self, topic, channel):
        s = json.loads(self.request(
            "GET", f"/stats?format=json&topic={topic}&channel={channel}&include_clients=false&include_mem=false"))
        for t in s.get("topics") or []:
            for c in t.get("channels") or []:
                if c["channel_name"] == channel:
                    return c
        raise SystemExit(f"nsqd has no channel {topic}/{channel}")

    def topic_count(self, topic):
        s = json.loads(self.request("GET", f"/stats?format=json&topic={topic}&include_clients=false&include_mem=false"))
        return sum(t["message_count"] for t in s.get("topics") or [] if t["topic_name"] == topic)

    def publish(self, topic, tag, n, body=100):
        """Publishes `n` distinct JSON bodies of `body` bytes, {"id":"TAG-I","pad":"x..."}."""
        for start in range(0, n, CHUNK):
            lines = []
            for i in range(start, min(n, start + CHUNK)):
                head = f'{{"id":"{tag}-{i:010d}","pad":"'
                lines.append(head + "x" * (body - len(head) - 2) + '"}')
            self.request("POST", f"/mpub?topic={topic}", "\n".join(lines).encode())

    def fill(self, topic, channel, tag, n):
        """Creates `topic` and its `channel`, publishes `n` messages and waits until the
        channel holds them all (nsqd copies a topic's messages to its channels in the
        background)."""
        self.request("POST", f"/topic/create?topic={topic}")
        self.request("POST", f"/channel/create?topic={topic}&channel={channel}")
        self.publish(topic, tag, n)
        deadline = time.monotonic() + 30
        while self.channel(topic, channel)["depth"] != n:
            if time.monotonic() > deadline:
                raise SystemExit(f"published {n} but the channel holds {self.channel(topic, channel)['depth']}")
            time.sleep(0.02)

    def drained(self, topic, channel, n):
        """The channel's stats, and whether all `n` messages left it for good."""
        c = self.channel(topic, channel)
        done = c["depth"] + c["in_flight_count"] + c["deferred_count"] == 0 and c["message_count"] == n
        return c, done


def connections(port, exclude=()):
    """Client ports seen on a server port (established and TIME_WAIT sockets)."""
    out = subprocess.run(["ss", "-Htan", f"( sport = :{port} or dport = :{port} )"],
                         capture_output=True, text=True).stdout
    ports = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5 or f[0] == "LISTEN":
            continue
        local, peer = int(f[3].rsplit(":", 1)[1]), int(f[4].rsplit(":", 1)[1])
        ports.add(peer if local == port else local)
    return len(ports - set(exclude))
