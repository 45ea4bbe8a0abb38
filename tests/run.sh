#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs every test.
#
# The Memcached tests start their own `memcached` on free loopback ports, so only the binary is
# needed, not a running service. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v memcached >/dev/null 2>&1; then
  echo "tests/run.sh: installing memcached (Debian package) for the Memcached store tests" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq memcached >/dev/null
fi

cargo test --all-targets "$@"
cargo test --doc "$@"
# The systemd unit, verified against the binary the tests built (the package's other parts are
# checked by the tests above; pkg/build-deb.sh checks a built package).
bash pkg/check.sh
