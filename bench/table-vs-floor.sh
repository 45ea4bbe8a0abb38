#!/usr/bin/env bash
# Single-call `Table::contains_and_add` against the floor under any table of its kind (hashing,
# one load and one compare-and-swap of a random word of an array of the same size), repeated,
# and prints each run's ratios and their medians.
#
# On a shared machine the memory a large table lives in is as fast as the neighbours allow,
# and that moves by 2x from one minute to the next; a ratio to a floor measured seconds apart
# moves much less. Criterion's estimates from short windows, run ROUNDS times.
#
# Usage: bench/table-vs-floor.sh [ROUNDS]     (default 5; about a minute a round)
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

# Million operations per second for every benchmark whose id matches $1, one "id rate" line
# each, from criterion's median estimate (fractional nanoseconds per operation; its bencher
# output rounds to whole nanoseconds, which at 2^20 is a step of 10% or more).
rates() {
    local ids
    ids=$(cargo bench --quiet --bench main -- "$1" --warm-up-time 1 --measurement-time 2 \
        --output-format bencher 2>/dev/null | awk '/^test / { print $2 }')
    for id in $ids; do
        # criterion's directory names: "::" becomes "__", "/" and "^" become "_".
        local dir="target/criterion/${id%%/*}"
        dir=${dir//::/__}
        local bench=${id#*/}
        bench=${bench//[\/^]/_}
        python3 -c 'import json, sys; print(sys.argv[2], 1000 / json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
            "$dir/$bench/new/estimates.json" "$id"
    done
}

cargo bench --quiet --bench main --no-run 2>/dev/null
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$rounds"); do
    for log2 in 20 26; do
        pattern="contains_and_add/(slots=2\^$log2/ways=(1|8)/threads=1\$|baseline/hash-load-cas/slots=2\^$log2\$)"
        rates "$pattern" | awk -v round="$round" -v log2="$log2" '
            /hash-load-cas/ { floor = $2; next }
            /ways=1/ { one = $2 } /ways=8/ { eight = $2 }
            END {
                if (floor == 0 || one == 0 || eight == 0) { print "missing benchmark output" > "/dev/stderr"; exit 1 }
                printf "%s %s %.1f %.1f %.1f %.2f %.2f\n", round, log2, floor, one, eight, one / floor, eight / floor
            }' >> "$results"
    done
done

printf '%-6s %-6s %8s %8s %8s %10s %10s\n' round slots floor 1-way 8-way 1-way/fl 8-way/fl
awk '{ printf "%-6s 2^%-4s %8.1f %8.1f %8.1f %10.2f %10.2f\n", $1, $2, $3, $4, $5, $6, $7 }' "$results"
for log2 in 20 26; do
    for column in 6 7; do
        median=$(awk -v log2="$log2" -v c="$column" '$2 == log2 { print $c }' "$results" |
            sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
        name=$([ "$column" = 6 ] && echo "1-way" || echo "8-way")
        echo "median $name / floor at 2^$log2: $median"
    done
done
