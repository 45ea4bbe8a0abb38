#!/usr/bin/env bash
# How long the stream pauses when the sidecar serves replicated input to a slow, batching
# consumer. See `bench/serve-pauses.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF2'
Usage: bench/serve-pauses.sh [OPTIONS]

Publishes N distinct messages to each of two real nsqd (every message on both, as a producer
that publishes for resilience does), runs the sidecar on both with --sink serve and
--key json:/id, and reads its served port with nsq_to_file --max-in-flight M. Then, as the
baseline in the same run, nsq_to_file --max-in-flight M reads the same N messages from one
nsqd directly. nsq_to_file writes and FINs a batch once it holds 85% of its RDY (go-nsq's
"starved"), else on its 30 s sync timer: the last batch, smaller, waits for that timer
whoever serves it. For each, polls the nsqd's /stats every 50 ms and prints the longest time
during which no upstream message was finished (the pause), the longest such time before
the last batch (what the server can change), the drain time and when all but the last batch
were finished, and for the sidecar its requeues of copies (in_flight_requeues_total,
copies_held_total); checks that the output files hold every message exactly once. Everything runs on 127.0.0.1 on free ports.

Options:
  -n, --messages N     distinct messages, each published to both nsqd (default 20000)
  --max-in-flight M    nsq_to_file's --max-in-flight (default 200)
  --timeout SECS       limit for the drain (default 120)
  --keep               keep the work directory (nsqd data, logs, output)
  -h, --help           this text

Environment:
  NSQ_DEDUPE_BIN   the sidecar binary (default: `cargo build --release` of this checkout)
  NSQ_BIN_DIR      directory with NSQ v1.3.0's nsqd and nsq_to_file (default /work/nsq-real/bin)

The last line is machine-readable (base_: nsq_to_file on one nsqd directly):
  RESULT n=20000 max_in_flight=200 longest_pause_s=28.80 before_last_s=0.02 drain_s=30.0 all_but_last_s=1.2 base_longest_pause_s=29.10 base_before_last_s=0.05 base_drain_s=30.1 base_all_but_last_s=0.9 in_flight_requeues=0 copies_held=13164 lines=20000 distinct=20000
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
positive_whole serve-pauses.sh "messages:$messages" "max-in-flight:$mif" "timeout:$timeout"
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


def watch(nsqds, total):
    """Polls until `nsqds` hold nothing of the `total` messages; returns (drain s, longest
    pause s, longest pause before the last batch s, s until all but the last batch were
    finished), or None at the timeout. The last batch is what was finished within a second of
    the end (its originals and their copies may take two polls)."""
    start = time.monotonic()
    left, progress = total, [start]
    while left > 0:
        if time.monotonic() - start > TIMEOUT:
            print(f"TIMEOUT after {TIMEOUT:.0f} s with {left} upstream messages left")
            return None
        time.sleep(0.05)
        now_left = remaining(nsqds)
        if now_left < left:
            progress.append(time.monotonic())
            left = now_left
    pauses = [b - a for a, b in zip(progress, progress[1:])]
    last_batch = next(i for i, t in enumerate(progress) if t >= progress[-1] - 1.0)
    before = max(pauses[:max(last_batch - 1, 0)], default=0.0)
    return progress[-1] - start, max(pauses), before, progress[max(last_batch - 1, 0)] - start


def output_lines(out):
    lines = []
    for path in glob.glob(os.path.join(out, "*")):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            lines += f.read().splitlines()
    return lines


def to_file(tcp, out, log):
    os.makedirs(out)
    return nb.spawn([f"{NSQ}/nsq_to_file", f"--nsqd-tcp-address=127.0.0.1:{tcp}",
                     f"--topic={TOPIC}", f"--channel={CHANNEL}", f"--max-in-flight={MIF}",
                     f"--output-dir={out}"], log)


def served():
    """The sidecar on two replicated nsqd, nsq_to_file on its served port."""
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
    nb.wait_served(sidecar, serve_http, os.path.join(WORK, "sidecar.log"))
    out = os.path.join(WORK, "out")
    consumer = to_file(serve_tcp, out, os.path.join(WORK, "nsq_to_file.log"))
    watched = watch(nsqds, 2 * N)
    requeues = metric(metrics, "nsq_dedupe_in_flight_requeues_total")
    held = metric(metrics, "nsq_dedupe_copies_held_total")
    nb.stop(consumer)
    nb.stop(sidecar)
    for d in nsqds:
        nb.stop(d.proc)
    return watched, requeues, held, output_lines(out)


def direct():
    """The baseline: nsq_to_file on one nsqd holding the N messages."""
    d = nb.Nsqd(NSQ, WORK, "direct", N + nb.CHUNK)
    d.fill(TOPIC, CHANNEL, "m", N)
    out = os.path.join(WORK, "out-direct")
    consumer = to_file(d.tcp, out, os.path.join(WORK, "nsq_to_file-direct.log"))
    watched = watch([d], N)
    nb.stop(consumer)
    nb.stop(d.proc)
    return watched, output_lines(out)


def main():
    watched, requeues, held, lines = served()
    base, base_lines = direct()
    if watched is None or base is None:
        return True
    (drain, longest, before, rest), (bdrain, blongest, bbefore, brest) = watched, base
    distinct = len(set(lines))
    print(f"{N} messages on each of 2 nsqd, nsq_to_file --max-in-flight={MIF} on the sidecar: "
          f"drained in {drain:.1f} s (all but the last batch in {rest:.1f} s), longest pause "
          f"{longest:.2f} s ({before:.2f} s before the last batch), in_flight_requeues {requeues}, copies_held {held}, {len(lines)} lines, "
          f"{distinct} distinct")
    print(f"{N} messages on 1 nsqd, nsq_to_file --max-in-flight={MIF} on nsqd directly: "
          f"drained in {bdrain:.1f} s (all but the last batch in {brest:.1f} s), longest pause "
          f"{blongest:.2f} s ({bbefore:.2f} s before the last batch), {len(base_lines)} lines")
    print(f"RESULT n={N} max_in_flight={MIF} longest_pause_s={longest:.2f} before_last_s={before:.2f} "
          f"drain_s={drain:.1f} all_but_last_s={rest:.1f} base_longest_pause_s={blongest:.2f} base_before_last_s={bbefore:.2f} "
          f"base_drain_s={bdrain:.1f} base_all_but_last_s={brest:.1f} in_flight_requeues={requeues} copies_held={held} "
          f"lines={len(lines)} distinct={distinct}")
    if distinct != N or len(lines) != N:
        print(f"LOST or COPIES: expected {N} distinct lines, each once")
        return True
    if len(set(base_lines)) != N or len(base_lines) != N:
        print(f"the baseline wrote {len(base_lines)} lines, {len(set(base_lines))} distinct, not {N}")
        return True
    return False


nb.run(main, WORK, os.environ["BENCH_KEEP"] == "1")
PY
