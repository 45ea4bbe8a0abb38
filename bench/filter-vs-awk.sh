#!/usr/bin/env bash
# Compares `nsq-dedupe filter` with `awk '!seen[$0]++'` on the same file, in one run, and prints
# the ratio. The table (2^26 slots in 8-way sets, 512 MiB) is large enough that no set overflows
# for a few million distinct records, so both outputs must be identical; if they are not, the
# script says whether records were lost (a bug) or copies slipped through (a table too small).
#
# Usage: bench/filter-vs-awk.sh [LINES] [RUNS]     (defaults: 5000000 lines, 3 runs each)
set -euo pipefail
lines=${1:-5000000}
runs=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/nsq-dedupe"

# Log-like records with about 40% repeats: event ids drawn from a range smaller than the count.
python3 - "$lines" > "$work/input.txt" <<'PY'
import random, sys
n = int(sys.argv[1])
rng = random.Random(42)
ids = int(n * 0.6)
out = sys.stdout
for _ in range(n):
    i = rng.randrange(ids)
    out.write(f'{{"event":"order.created","id":{i},"shop":"s{i % 997}","amount":{i % 10007}}}\n')
PY

# Best wall time of RUNS runs of each command, reading the same file; outputs compared.
python3 - "$work" "$runs" "$bin" <<'PY'
import filecmp, os, subprocess, sys, time
work, runs, binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def best(name, cmd):
    times = []
    for _ in range(runs):
        with open(f"{work}/input.txt", "rb") as src, open(f"{work}/{name}.txt", "wb") as dst:
            start = time.perf_counter()
            subprocess.run(cmd, stdin=src, stdout=dst, check=True)
            times.append(time.perf_counter() - start)
    return min(times)
awk = os.path.basename(os.path.realpath(subprocess.run(
    ["sh", "-c", "command -v awk"], capture_output=True, text=True).stdout.strip()))
awk_time = best("awk", ["awk", "!seen[$0]++"])
ours_time = best("ours", [binary, "filter", "--buckets", "67108864"])
if not filecmp.cmp(f"{work}/awk.txt", f"{work}/ours.txt", shallow=False):
    exact = open(f"{work}/awk.txt", "rb").read().splitlines()
    ours = open(f"{work}/ours.txt", "rb").read().splitlines()
    missing = len(set(exact) - set(ours))
    sys.exit(f"outputs differ: {missing} distinct records missing (must be 0), "
             f"{len(ours) - len(exact)} extra copies let through")
lines = sum(1 for _ in open(f"{work}/input.txt", "rb"))
distinct = sum(1 for _ in open(f"{work}/ours.txt", "rb"))
print(f"lines: {lines}, distinct: {distinct}, {awk}: {awk_time:.3f}s, "
      f"nsq-dedupe filter: {ours_time:.3f}s, speed-up: {awk_time / ours_time:.2f}x")
PY
