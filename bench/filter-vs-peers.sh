#!/usr/bin/env bash
# Compares `nsq-dedupe filter` (its default 64 MiB table) with huniq and runiq (de-duplicators
# on crates.io, installed into target/peers when missing) and `awk '!seen[$0]++'`, in one run,
# on generated inputs: short lines (~40 B) with 50% copies, JSON lines with 50% copies keyed by
# `--key json:/id` (huniq, runiq and awk key the whole line: there every line's id is unique to
# its content, so whole-line and id keys give the same answer), and short lines with 20%
# copies. For each: best wall time and peak memory (/usr/bin/time -f %M) of RUNS runs, and the
# ratios of the peers' times to filter's.
#
# Usage: bench/filter-vs-peers.sh [LINES] [RUNS]     (defaults: 5000000 lines, 3 runs each)
set -euo pipefail
lines=${1:-5000000}
runs=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/nsq-dedupe"
peers="$here/target/peers/bin"
if [ ! -x "$peers/huniq" ] || [ ! -x "$peers/runiq" ]; then
  echo "installing huniq and runiq into target/peers" >&2
  cargo install --quiet --root "$here/target/peers" huniq runiq
fi
if [ ! -x /usr/bin/time ]; then
  echo "/usr/bin/time is missing (Debian package: time)" >&2
  exit 1
fi

python3 - "$lines" "$work" <<'PY'
import random, sys
n, work = int(sys.argv[1]), sys.argv[2]
def write(name, copies, line):
    rng = random.Random(42)
    distinct = int(n * (1 - copies))
    with open(f"{work}/{name}", "w") as out:
        for k in range(n):
            # The first `distinct` lines are new; the rest repeat earlier ones at random.
            i = k if k < distinct else rng.randrange(distinct)
            out.write(line(i))
write("short-50.txt", 0.5, lambda i: f"2026-11-23T04:00:00Z host-{i % 97} ev {i:012d}\n")
write("json-50.txt", 0.5, lambda i: f'{{"id":"{i:012d}","event":"order.created","amount":{i % 10007}}}\n')
write("short-20.txt", 0.2, lambda i: f"2026-11-23T04:00:00Z host-{i % 97} ev {i:012d}\n")
PY

# best_of NAME INPUT COMMAND...: prints "seconds peak_kib" of the fastest run; keeps its output.
best_of() {
  local name=$1 input=$2; shift 2
  local best="" best_mem=""
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%e %M" -o "$work/time" "$@" < "$input" > "$work/$name.out"
    read -r secs mem < "$work/time"
    if [ -z "$best" ] || awk -v a="$secs" -v b="$best" 'BEGIN{exit !(a<b)}'; then
      best=$secs; best_mem=$mem
    fi
  done
  echo "$best $best_mem"
}

for case in short-50 json-50 short-20; do
  input="$work/$case.txt"
  key=(--key body)
  [ "$case" = json-50 ] && key=(--key json:/id)
  read -r f_s f_m < <(best_of filter "$input" "$bin" filter "${key[@]}")
  read -r h_s h_m < <(best_of huniq "$input" "$peers/huniq")
  read -r r_s r_m < <(best_of runiq "$input" "$peers/runiq")
  read -r a_s a_m < <(best_of awk "$input" awk '!seen[$0]++')
  # The peers are exact; filter's fixed table may let a few late copies through (more lines),
  # but must never drop a record (fewer lines would be a bug).
  exact=$(wc -l < "$work/awk.out")
  for peer in huniq runiq; do
    cmp -s "$work/$peer.out" "$work/awk.out" || echo "  note: $peer and awk disagree on $case" >&2
  done
  got=$(wc -l < "$work/filter.out")
  if [ "$got" -lt "$exact" ]; then
    echo "  BUG: filter wrote $got records, fewer than the $exact distinct ones" >&2
  elif [ "$got" -gt "$exact" ]; then
    echo "  $case: $((got - exact)) of $exact distinct records' copies slipped through filter's default table" >&2
  fi
  echo "$case ($lines lines): time s / peak MiB"
  printf '  filter %6.2f s %6d MiB\n' "$f_s" $((f_m / 1024))
  printf '  huniq  %6.2f s %6d MiB   huniq/filter %.2fx\n' "$h_s" $((h_m / 1024)) "$(awk -v a="$h_s" -v b="$f_s" 'BEGIN{print a/b}')"
  printf '  runiq  %6.2f s %6d MiB   runiq/filter %.2fx\n' "$r_s" $((r_m / 1024)) "$(awk -v a="$r_s" -v b="$f_s" 'BEGIN{print a/b}')"
  printf '  awk    %6.2f s %6d MiB   awk/filter   %.2fx\n' "$a_s" $((a_m / 1024)) "$(awk -v a="$a_s" -v b="$f_s" 'BEGIN{print a/b}')"
done
