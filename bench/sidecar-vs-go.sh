#!/usr/bin/env bash
# End-to-end benchmark of the sidecar (`nsq-dedupe run`) against NSQ's own Go tools on a real
# nsqd. See `bench/sidecar-vs-go.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/sidecar-vs-go.sh [OPTIONS] SCENARIO...

Drains N messages of 100 bytes (distinct JSON bodies, {"id":...}) from a real nsqd with the
sidecar and with a baseline, in the order baseline, ours, ours, baseline, and prints for each
run the messages per second and the consumer's CPU per message, then the ratios of the best of
each side. Everything runs on 127.0.0.1 on free ports; every process is stopped on exit.

Scenarios (baseline first, then ours):
  null        nsq_tail > /dev/null            vs  ours --sink null (in-process table)
  stdout      nsq_tail > /dev/null            vs  ours --sink stdout > /dev/null
  nsq         nsq_to_nsq to a second topic    vs  ours --sink nsq to a second topic
  http        nsq_to_http --n=100 to nsqd's HTTP /pub  vs  ours --sink http to the same
  https       nsq_to_http --n=100 to nsqd's HTTP /pub  vs  ours --sink http to nsqd's HTTPS /pub
              (a CA and a certificate for 127.0.0.1 made with openssl)
  memcached   ours --store none --sink null   vs  ours --store memcached --sink null (both
                                                   --store-sink)
              (a memcached on a free port, shared by the runs; its CPU is shown too)
  redis       ours --store none --sink null   vs  ours --store redis --sink null (both
                                                   --store-sink)
              (a redis-server on a free port, no persistence, shared by the runs; its CPU too)
              Each store run meets a full table of its own (see --store-buckets)
  table       ours --store none --sink null   vs  ours --store memory --sink null (the in-process
              table: what deduplication costs)
  table-file  ours --sink null                vs  ours --sink null --table-file FILE (new file each run)
  serve       nsq_tail on nsqd                vs  ours --sink serve, nsq_tail on its served port
  serve-relay ours --sink nsq to a second topic on the same nsqd, nsq_tail on that topic
                                              vs  ours --sink serve, nsq_tail on its served port
              (in both, nsq_tail's output goes to a file whose lines are counted; CPU is
              the total of nsqd, the sidecar and nsq_tail)
  all         every scenario above, in this order

Options:
  -n, --messages N     messages per run (default 300000; 50000 for http and https, whose
                       one-POST-per-message runs take minutes at 300000)
  --pairs K            repeat baseline, ours, ours, baseline K times (default 1)
  --max-in-flight N    for every consumer (default 2500)
  --ours-args "ARGS"   extra flags for every run of ours (shell words), e.g. "--ways 1"
  --base-args "ARGS"   extra flags for the Go tool (or for the ours-baseline of memcached, redis,
                       table, table-file and serve-relay)
  --store-sink SINK    the sink of ours in the memcached and redis scenarios, and of their
                       no-store baseline, so the two differ by the store alone (default null: a
                       sink that cannot fail, so one write a message; stdout, to /dev/null: a
                       claim and a commit a message, as for every sink that can fail)
  --store-buckets S    the table of the memcached and redis runs: S slots (--buckets; default
                       1048576, 131,072 sets of 8 ways). Each store run gets its own namespace,
                       on a server emptied first (flush_all, FLUSHALL), filled before the run
                       with --store-fill distinct messages of another topic drained by the same
                       build with the same flags and --sink null (one write each), so that
                       every run meets the same full table, whatever its place in the order
  --store-fill F       messages written to each store run's table before it (default: S, which
                       leaves 1 set in 3,000 empty and most at their 8 ways; 0: an empty table)
  --ours-post-path P   path ours POSTs to in http/https (default /pub; e.g. /mpub with batches)
  --base-bin PATH      the baseline is this other build of the sidecar, run with the same flags
                       as ours (--ours-args included), in place of the Go tool or of the
                       scenario's ours-baseline: a before/after comparison of two builds
  --timeout SECS       limit for one run to drain (default 30 + N/500)
  --keep               keep the work directory (nsqd data, logs, certificates)
  -h, --help           this text

Environment:
  NSQ_DEDUPE_BIN   the sidecar binary to measure (default: `cargo build --release` of this
                   checkout, then target/release/nsq-dedupe)
  NSQ_BIN_DIR      directory with NSQ v1.3.0's nsqd, nsq_tail, nsq_to_nsq and nsq_to_http
                   (default /work/nsq-real/bin)
  REDIS_SERVER_BIN the server of the redis scenario (default: redis-server on PATH); a
                   valkey-server 8.1 measures the store's SET … IFEQ path

Method: for every run a fresh nsqd (--mem-queue-size above N, so nothing touches disk), one
topic and one channel created before publishing, the N messages published with /mpub in
chunks of 10,000, then the consumer started. The run ends when nsqd's /stats (polled every
10 ms) shows the channel's depth, in-flight and deferred counts at 0 with all N messages
counted. msg/s = N / (drain time - start time). CPU is the consumer's user+sys time from
/proc/PID/stat at that moment (10 ms ticks); "exit" adds its shutdown (rusage at exit).
nsqd's CPU over the drain is shown per message too. For nsq, http and https the destination
topic must have received N messages, else the run is marked LOST.
For serve and serve-relay the consumer is a chain: the sidecar, started first (for serve,
nsq_tail starts once the sidecar's HTTP /ping answers), then nsq_tail writing to a file.
The run ends when nsq_tail has written N lines and every channel on the way is drained (the
source's, and for the relay the second topic's with at least N messages); "µs CPU/msg" is
then the chain's (sidecar + nsq_tail), "sidecar" the sidecar's alone ("-" for nsq_tail on
nsqd), "tail" nsq_tail's alone, "total" the chain's plus nsqd's, and the file must hold all
N distinct bodies, else the run is marked LOST. For http and https, "conns" counts the
client ports seen on nsqd's HTTP(S) port right after the drain, established or in
TIME_WAIT: the connections accepted, at least (a port reused from TIME_WAIT counts once, so
beyond about 10,000 the count is capped by the local port range, not by the client).
Status: TIMEOUT, LOST k (messages missing downstream) or exit CODE (the consumer failed)
marks a failed run, left out of the ratios, and the script exits 1; requeues, timeouts and
copies downstream are shown beside "ok".
The last line of each scenario is machine-readable:
  RESULT scenario=null n=300000 base=nsq_tail base_msgs=... ours_msgs=... speed=1.99 cpu=1.78
where speed = best ours msg/s / best baseline msg/s and cpu = best baseline CPU per message /
best ours CPU per message: above 1, ours is faster, or uses less CPU per message. For serve
and serve-relay, cpu is the ratio of the totals (nsqd + sidecar + nsq_tail), which the line
also gives as base_total_us and ours_total_us, and the least sidecar CPU per message of each
side with a sidecar as base_sidecar_us and ours_sidecar_us.

Examples:
  bench/sidecar-vs-go.sh null
  bench/sidecar-vs-go.sh -n 100000 --pairs 2 null stdout nsq
  NSQ_DEDUPE_BIN=/path/to/other/target/release/nsq-dedupe bench/sidecar-vs-go.sh all
  bench/sidecar-vs-go.sh --base-bin /tmp/nsq-dedupe-main --pairs 3 stdout nsq
  bench/sidecar-vs-go.sh -n 200000 --pairs 2 serve serve-relay
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/nsq_bench.sh
source "$here/bench/nsq_bench.sh"
messages=""
pairs=1
max_in_flight=2500
ours_args=""
base_args=""
post_path=/pub
store_sink=null
store_buckets=1048576
store_fill=""
base_bin=""
timeout=""
keep=0
scenarios=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -n|--messages) messages=${2:?"$1 needs a number"}; shift 2 ;;
    --pairs) pairs=${2:?"$1 needs a number"}; shift 2 ;;
    --max-in-flight) max_in_flight=${2:?"$1 needs a number"}; shift 2 ;;
    --ours-args) ours_args=${2?"$1 needs a value"}; shift 2 ;;
    --base-args) base_args=${2?"$1 needs a value"}; shift 2 ;;
    --store-sink)
      case "${2:-}" in
        null|stdout) store_sink=$2; shift 2 ;;
        *) echo "sidecar-vs-go.sh: --store-sink takes null or stdout, not '${2:-}'" >&2; exit 2 ;;
      esac ;;
    --store-buckets) store_buckets=${2:?"$1 needs a number"}; shift 2 ;;
    --store-fill) store_fill=${2:?"$1 needs a number"}; shift 2 ;;
    --ours-post-path) post_path=${2:?"$1 needs a path"}; shift 2 ;;
    --base-bin) base_bin=${2:?"$1 needs a path"}; shift 2 ;;
    --timeout) timeout=${2:?"$1 needs seconds"}; shift 2 ;;
    --keep) keep=1; shift ;;
    all) scenarios+=(null stdout nsq http https memcached redis table table-file serve serve-relay); shift ;;
    null|stdout|nsq|http|https|memcached|redis|table|table-file|serve|serve-relay) scenarios+=("$1"); shift ;;
    *) echo "sidecar-vs-go.sh: unknown argument '$1' (scenarios: null stdout nsq http https memcached redis table table-file serve serve-relay all; see --help)" >&2
       exit 2 ;;
  esac
done
if ! [[ ${store_fill:-0} =~ ^[0-9]+$ ]]; then
  echo "sidecar-vs-go.sh: --store-fill must be a whole number of messages (0 for an empty table), got '$store_fill'" >&2
  exit 2
fi
positive_whole sidecar-vs-go.sh "messages:${messages:-1}" "pairs:$pairs" "max-in-flight:$max_in_flight" "timeout:${timeout:-1}" \
  "store-buckets:$store_buckets"
if [ ${#scenarios[@]} -eq 0 ]; then
  echo "sidecar-vs-go.sh: name at least one scenario (null stdout nsq http https memcached redis table table-file serve serve-relay all); see --help" >&2
  exit 2
fi

nsq_bin_dir=${NSQ_BIN_DIR:-/work/nsq-real/bin}
need_tools sidecar-vs-go.sh "$nsq_bin_dir" nsqd nsq_tail nsq_to_nsq nsq_to_http
for s in "${scenarios[@]}"; do
  if [ "$s" = memcached ] && ! command -v memcached >/dev/null; then
    echo "sidecar-vs-go.sh: the memcached scenario needs memcached on PATH (Debian package: memcached)" >&2
    exit 1
  fi
  if [ "$s" = redis ] && ! command -v "${REDIS_SERVER_BIN:-redis-server}" >/dev/null; then
    echo "sidecar-vs-go.sh: the redis scenario needs redis-server on PATH (Debian package: redis-server) or \$REDIS_SERVER_BIN" >&2
    exit 1
  fi
  if [ "$s" = https ] && ! command -v openssl >/dev/null; then
    echo "sidecar-vs-go.sh: the https scenario needs openssl on PATH (Debian package: openssl)" >&2
    exit 1
  fi
done

if [ -n "$base_bin" ] && [ ! -x "$base_bin" ]; then
  echo "sidecar-vs-go.sh: --base-bin $base_bin is not an executable file" >&2
  exit 2
fi
ours=$(sidecar_binary sidecar-vs-go.sh "$here")

work=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-vs-go.XXXXXX")
[ "$keep" = 1 ] && echo "work directory (kept): $work" >&2

export BENCH_MESSAGES=$messages BENCH_PAIRS=$pairs BENCH_MAX_IN_FLIGHT=$max_in_flight \
  BENCH_OURS_ARGS=$ours_args BENCH_BASE_ARGS=$base_args BENCH_POST_PATH=$post_path BENCH_STORE_SINK=$store_sink \
  BENCH_STORE_BUCKETS=$store_buckets BENCH_STORE_FILL=${store_fill:-$store_buckets} \
  BENCH_TIMEOUT=$timeout BENCH_BASE_BIN=$base_bin BENCH_WORK=$work BENCH_KEEP=$keep BENCH_OURS=$ours BENCH_NSQ_BIN=$nsq_bin_dir
# The helpers shared with the other end-to-end benchmarks.
export PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}"
# exec: a signal to this script (timeout, kill) reaches the program that owns the processes.
exec python3 - "${scenarios[@]}" <<'PY'
import http.client, os, shlex, signal, socket, subprocess, sys, time
import nsq_bench as nb

N_GIVEN = int(os.environ["BENCH_MESSAGES"] or 0)
N = 0  # messages per run of the current scenario; set by main()
PAIRS = int(os.environ["BENCH_PAIRS"])
MIF = os.environ["BENCH_MAX_IN_FLIGHT"]
OURS_ARGS = shlex.split(os.environ["BENCH_OURS_ARGS"])
BASE_ARGS = shlex.split(os.environ["BENCH_BASE_ARGS"])
POST_PATH = os.environ["BENCH_POST_PATH"]
STORE_SINK = os.environ["BENCH_STORE_SINK"]
STORE_BUCKETS = os.environ["BENCH_STORE_BUCKETS"]
STORE_FILL = int(os.environ["BENCH_STORE_FILL"])
BASE_BIN = os.environ["BENCH_BASE_BIN"]
TIMEOUT_GIVEN = float(os.environ["BENCH_TIMEOUT"] or 0)
WORK = os.environ["BENCH_WORK"]
OURS = os.environ["BENCH_OURS"]
NSQ = os.environ["BENCH_NSQ_BIN"]
BODY = 100
CHUNK = nb.CHUNK
spawn, stop, free_port, cpu_seconds, peak_rss_mib, tail, connections = (
    nb.spawn, nb.stop, nb.free_port, nb.cpu_seconds, nb.peak_rss_mib, nb.tail, nb.connections)
nb.exit_on_signals()


def Nsqd(name, tls=None, fill=0):
    return nb.Nsqd(NSQ, WORK, name, max(N, fill) + CHUNK, tls)


def make_certs():
    d = os.path.join(WORK, "tls")
    if os.path.exists(d):
        return {"ca": f"{d}/ca.pem", "cert": f"{d}/cert.pem", "key": f"{d}/key.pem"}
    os.makedirs(d)
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        f"openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca "
        f"-keyout {d}/ca.key -out {d}/ca.pem",
        f"openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout {d}/key.pem -out {d}/cert.csr",
        f"openssl x509 -req -in {d}/cert.csr -CA {d}/ca.pem -CAkey {d}/ca.key -CAcreateserial "
        f"-days 2 -extfile {d}/ext.cnf -out {d}/cert.pem",
    ):
        subprocess.run(shlex.split(cmd), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"ca": f"{d}/ca.pem", "cert": f"{d}/cert.pem", "key": f"{d}/key.pem"}


def ours_cmd(d, extra):
    return [OURS, "run", "--nsqd-tcp-address", f"127.0.0.1:{d.tcp}", "--topic", d.topic,
            "--channel", "c", "--max-in-flight", MIF, "--metrics-address", "off"] + extra


def go_cmd(tool, d, extra):
    return [f"{NSQ}/{tool}", f"--nsqd-tcp-address=127.0.0.1:{d.tcp}", f"--topic={d.topic}",
            "--channel=c", f"--max-in-flight={MIF}"] + extra + BASE_ARGS


def tail_cmd(port, topic):
    """nsq_tail at the end of a serve or serve-relay chain, on any nsqd-speaking port."""
    return [f"{NSQ}/nsq_tail", f"--nsqd-tcp-address=127.0.0.1:{port}", f"--topic={topic}",
            "--channel=c", f"--max-in-flight={MIF}"]


def store_table(r):
    """The table of store run `r`: a namespace of its own, of --store-buckets slots."""
    return ["--namespace", f"bench-{os.getpid()}-{r}", "--buckets", STORE_BUCKETS]


def store_table_text():
    return (f"a table of {int(STORE_BUCKETS):,} slots " +
            (f"filled with {STORE_FILL:,} messages first" if STORE_FILL else "empty") + " each run")


def empty_store(addr, command, ok):
    """Empties the benchmark's own store server at `addr` (`command` answered `ok`), so
    that the entries of earlier runs take none of its memory."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(command)
        answer = b""
        while not answer.endswith(b"\r\n"):
            chunk = s.recv(64)
            if not chunk:
                break
            answer += chunk
    if answer != ok:
        raise SystemExit(f"{addr} answered {command.strip()!r} with {answer!r}")


def fill_store(d, argv, name, r, label):
    """Fills the table of the store run `argv` before it: STORE_FILL distinct messages of
    another topic on the same nsqd, drained by the same build with the same flags (namespace,
    buckets and --ours-args included) and --sink null, a write each."""
    topic = f"fill{r}"
    d.fill(topic, "c", f"{topic}p{os.getpid()}", STORE_FILL)
    argv = list(argv)
    argv[argv.index("--topic") + 1] = topic
    argv[argv.index("--sink") + 1] = "null"
    log = os.path.join(WORK, f"{name}-{r}-{label}.fill.log")
    p = spawn(argv, log)
    try:
        t0 = time.monotonic()
        while not d.drained(topic, "c", STORE_FILL)[1]:
            if p.poll() is not None:
                raise SystemExit(f"the fill of run {r} exited with {p.returncode}:\n  {shlex.join(argv)}\n{tail(log)}")
            if time.monotonic() - t0 > 60 + STORE_FILL / 500:
                raise SystemExit(f"the fill of run {r} did not drain {STORE_FILL} messages in time:\n{tail(log)}")
            time.sleep(0.05)
    finally:
        stop(p)


# Scenarios whose consumer is a chain ending in nsq_tail, whose output lines are counted.
CHAINS = ("serve", "serve-relay")


# Each scenario: (title, baseline name, candidate name, command(side, nsqd, run) -> argv,
# output check). `side` is "base" or "ours". A scenario of CHAINS returns a list of argvs
# instead: processes started in this order, the last one nsq_tail.
def scenario(name, memcached_addr, redis_addr=None):
    if name == "null":
        return ("ours --sink null (in-process table) against nsq_tail > /dev/null", "nsq_tail", "ours",
                lambda side, d, r: go_cmd("nsq_tail", d, []) if side == "base"
                else ours_cmd(d, ["--sink", "null"] + OURS_ARGS), False)
    if name == "stdout":
        return ("ours --sink stdout > /dev/null against nsq_tail > /dev/null", "nsq_tail", "ours",
                lambda side, d, r: go_cmd("nsq_tail", d, []) if side == "base"
                else ours_cmd(d, ["--sink", "stdout"] + OURS_ARGS), False)
    if name == "nsq":
        def cmd(side, d, r):
            dest = [f"--destination-nsqd-tcp-address=127.0.0.1:{d.tcp}", f"--destination-topic={d.topic}.out"]
            if side == "base":
                return go_cmd("nsq_to_nsq", d, dest)
            return ours_cmd(d, ["--sink", "nsq"] + [a for x in dest for a in x.split("=", 1)] + OURS_ARGS)
        return ("ours --sink nsq against nsq_to_nsq, both to a second topic on the same nsqd",
                "nsq_to_nsq", "ours", cmd, True)
    if name in ("http", "https"):
        def cmd(side, d, r):
            plain = f"http://127.0.0.1:{d.http_port}/pub?topic={d.topic}.out"
            if side == "base":
                return go_cmd("nsq_to_http", d, [f"--post={plain}", "--n=100"])
            if name == "http":
                url = f"http://127.0.0.1:{d.http_port}{POST_PATH}?topic={d.topic}.out"
                return ours_cmd(d, ["--sink", "http", "--post", url] + OURS_ARGS)
            url = f"https://127.0.0.1:{d.https_port}{POST_PATH}?topic={d.topic}.out"
            return ours_cmd(d, ["--sink", "http", "--post", url,
                                "--http-client-tls-root-ca-file", make_certs()["ca"]] + OURS_ARGS)
        title = ("ours --sink http against nsq_to_http --n=100, both POSTing to nsqd's HTTP /pub"
                 if name == "http" else
                 "ours --sink http to nsqd's HTTPS /pub against nsq_to_http --n=100 to its plain HTTP /pub")
        return (title, "nsq_to_http", "ours", cmd, True)
    if name == "memcached":
        return (f"ours --store memcached (server {memcached_addr}) --sink {STORE_SINK}, {store_table_text()} against ours --store none --sink {STORE_SINK}",
                "no-store", "memcached",
                lambda side, d, r: ours_cmd(d, ["--sink", STORE_SINK, "--store", "none"] + BASE_ARGS) if side == "base"
                else ours_cmd(d, ["--sink", STORE_SINK, "--store", "memcached", "--memcached-address",
                                  memcached_addr] + store_table(r) + OURS_ARGS), False)
    if name == "redis":
        return (f"ours --store redis (server {redis_addr}) --sink {STORE_SINK}, {store_table_text()} against ours --store none --sink {STORE_SINK}",
                "no-store", "redis",
                lambda side, d, r: ours_cmd(d, ["--sink", STORE_SINK, "--store", "none"] + BASE_ARGS) if side == "base"
                else ours_cmd(d, ["--sink", STORE_SINK, "--store", "redis", "--redis-url",
                                  f"redis://{redis_addr}"] + store_table(r) + OURS_ARGS), False)
    if name == "table":
        return ("ours --store memory (the in-process table) against ours --store none, both --sink null",
                "no-store", "table",
                lambda side, d, r: ours_cmd(d, ["--sink", "null", "--store", "none"] + BASE_ARGS) if side == "base"
                else ours_cmd(d, ["--sink", "null", "--store", "memory"] + OURS_ARGS), False)
    if name == "table-file":
        return ("ours --sink null --table-file FILE (a new file per run) against ours --sink null",
                "no-file", "table-file",
                lambda side, d, r: ours_cmd(d, ["--sink", "null"] + BASE_ARGS) if side == "base"
                else ours_cmd(d, ["--sink", "null", "--table-file", os.path.join(WORK, f"table-{r}.bin")]
                              + OURS_ARGS), False)
    if name in CHAINS:
        def cmd(side, d, r):
            if side == "ours":
                tcp, web = free_port(), free_port()
                return [ours_cmd(d, ["--sink", "serve", "--serve-tcp-address", f"127.0.0.1:{tcp}",
                                     "--serve-http-address", f"127.0.0.1:{web}"] + OURS_ARGS),
                        tail_cmd(tcp, d.topic)]
            if name == "serve":
                return [go_cmd("nsq_tail", d, [])]
            return [ours_cmd(d, ["--sink", "nsq", "--destination-nsqd-tcp-address", f"127.0.0.1:{d.tcp}",
                                 "--destination-topic", f"{d.topic}.out"] + BASE_ARGS),
                    tail_cmd(d.tcp, f"{d.topic}.out")]
        if name == "serve":
            return ("ours --sink serve with nsq_tail on its port against nsq_tail on nsqd",
                    "nsq_tail", "serve", cmd, False)
        return ("ours --sink serve with nsq_tail on its port against the relay: ours --sink nsq "
                "to a second topic on the same nsqd, nsq_tail on that topic", "relay", "serve", cmd, False)
    raise SystemExit(f"unknown scenario {name}")


def wait_served(argv, p, log):
    """Returns once the sidecar started with `argv` answers /ping on its --serve-http-address
    (its TCP port is bound by then): nsq_tail gives up on a port that refuses it."""
    if "--serve-http-address" not in argv:
        return
    host, port = argv[argv.index("--serve-http-address") + 1].rsplit(":", 1)
    deadline = time.monotonic() + 30
    while True:
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=1)
            c.request("GET", "/ping")
            if c.getresponse().status == 200:
                c.close()
                return
        except OSError:
            pass
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the sidecar did not serve /ping on {host}:{port}:\n"
                             f"  {shlex.join(argv)}\n{tail(log)}")
        time.sleep(0.01)


class Lines:
    """Counts the lines written so far to a file, reading only what was added."""

    def __init__(self, path):
        self.f = open(path, "rb")
        self.n = 0

    def count(self):
        while chunk := self.f.read(1 << 20):
            self.n += chunk.count(b"\n")
        return self.n


def distinct_bodies(path, tag):
    """How many different bodies of this run's publication the file holds, one a line."""
    head = f'{{"id":"{tag}-'.encode()
    with open(path, "rb") as f:
        return len({line for line in f if line.startswith(head)})


def one_run(name, r, side, label, cmd, check_out, memcached, store_addr=None):
    tls = make_certs() if name == "https" else None
    stored = name in ("memcached", "redis") and (side == "ours" or BASE_BIN)
    d = Nsqd(f"{name}-{r}-{label}", tls, STORE_FILL if stored else 0)
    d.topic = f"bench{r}"
    chained = name in CHAINS
    procs = []
    try:
        if check_out:
            d.request("POST", f"/topic/create?topic={d.topic}.out")
        tag = f"{name}{r}p{os.getpid()}"
        d.fill(d.topic, "c", tag, N)
        argvs = cmd(side, d, r) if chained else [cmd(side, d, r)]
        if stored:
            empty_store(*store_addr)
            if STORE_FILL:
                fill_store(d, argvs[0], name, r, label)
        # The relay's second topic: its channel exists before the first message reaches it.
        relayed = chained and any("--destination-topic" in a for a in argvs)
        if relayed:
            d.request("POST", f"/topic/create?topic={d.topic}.out")
            d.request("POST", f"/channel/create?topic={d.topic}.out&channel=c")
        logs = [os.path.join(WORK, f"{name}-{r}-{label}{'' if i == 0 else '.' + str(i)}.log")
                for i in range(len(argvs))]
        output = os.path.join(WORK, f"{name}-{r}-{label}.out") if chained else None
        mc0 = cpu_seconds(memcached.pid) if memcached else 0.0
        n0 = cpu_seconds(d.proc.pid)
        t0 = time.monotonic()
        lines = None
        for i, argv in enumerate(argvs):
            if output and i == len(argvs) - 1:
                with open(output, "wb") as out_file:
                    procs.append(spawn(argv, logs[i], out_file))
                lines = Lines(output)
            else:
                procs.append(spawn(argv, logs[i]))
                wait_served(argv, procs[-1], logs[i])
        status = "ok"
        c = None
        while True:
            # A chain is done once nsq_tail wrote N lines and every channel on the way is
            # drained; the lines are counted first, as they cost nsqd nothing.
            if lines is None or lines.count() >= N:
                c, done = d.drained(d.topic, "c", N)
                if done and relayed:
                    o = d.channel(f"{d.topic}.out", "c")
                    done = o["depth"] + o["in_flight_count"] + o["deferred_count"] == 0 and o["message_count"] >= N
                if done:
                    break
            for p, argv, log in zip(procs, argvs, logs):
                if p.poll() is not None:
                    raise SystemExit(f"{os.path.basename(argv[0])} ({label}) exited with {p.returncode} "
                                     f"before draining:\n  {shlex.join(argv)}\n{tail(log)}")
            if time.monotonic() - t0 > (TIMEOUT_GIVEN or 30 + N / 500):
                c = c or d.channel(d.topic, "c")
                status = f"TIMEOUT ({c['depth']} left" + (f", {lines.n} lines)" if lines else ")")
                break
            time.sleep(0.01)
        t1 = time.monotonic()
        cpus = [cpu_seconds(p.pid) for p in procs]
        rss = peak_rss_mib(procs[0].pid)
        nsqd_cpu = cpu_seconds(d.proc.pid) - n0
        mc_cpu = cpu_seconds(memcached.pid) - mc0 if memcached else None
        conns = None
        if name in ("http", "https"):
            port = d.https_port if (name == "https" and side == "ours") else d.http_port
            conns = nb.connections(port, [d.own_port()])
        exit_cpu = 0.0
        # The consumer at the end of a chain first, so that its source stops last.
        for p in reversed(procs):
            code, ru = stop(p)
            exit_cpu += ru.ru_utime + ru.ru_stime if ru else float("nan")
            if code not in (0, -signal.SIGTERM, 143) and status == "ok":
                status = f"exit {code}"
        procs = []
        out = d.topic_count(f"{d.topic}.out") if check_out else None
        if out is not None and out < N:
            status = f"LOST {N - out}"
        copies = out - N if out is not None else 0
        if lines is not None:
            got = distinct_bodies(output, tag)
            if got < N:
                status = f"LOST {N - got}"
            copies = max(copies, lines.count() - got)
        # Not failures of the run, but worth seeing: retries, and copies they made downstream.
        notes = []
        if c["requeue_count"] or c["timeout_count"]:
            notes.append(f"requeued {c['requeue_count']}, timed out {c['timeout_count']}")
        if copies > 0:
            notes.append(f"{copies} {'copy' if copies == 1 else 'copies'} downstream")
        return dict(side=side, label=label, wall=t1 - t0, cpu=sum(cpus), exit_cpu=exit_cpu, rss=rss,
                    nsqd=nsqd_cpu, tail=cpus[-1] if chained else None, total=sum(cpus) + nsqd_cpu,
                    sidecar=sum(cpus[:-1]) if chained and len(cpus) > 1 else None,
                    mc=mc_cpu, conns=conns, out=out, status=status, argvs=argvs, notes=notes)
    finally:
        for p in reversed(procs):
            stop(p)
        stop(d.proc)


def fmt_int(x):
    return f"{x:,.0f}"


def main():
    names = sys.argv[1:]
    memcached = None
    memcached_addr = None
    if "memcached" in names:
        port = free_port()
        memcached_addr = f"127.0.0.1:{port}"
        argv = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "1024", "-t", "2"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root without it
        memcached = spawn(argv, os.path.join(WORK, "memcached.log"))
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if memcached.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"memcached did not start:\n{tail(os.path.join(WORK, 'memcached.log'))}")
                time.sleep(0.05)
    redis = None
    redis_addr = None
    if "redis" in names:
        port = free_port()
        redis_addr = f"127.0.0.1:{port}"
        redis = spawn([os.environ.get("REDIS_SERVER_BIN", "redis-server"), "--bind", "127.0.0.1",
                       "--port", str(port), "--save", "",
                       "--appendonly", "no", "--daemonize", "no"], os.path.join(WORK, "redis.log"))
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if redis.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start:\n{tail(os.path.join(WORK, 'redis.log'))}")
                time.sleep(0.05)
    print(f"ours: {OURS}\nnsq:  {NSQ}/nsqd ({subprocess.run([NSQ + '/nsqd', '--version'], capture_output=True, text=True).stdout.strip()})")
    print(f"messages of {BODY} bytes, --max-in-flight {MIF}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    failed = False
    run_no = 0
    global N
    for name in names:
        N = N_GIVEN or (50000 if name in ("http", "https") else 300000)
        title, base_label, ours_label, cmd, check_out = scenario(name, memcached_addr, redis_addr)
        chained = name in CHAINS
        if BASE_BIN:
            # Both sides run ours' command line; the baseline with the other build.
            title = f"{title.split(' against ')[0]}: this build against {BASE_BIN}"
            base_label, ours_label = "base-build", "this-build"
            other = lambda argv: [BASE_BIN] + argv[1:] if argv[0] == OURS else argv
            cmd = (lambda inner: lambda side, d, r: (
                inner("ours", d, r) if side == "ours"
                else [other(a) for a in inner("ours", d, r)] if chained
                else other(inner("ours", d, r))))(cmd)
        print(f"\n== {name}: {title}; {N:,} messages per run")
        head = f"{'run':>3}  {'consumer':<11} {'wall s':>7} {'msg/s':>9} {'µs CPU/msg':>10} {'(exit)':>7} {'peak MiB':>8} {'nsqd µs/msg':>11}"
        if name in ("memcached", "redis"):
            head += f" {name + ' µs/msg':>16}"
        if check_out:
            head += f" {'out':>8}"
        if name in ("http", "https"):
            head += f" {'conns':>6}"
        if chained:
            head += f" {'sidecar µs/msg':>14} {'tail µs/msg':>11} {'total µs/msg':>12}"
        print(head + "  status", flush=True)
        results = []
        for _ in range(PAIRS):
            for side in ("base", "ours", "ours", "base"):
                run_no += 1
                label = base_label if side == "base" else ours_label
                x = one_run(name, run_no, side, label, cmd, check_out,
                            memcached if name == "memcached" else redis if name == "redis" else None,
                            (memcached_addr, b"flush_all\r\n", b"OK\r\n") if name == "memcached"
                            else (redis_addr, b"FLUSHALL\r\n", b"+OK\r\n") if name == "redis" else None)
                results.append(x)
                line = (f"{run_no:>3}  {label:<11} {x['wall']:>7.2f} {fmt_int(N / x['wall']):>9} "
                        f"{x['cpu'] / N * 1e6:>10.2f} {x['exit_cpu'] / N * 1e6:>7.2f} {x['rss']:>8.1f} "
                        f"{x['nsqd'] / N * 1e6:>11.2f}")
                if name in ("memcached", "redis"):
                    line += f" {x['mc'] / N * 1e6:>16.2f}"
                if check_out:
                    line += f" {fmt_int(x['out']):>8}"
                if name in ("http", "https"):
                    line += f" {x['conns']:>6}"
                if chained:
                    sidecar = "-" if x["sidecar"] is None else f"{x['sidecar'] / N * 1e6:.2f}"
                    line += f" {sidecar:>14} {x['tail'] / N * 1e6:>11.2f} {x['total'] / N * 1e6:>12.2f}"
                print(line + "  " + "; ".join([x["status"]] + x["notes"]), flush=True)
                if x["status"] != "ok":
                    failed = True
        good = [x for x in results if x["status"] == "ok"]
        base = [x for x in good if x["side"] == "base"]
        ours = [x for x in good if x["side"] == "ours"]
        if not base or not ours:
            print(f"RESULT scenario={name} n={N} incomplete")
            continue
        b_speed, o_speed = max(N / x["wall"] for x in base), max(N / x["wall"] for x in ours)
        b_cpu, o_cpu = min(x["cpu"] for x in base) / N * 1e6, min(x["cpu"] for x in ours) / N * 1e6
        speed, cpu = o_speed / b_speed, b_cpu / o_cpu
        totals = ""
        if chained:
            # What the chain costs the machine: nsqd, the sidecar and nsq_tail together.
            b_total, o_total = (min(x["total"] for x in xs) / N * 1e6 for xs in (base, ours))
            cpu = b_total / o_total
            totals = f" base_total_us={b_total:.2f} ours_total_us={o_total:.2f}"
            print(f"{ours_label} against {base_label}, best of each: speed {speed:.2f}x "
                  f"({fmt_int(o_speed)} vs {fmt_int(b_speed)} msg/s); total CPU per message "
                  f"(nsqd + sidecar + nsq_tail) {cpu:.2f}x ({b_total:.2f} µs / {o_total:.2f} µs; "
                  f"above 1, {ours_label} uses less)")
            # The sidecar's own CPU, where the chain has one (not nsq_tail on nsqd alone).
            for side, xs in (("base", base), ("ours", ours)):
                if all(x["sidecar"] is not None for x in xs):
                    totals += f" {side}_sidecar_us={min(x['sidecar'] for x in xs) / N * 1e6:.2f}"
        else:
            print(f"{ours_label} against {base_label}, best of each: speed {speed:.2f}x "
                  f"({fmt_int(o_speed)} vs {fmt_int(b_speed)} msg/s); CPU per message {cpu:.2f}x "
                  f"({b_cpu:.2f} µs / {o_cpu:.2f} µs; above 1, {ours_label} uses less)")
        print(f"RESULT scenario={name} n={N} base={base_label} base_msgs={b_speed:.0f} ours_msgs={o_speed:.0f} "
              f"base_cpu_us={b_cpu:.2f} ours_cpu_us={o_cpu:.2f}{totals} speed={speed:.2f} cpu={cpu:.2f}",
              flush=True)
    if memcached:
        stop(memcached)
    if redis:
        stop(redis)
    return failed


nb.run(main, WORK, os.environ["BENCH_KEEP"] == "1")
PY
