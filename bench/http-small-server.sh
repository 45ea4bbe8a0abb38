#!/usr/bin/env bash
# The http sink against a small server: Python's stock ThreadingHTTPServer. See
# `bench/http-small-server.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/http-small-server.sh [OPTIONS]

POSTs N distinct 100-byte bodies to Python's stock http.server.ThreadingHTTPServer (listen
backlog 5; HTTP/1.0, so it closes each connection after its answer) with a handler that reads
the body and answers 200, and prints POSTs per second for:

  baseline     plain Python clients, each POSTing on a new connection per request (as the
               server wants), 1, 2, 4 and 8 of them at once: the server's own speed is the best
  ours         the sidecar (nsq-dedupe run --sink http, its defaults: at most 100 connections)
               draining N messages from a real nsqd into the server
  ours, n=4    the same with --http-concurrency 4: the few connections this server takes,
               known in advance, for what the sidecar's path manages without a stall
  before       the same with another build of the sidecar (--before BIN), e.g. main's
  nsq_to_http  nsq_to_http --n=100 the same way

each as a ratio of the baseline (in the table, the best baseline of the same round; on the
last line, best run against best run). Everything runs on 127.0.0.1 on free ports; every
process is stopped on exit.

Options:
  -n, --messages N     messages (POSTs) per run (default 3000)
  --rounds K           repeat baseline, ours, ours n=4, before, nsq_to_http K times (default 1)
  --before BIN         another nsq-dedupe binary to measure beside ours (default: none)
  --max-in-flight N    for both consumers (default 2500)
  --timeout SECS       limit for one run to drain (default 60 + N/10: nsq_to_http manages
                       15 to 30 a second)
  --keep               keep the work directory (nsqd data, logs, the server's script)
  -h, --help           this text

Environment:
  NSQ_DEDUPE_BIN   the sidecar binary to measure (default: `cargo build --release` of this
                   checkout, then target/release/nsq-dedupe)
  NSQ_BIN_DIR      directory with NSQ v1.3.0's nsqd and nsq_to_http (default /work/nsq-real/bin)

Method: for every run a fresh server and, for the consumers, a fresh nsqd holding the N
messages (published with /mpub before the consumer starts, one topic and channel). A consumer
run ends when nsqd's /stats shows the channel drained (depth, in flight and deferred at 0,
all N counted): POSTs/s = N / (drain time - start time). The server counts the POSTs it
answered and their distinct bodies: fewer than N distinct marks the run LOST; POSTs beyond N
(retries of requests the server did answer) are shown as copies; a run that timed out left
the rest in nsqd. "conns" counts the client ports seen on the server's port right after the
run (TIME_WAIT included, which lasts 60 s: a longer run shows fewer). CPU is the
consumer's user+sys time per message. The last line is machine-readable:
  RESULT n=N baseline=POSTS/S ours=POSTS/S ours_ratio=R ours_n4=POSTS/S ours_n4_ratio=R
    nsq_to_http=POSTS/S nsq_to_http_ratio=R
(one line; with before= and before_ratio= when --before is given): the best run of each, and
its ratio to the best baseline run. The table's ratio column is against the best baseline of
the same round.

Examples:
  bench/http-small-server.sh
  NSQ_BIN_DIR=/work/nsq-real/nsq/bin bench/http-small-server.sh -n 3000 --rounds 2 \
    --before /path/to/main/target/release/nsq-dedupe
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/nsq_bench.sh
source "$here/bench/nsq_bench.sh"
messages=3000
rounds=1
before=""
max_in_flight=2500
timeout=""
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -n|--messages) messages=${2:?"$1 needs a number"}; shift 2 ;;
    --rounds) rounds=${2:?"$1 needs a number"}; shift 2 ;;
    --before) before=${2:?"$1 needs a binary"}; shift 2 ;;
    --max-in-flight) max_in_flight=${2:?"$1 needs a number"}; shift 2 ;;
    --timeout) timeout=${2:?"$1 needs seconds"}; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "http-small-server.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
positive_whole http-small-server.sh "messages:$messages" "rounds:$rounds" "max-in-flight:$max_in_flight" "timeout:${timeout:-1}"
if [ -n "$before" ] && [ ! -x "$before" ]; then
  echo "http-small-server.sh: --before $before is not an executable file" >&2
  exit 2
fi

nsq_bin_dir=${NSQ_BIN_DIR:-/work/nsq-real/bin}
need_tools http-small-server.sh "$nsq_bin_dir" nsqd nsq_to_http

ours=$(sidecar_binary http-small-server.sh "$here")

work=$(mktemp -d "${TMPDIR:-/tmp}/http-small-server.XXXXXX")
[ "$keep" = 1 ] && echo "work directory (kept): $work" >&2

export BENCH_MESSAGES=$messages BENCH_ROUNDS=$rounds BENCH_BEFORE=$before \
  BENCH_MAX_IN_FLIGHT=$max_in_flight BENCH_TIMEOUT=$timeout BENCH_WORK=$work BENCH_KEEP=$keep \
  BENCH_OURS=$ours BENCH_NSQ_BIN=$nsq_bin_dir
# The helpers shared with the other end-to-end benchmarks.
export PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}"
# exec: a signal to this script (timeout, kill) reaches the program that owns the processes.
exec python3 - <<'PY'
import http.client, json, os, shlex, signal, sys, threading, time
import nsq_bench as nb

N = int(os.environ["BENCH_MESSAGES"])
ROUNDS = int(os.environ["BENCH_ROUNDS"])
BEFORE = os.environ["BENCH_BEFORE"]
MIF = os.environ["BENCH_MAX_IN_FLIGHT"]
TIMEOUT = float(os.environ["BENCH_TIMEOUT"] or 60 + N / 10)
WORK = os.environ["BENCH_WORK"]
OURS = os.environ["BENCH_OURS"]
NSQ = os.environ["BENCH_NSQ_BIN"]
CLIENTS = (1, 2, 4, 8)
nb.exit_on_signals()

# The server: the standard library's, stock. It counts the POSTs it answered and their
# distinct bodies, and tells them on GET /count.
SERVER = r'''
import http.server, json, sys, threading
lock = threading.Lock()
posts = 0
bodies = set()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global posts
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            posts += 1
            bodies.add(body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"OK")

    def do_GET(self):
        with lock:
            answer = json.dumps({"posts": posts, "distinct": len(bodies)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''
with open(os.path.join(WORK, "server.py"), "w") as f:
    f.write(SERVER)


class Server:
    def __init__(self, name):
        self.port = nb.free_port()
        self.log = os.path.join(WORK, f"{name}.server.log")
        self.proc = nb.spawn([sys.executable, os.path.join(WORK, "server.py"), str(self.port)], self.log)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.count()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start:\n{nb.tail(self.log)}")
                time.sleep(0.05)
        self.cpu0 = nb.cpu_seconds(self.proc.pid)

    def count(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("GET", "/count")
            return json.loads(c.getresponse().read())
        finally:
            c.close()

    def url(self):
        return f"http://127.0.0.1:{self.port}/in"


def body(tag, i):
    head = f'{{"id":"{tag}-{i:010d}","pad":"'
    return (head + "x" * (100 - len(head) - 2) + '"}').encode()


def baseline(r, clients):
    """N POSTs from `clients` threads, a new connection per request; POSTs/s."""
    s = Server(f"baseline-{r}-{clients}")
    try:
        left = iter(range(N))
        lock = threading.Lock()
        errors = []

        def client():
            while True:
                with lock:
                    i = next(left, None)
                if i is None:
                    return
                try:
                    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
                    c.request("POST", "/in", body(f"b{r}c{clients}", i),
                              {"Content-Type": "application/octet-stream"})
                    c.getresponse().read()
                    c.close()
                except (OSError, http.client.HTTPException) as e:
                    errors.append(e)
        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        count = s.count()
        status = "ok" if count["distinct"] == N else f"LOST {N - count['distinct']}"
        if errors:
            status += f"; {len(errors)} failed ({errors[0]})"
        return dict(wall=wall, rate=N / wall, status=status, conns=nb.connections(s.port),
                    cpu=None, notes=[])
    finally:
        nb.stop(s.proc)


def consumer(r, label, argv_for):
    """The consumer `argv_for(nsqd, topic, url)` drains N messages from a fresh nsqd into a
    fresh server."""
    d = nb.Nsqd(NSQ, WORK, f"{label}-{r}", N + nb.CHUNK)
    s = Server(f"{label}-{r}")
    topic = f"bench{r}"
    p = None
    try:
        d.fill(topic, "c", f"{label}{r}p{os.getpid()}", N)
        argv = argv_for(d, topic, s.url())
        log = os.path.join(WORK, f"{label}-{r}.log")
        t0 = time.monotonic()
        p = nb.spawn(argv, log)
        status = "ok"
        while True:
            c, done = d.drained(topic, "c", N)
            if done:
                break
            if p.poll() is not None:
                raise SystemExit(f"{label} exited with {p.returncode} before draining:\n"
                                 f"  {shlex.join(argv)}\n{nb.tail(log)}")
            if time.monotonic() - t0 > TIMEOUT:
                status = f"TIMEOUT ({c['depth'] + c['in_flight_count'] + c['deferred_count']} left)"
                break
            time.sleep(0.02)
        wall = time.monotonic() - t0
        cpu = nb.cpu_seconds(p.pid)
        conns = nb.connections(s.port)
        code, _ = nb.stop(p)
        if code not in (0, -signal.SIGTERM, 143) and status == "ok":
            status = f"exit {code}"
        count = s.count()
        # A run stopped before it drained leaves messages in nsqd: lost only if it drained.
        if count["distinct"] < N and status == "ok":
            status = f"LOST {N - count['distinct']}"
        notes = []
        if c["requeue_count"] or c["timeout_count"]:
            notes.append(f"requeued {c['requeue_count']}, timed out {c['timeout_count']}")
        if count["posts"] > N:
            notes.append(f"{count['posts'] - N} copies")
        return dict(wall=wall, rate=N / wall, status=status, conns=conns, cpu=cpu, notes=notes)
    finally:
        if p is not None:
            nb.stop(p)
        nb.stop(s.proc)
        nb.stop(d.proc)


def sidecar(binary, extra=()):
    def argv(d, topic, url):
        return [binary, "run", "--nsqd-tcp-address", f"127.0.0.1:{d.tcp}", "--topic", topic,
                "--channel", "c", "--max-in-flight", MIF, "--metrics-address", "off",
                "--sink", "http", "--post", url, *extra]
    return argv


def nsq_to_http(d, topic, url):
    return [f"{NSQ}/nsq_to_http", f"--nsqd-tcp-address=127.0.0.1:{d.tcp}", f"--topic={topic}",
            "--channel=c", f"--max-in-flight={MIF}", f"--post={url}", "--n=100"]


def main():
    print(f"ours:   {OURS}")
    if BEFORE:
        print(f"before: {BEFORE}")
    print(f"nsq:    {NSQ}/nsqd, nsq_to_http")
    print(f"server: Python {sys.version.split()[0]} http.server.ThreadingHTTPServer (backlog 5, HTTP/1.0)")
    print(f"{N:,} POSTs of 100 bytes per run, --max-in-flight {MIF}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start\n")
    print(f"{'round':>5}  {'client':<22} {'wall s':>7} {'POSTs/s':>8} {'ratio':>6} {'µs CPU/msg':>10} {'conns':>6}  status")
    best = {}
    failed = False
    for r in range(1, ROUNDS + 1):
        runs = []
        for clients in CLIENTS:
            runs.append((f"baseline, {clients} client{'s' if clients > 1 else ''}", "baseline",
                         baseline(r, clients)))
        base = max(x["rate"] for _, _, x in runs)
        consumers = [("ours", "ours", sidecar(OURS)),
                     ("ours, n=4", "ours_n4", sidecar(OURS, ["--http-concurrency", "4"]))]
        if BEFORE:
            consumers.append(("before", "before", sidecar(BEFORE)))
        consumers.append(("nsq_to_http --n=100", "nsq_to_http", nsq_to_http))
        for name, key, argv in consumers:
            runs.append((name, key, consumer(r, key, argv)))
        for name, key, x in runs:
            cpu = f"{x['cpu'] / N * 1e6:>10.1f}" if x["cpu"] is not None else f"{'':>10}"
            print(f"{r:>5}  {name:<22} {x['wall']:>7.2f} {x['rate']:>8,.0f} {x['rate'] / base:>6.2f} "
                  f"{cpu} {x['conns']:>6}  " + "; ".join([x["status"]] + x["notes"]), flush=True)
            if x["status"] != "ok":
                failed = True
                continue
            best[key] = max(best.get(key, 0), x["rate"])
    # Best against best: the load other programs put on the machine swings from one run to
    # the next, so a ratio within one round can be a lucky or an unlucky pair.
    result = f"RESULT n={N}"
    for key in ("baseline", "ours", "ours_n4", "before", "nsq_to_http"):
        if key in best:
            result += f" {key}={best[key]:.0f}"
            if key != "baseline" and "baseline" in best:
                result += f" {key}_ratio={best[key] / best['baseline']:.2f}"
    print("\nbest run of each, as a ratio of the best baseline:")
    print(result, flush=True)
    return failed


nb.run(main, WORK, os.environ["BENCH_KEEP"] == "1")
PY
