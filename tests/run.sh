#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs every test.
#
# The Memcached and Redis tests start their own `memcached` and `redis-server` (a cluster too) on
# free loopback ports, so only the binaries are needed, not running services. Extra arguments go
# to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the store tests start servers from, installed when missing.
missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tests/run.sh: installing ${missing[*]} (Debian packages) for the Memcached and Redis store tests" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo test --all-targets "$@"
cargo test --doc "$@"
# The library with no feature: the table, keys, sizing, the table file and filter_stream.
cargo test --no-default-features --lib "$@"
cargo test --no-default-features --doc "$@"
# The README's crates per feature, against cargo tree.
bash tests/crate-counts.sh
# The systemd unit, verified against the binary the tests built (the package's other parts are
# checked by the tests above; pkg/build-deb.sh checks a built package).
bash pkg/check.sh
