#!/usr/bin/env bash
# Mutation checks: each patch in this directory breaks one promise on purpose, and the test its
# `Test:` line names must fail with the patch applied. A mutant whose test still passes means
# that test cannot see the bug it is there for.
#
# Each patch is applied to a copy of the tracked files (as they are in the work tree), built
# with the same target directory (only this crate is rebuilt) and tested. Exits non-zero if a
# mutant survives or does not build.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
status=0
for patch in tests/mutants/*.patch; do
  name=$(sed -n 's/^Test: //p' "$patch")
  copy=$(mktemp -d)
  git ls-files -z | xargs -0 cp --parents -t "$copy"
  (cd "$copy" && patch -s -p1 < "$root/$patch")
  if ! (cd "$copy" && CARGO_TARGET_DIR="$root/target" cargo test -q --test integration --no-run 2>/dev/null); then
    echo "mutant $patch does not build" >&2
    status=1
  elif (cd "$copy" && CARGO_TARGET_DIR="$root/target" cargo test -q --test integration "$name" -- --exact >/dev/null 2>&1); then
    echo "mutant $patch SURVIVED: $name passed with it" >&2
    status=1
  else
    echo "mutant $patch killed by $name"
  fi
  rm -rf "$copy"
done
exit $status
