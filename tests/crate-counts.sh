#!/usr/bin/env bash
# Checks the README's table of crates each feature builds against `cargo tree`, so the figures
# a reader chooses a layer by stay true when a dependency changes. Prints every row that
# differs, with the count to write, and exits 1 if any does.
set -euo pipefail
cd "$(dirname "$0")/.."

# The crates `--no-default-features --features $1` builds, this crate left out.
count() {
  cargo tree --quiet --locked -e normal,build --prefix none --no-default-features --features "$1" \
    | sed 's/ (\*)$//' | sort -u | grep -cv '^nsq-dedupe v'
}

rows=0
wrong=0
# Rows of the table: | none | ... | 40 |, | `memcached` | ... | 47 |, | `cli` (default) | ... |.
while IFS='|' read -r _ feature _ crates _; do
  feature=$(echo "$feature" | sed 's/(default)//; s/`//g; s/ //g')
  crates=$(echo "$crates" | tr -d ' ')
  [ "$feature" = none ] && feature=""
  actual=$(count "$feature")
  rows=$((rows + 1))
  if [ "$actual" != "$crates" ]; then
    echo "README.md: feature '${feature:-none}' builds $actual crates, the table says $crates" >&2
    wrong=$((wrong + 1))
  fi
done < <(grep -E '^\| (none|`[a-z]+`( \(default\))?) \|.*\| [0-9]+ \|$' README.md)

if [ "$rows" -ne 6 ]; then
  echo "README.md: expected the 6 rows of the crates table (none, memcached, redis, nsq, sidecar, cli), found $rows" >&2
  exit 1
fi
[ "$wrong" -eq 0 ] || exit 1
echo "tests/crate-counts.sh: the README's crate counts match cargo tree for $rows features"
