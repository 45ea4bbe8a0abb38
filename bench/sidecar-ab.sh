#!/usr/bin/env bash
# Two builds of the sidecar, alternating on the same serve or relay run: the sidecar's own CPU
# of each run and the medians. See `bench/sidecar-ab.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF2'
Usage: bench/sidecar-ab.sh [OPTIONS] BUILD_A BUILD_B

Runs the two sidecar binaries in turn (A, B, A, B, ...), each on a fresh real nsqd holding N
messages of 100 bytes, and prints each run's CPU (user and system, from /proc) and the medians
of each side. A change of a few percent shows only over many alternating runs: single runs on
a shared machine spread by a third.

  serve   the sidecar with --sink serve, nsq_tail --max-in-flight M reading its served port
  relay   the sidecar with --sink nsq to a second topic of the same nsqd, nsq_tail reading it

Both sides get --memory 4MiB by default, so that no run pays for a table that grows (the
self-sizing table's growth lands in whichever run first meets a high enough rate).

Options:
  --sink serve|relay   which run (default serve)
  -n, --messages N     messages per run (default 200000)
  --rounds R           runs of each build (default 8)
  --max-in-flight M    the sidecar's and nsq_tail's (default 2500)
  --args "ARGS"        more arguments for both sidecars (default "--memory 4MiB")
  --keep               keep the work directory (nsqd data, logs)
  -h, --help           this text

Environment:
  NSQ_BIN_DIR      directory with NSQ v1.3.0's nsqd and nsq_tail (default /work/nsq-real/bin)

The last line is machine-readable (CPU in seconds for the whole run):
  RESULT sink=serve n=200000 rounds=8 a_median_cpu_s=0.39 b_median_cpu_s=0.37 b_over_a=0.95
EOF2
}

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/nsq_bench.sh
source "$here/bench/nsq_bench.sh"
sink=serve
messages=200000
rounds=8
mif=2500
args="--memory 4MiB"
keep=0
builds=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --sink) sink=${2:-}; shift 2 || { echo "sidecar-ab.sh: $1 needs serve or relay" >&2; exit 2; } ;;
    -n|--messages) messages=${2:-}; shift 2 || { echo "sidecar-ab.sh: $1 needs a number" >&2; exit 2; } ;;
    --rounds) rounds=${2:-}; shift 2 || { echo "sidecar-ab.sh: $1 needs a number" >&2; exit 2; } ;;
    --max-in-flight) mif=${2:-}; shift 2 || { echo "sidecar-ab.sh: $1 needs a number" >&2; exit 2; } ;;
    --args) args=${2-}; shift 2 || { echo "sidecar-ab.sh: $1 needs arguments" >&2; exit 2; } ;;
    --keep) keep=1; shift ;;
    -*) echo "sidecar-ab.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) builds+=("$1"); shift ;;
  esac
done
if [ "${#builds[@]}" -ne 2 ]; then
  echo "sidecar-ab.sh: name two sidecar binaries, BUILD_A and BUILD_B (see --help)" >&2
  exit 2
fi
for build in "${builds[@]}"; do
  [ -x "$build" ] || { echo "sidecar-ab.sh: '$build' is not an executable file" >&2; exit 2; }
done
case $sink in
  serve|relay) ;;
  *) echo "sidecar-ab.sh: --sink must be serve or relay, got '$sink'" >&2; exit 2 ;;
esac
positive_whole sidecar-ab.sh "messages:$messages" "rounds:$rounds" "max-in-flight:$mif"
nsq_bin_dir=${NSQ_BIN_DIR:-/work/nsq-real/bin}
need_tools sidecar-ab.sh "$nsq_bin_dir" nsqd nsq_tail
work=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-ab.XXXXXX")
[ "$keep" = 1 ] && echo "work directory (kept): $work" >&2

export BENCH_SINK=$sink BENCH_N=$messages BENCH_ROUNDS=$rounds BENCH_MIF=$mif BENCH_ARGS=$args \
  BENCH_WORK=$work BENCH_KEEP=$keep BENCH_A=${builds[0]} BENCH_B=${builds[1]} BENCH_NSQ_BIN=$nsq_bin_dir
export PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}"
exec python3 - <<'PY'
import os, shlex, statistics, subprocess
import nsq_bench as nb

SINK = os.environ["BENCH_SINK"]
N = int(os.environ["BENCH_N"])
ROUNDS = int(os.environ["BENCH_ROUNDS"])
MIF = os.environ["BENCH_MIF"]
ARGS = shlex.split(os.environ["BENCH_ARGS"])
WORK = os.environ["BENCH_WORK"]
NSQ = os.environ["BENCH_NSQ_BIN"]
TOPIC, CHANNEL = "events", "c"
nb.exit_on_signals()


def one_run(build, run):
    """The sidecar's (user, system) CPU seconds over one run, or None if it lost messages."""
    d = nb.Nsqd(NSQ, WORK, f"run{run}", N + nb.CHUNK)
    d.fill(TOPIC, CHANNEL, "m", N)
    argv = [build, "run", "--nsqd-tcp-address", f"127.0.0.1:{d.tcp}", "--topic", TOPIC,
            "--channel", CHANNEL, "--max-in-flight", MIF, "--metrics-address", "off"] + ARGS
    if SINK == "serve":
        port, http = nb.free_port(), nb.free_port()
        argv += ["--sink", "serve", "--serve-tcp-address", f"127.0.0.1:{port}",
                 "--serve-http-address", f"127.0.0.1:{http}"]
        tail_port, tail_topic = port, TOPIC
    else:
        argv += ["--sink", "nsq", "--destination-nsqd-tcp-address", f"127.0.0.1:{d.tcp}",
                 "--destination-topic", TOPIC + ".out"]
        tail_port, tail_topic = d.tcp, TOPIC + ".out"
    log = os.path.join(WORK, f"sidecar{run}.log")
    sidecar = nb.spawn(argv, log)
    if SINK == "serve":
        nb.wait_served(sidecar, http, log)
    out = os.path.join(WORK, f"out{run}.txt")
    with open(out, "wb") as f:
        subprocess.run([f"{NSQ}/nsq_tail", f"--nsqd-tcp-address=127.0.0.1:{tail_port}",
                        f"--topic={tail_topic}", f"--channel={CHANNEL}",
                        f"--max-in-flight={MIF}", "-n", str(N)],
                       stdout=f, stderr=subprocess.DEVNULL, timeout=300, check=False)
    with open(f"/proc/{sidecar.pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    cpu = (int(rest[11]) / nb.TICK, int(rest[12]) / nb.TICK)
    nb.stop(sidecar)
    nb.stop(d.proc)
    with open(out, "rb") as f:
        lines = f.read().splitlines()
    if len(lines) != N or len(set(lines)) != N:
        print(f"run {run}: {len(lines)} lines, {len(set(lines))} distinct, of {N}")
        return None
    return cpu


def main():
    cpu = {"A": [], "B": []}
    failed = False
    print(f"sidecar-ab: {SINK}, {N:,} messages a run, {ROUNDS} runs a build, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print("A:", os.environ["BENCH_A"])
    print("B:", os.environ["BENCH_B"])
    print("run build  user s  sys s  cpu s")
    run = 0
    for _ in range(ROUNDS):
        for side in ("A", "B"):
            run += 1
            got = one_run(os.environ["BENCH_" + side], run)
            if got is None:
                failed = True
                continue
            user, sys_ = got
            cpu[side].append(user + sys_)
            print(f"{run:3d}   {side}    {user:6.2f} {sys_:6.2f} {user + sys_:6.2f}")
    if not cpu["A"] or not cpu["B"]:
        return True
    a, b = statistics.median(cpu["A"]), statistics.median(cpu["B"])
    print(f"medians: A {a:.2f} s, B {b:.2f} s: B/A {b / a:.2f} "
          f"(load average {os.getloadavg()[0]:.2f} at the end)")
    print(f"RESULT sink={SINK} n={N} rounds={ROUNDS} a_median_cpu_s={a:.2f} "
          f"b_median_cpu_s={b:.2f} b_over_a={b / a:.2f}")
    return failed


nb.run(main, WORK, os.environ["BENCH_KEEP"] == "1")
PY
