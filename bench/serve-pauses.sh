#!/usr/bin/env bash
# How long the stream pauses when the sidecar serves replicated input to a slow, batching
# consumer. See `bench/serve-pauses.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF2'
Usage: bench/serve-pauses.sh [OPTIONS]

Publishes N distinct messages to each of two real nsqd (every message on both, as a producer
that publishes for resilience does), runs the sidecar on both with --sink serve and
--key json:/id, and reads its served port with nsq_to_file --max-in-flight M, which writes and
FINs in batches of M (else every 30 s). Polls both nsqd's /stats every 50 ms and prints the
longest time during which no upstream message was finished (the pause), the drain time, the
sidecar's requeues of copies (in_flight_requeues_total, copies_held_total), and checks that
the output files hold every message exactly once. Everything runs on 127.0.0.1 on free ports.

Options:
  -n, --messages N     distinct messages, each published to both nsqd (default 20000)
  --max-in-flight M    nsq_to_file's --max-in-flight (default 200)
  --timeout SECS       limit for the drain (default 120)
  --keep               keep the work directory (nsqd data, logs, output)
  -h, --help           this text

Environment:
  NSQ_DEDUPE_BIN   the sidecar binary (default: `cargo build --release` of this checkout)
  NSQ_BIN_DIR      directory with NSQ v1.3.0's nsqd and nsq_to_file (default /work/nsq-real/bin)

The last line is machine-readable:
  RESULT n=20000 max_in_flight=200 longest_pause_s=0.35 drain_s=4.1 in_flight_requeues=0 copies_held=812 lines=20000 distinct=20000
EOF2
}

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/nsq_bench.sh
source "$here/bench/nsq_bench.sh"
messages=20000
mif=200
timeout=120
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -n|--messages) messages=${2:-}; shift 2 || { echo "serve-pauses.sh: $1 needs a number" >&2; exit 2; } ;;
    --max-in-flight) mif=${2:-}; shift 2 || { echo "serve-pauses.sh: $1 needs a number" >&2; exit 2; } ;;
    --timeout) timeout=${2:-}; shift 2 || { echo "serve-pauses.sh: $1 needs seconds" >&2; exit 2; } ;;
    --keep) keep=1; shift ;;
    *) echo "serve-pauses.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for pair in "messages:$messages" "max-in-flight:$mif" "timeout:$timeout"; do
  if ! [[ ${pair#*:} =~ ^[1-9][0-9]*$ ]]; then
    echo "serve-pauses.sh: --${pair%%:*} must be a positive whole number, got '${pair#*:}'" >&2
    exit 2
  fi
done
nsq_bin_dir=${NSQ_BIN_DIR:-/work/nsq-real/bin}
need_tools serve-pauses.sh "$nsq_bin_dir" nsqd nsq_to_file
ours=$(sidecar_binary serve-pauses.sh "$here")
work=$(mktemp -d "${TMPDIR:-/tmp}/serve-pauses.XXXXXX")
[ "$keep" = 1 ] && echo "work directory (kept): $work" >&2

export BENCH_N=$messages BENCH_MIF=$mif BENCH_TIMEOUT=$timeout BENCH_WORK=$work BENCH_KEEP=$keep \
  BENCH_OURS=$ours BENCH_NSQ_BIN=$nsq_bin_dir
export PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}"
exec python3 - <<'PY'
import glob, gzip, os, time, urllib.request
import nsq_bench as nb

N = int(os.environ["BENCH_N"])
MIF = os.environ["BENCH_MIF"]
TIMEOUT = float(os.environ["BENCH_TIMEOUT"])
WORK = os.environ["BENCH_WORK"]
OURS = os.environ["BENCH_OURS"]
NSQ = os.environ["BENCH_NSQ_BIN"]
TOPIC, CHANNEL = "events", "c"
nb.exit_on_signals()


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return None


def remaining(nsqds):
    total = 0
    for d in nsqds:
        c = d.channel(TOPIC, CHANNEL)
        total += c["depth"] + c["in_flight_count"] + c["deferred_count"]
    return total


def main():
    nsqds = [nb.Nsqd(NSQ, WORK, name, N + nb.CHUNK) for name in ("a", "b")]
    for d in nsqds:
        d.fill(TOPIC, CHANNEL, "m", N)
    serve_tcp, serve_http, metrics = nb.free_port(), nb.free_port(), nb.free_port()
    argv = [OURS, "run", "--topic", TOPIC, "--channel", CHANNEL, "--key", "json:/id",
            "--sink", "serve", "--serve-tcp-address", f"127.0.0.1:{serve_tcp}",
            "--serve-http-address", f"127.0.0.1:{serve_http}",
            "--metrics-address", f"127.0.0.1:{metrics}"]
    for d in nsqds:
        argv += ["--nsqd-tcp-address", f"127.0.0.1:{d.tcp}"]
    sidecar = nb.spawn(argv, os.path.join(WORK, "sidecar.log"))
    out = os.path.join(WORK, "out")
    os.makedirs(out)
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{serve_http}/ping", timeout=1).read()
            break
        except OSError:
            if sidecar.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sidecar did not serve:\n{nb.tail(os.path.join(WORK, 'sidecar.log'))}")
            time.sleep(0.05)
    to_file = nb.spawn([f"{NSQ}/nsq_to_file", f"--nsqd-tcp-address=127.0.0.1:{serve_tcp}",
                        f"--topic={TOPIC}", f"--channel={CHANNEL}", f"--max-in-flight={MIF}",
                        f"--output-dir={out}"], os.path.join(WORK, "nsq_to_file.log"))
    start = time.monotonic()
    left, last_progress, longest = 2 * N, start, 0.0
    while left > 0:
        now = time.monotonic()
        if now - start > TIMEOUT:
            print(f"TIMEOUT after {TIMEOUT:.0f} s with {left} upstream messages left")
            return True
        time.sleep(0.05)
        now_left = remaining(nsqds)
        now = time.monotonic()
        if now_left < left:
            longest = max(longest, now - last_progress)
            last_progress, left = now, now_left
        else:
            longest = max(longest, now - last_progress)
    drain = time.monotonic() - start
    requeues = metric(metrics, "nsq_dedupe_in_flight_requeues_total")
    held = metric(metrics, "nsq_dedupe_copies_held_total")
    nb.stop(to_file)
    nb.stop(sidecar)
    lines = []
    for path in glob.glob(os.path.join(out, "*")):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            lines += f.read().splitlines()
    distinct = len(set(lines))
    print(f"{N} messages on each of 2 nsqd, nsq_to_file --max-in-flight={MIF}: drained in "
          f"{drain:.1f} s, longest pause {longest:.2f} s, in_flight_requeues {requeues}, "
          f"copies_held {held}, {len(lines)} lines, {distinct} distinct")
    print(f"RESULT n={N} max_in_flight={MIF} longest_pause_s={longest:.2f} drain_s={drain:.1f} "
          f"in_flight_requeues={requeues} copies_held={held} lines={len(lines)} distinct={distinct}")
    if distinct != N or len(lines) != N:
        print(f"LOST or COPIES: expected {N} distinct lines, each once")
        return True
    return False


nb.run(main, WORK, os.environ["BENCH_KEEP"] == "1")
PY
