#!/usr/bin/env bash
# Checks the library's public API against docs/public-api.txt: every item `cargo doc` shows
# (module path and kind), one per line. An item that leaves or joins the API fails the check
# until the list is changed with it, on purpose; `--write` rewrites the list. The docs are
# built with every feature and warnings as errors, so a public item's docs never link to
# something private.
set -euo pipefail
cd "$(dirname "$0")/.."

list=docs/public-api.txt
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --locked --no-deps --lib --all-features
doc_dir=$(cargo metadata --format-version 1 --no-deps \
  | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/doc/nsq_dedupe

# all.html lists each item as <a href="module/kind.Name.html">module::Name</a>.
actual=$(grep -o '<li><a href="[^"]*">[^<]*</a></li>' "$doc_dir/all.html" \
  | sed -E 's|<li><a href="([^"]*/)?([a-z]+)\.[^"]*">([^<]*)</a></li>|\2 \3|' \
  | sort -k2)

if [ "${1:-}" = --write ]; then
  echo "$actual" > "$list"
  echo "wrote $list: $(wc -l < "$list") items"
  exit 0
fi
diff_file=$(mktemp)
trap 'rm -f "$diff_file"' EXIT
if ! diff <(echo "$actual") "$list" > "$diff_file"; then
  echo "The public API differs from $list ('<' is public now, '>' only in the list)." >&2
  echo "If the change is meant, run: bash tests/public-api.sh --write" >&2
  cat "$diff_file" >&2
  exit 1
fi
echo "public API: $(wc -l < "$list") items, as listed in $list"
