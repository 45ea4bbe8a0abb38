#!/usr/bin/env bash
# Bytes a shared store spends per remembered message, against the naive key per message.
# See `bench/store-density.sh --help`.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: bench/store-density.sh [--messages N] [--probability P] [--slots-per-item S]
                              [--redis-format F] [redis] [valkey] [memcached]

Starts its own redis-server, valkey-server and memcached on free loopback ports and prints, for each, the
bytes of the server's memory per remembered message:
  ours       a table of 8-way sets sized for N distinct messages at probability P (as
             `nsq-dedupe size --messages N --probability P` sizes it), filled with 3N distinct
             messages, each claimed and committed as the sidecar writes them for a sink that
             can fail; the memory it grew by, divided by N
  naive      N keys `nsq-dedupe:<32 hex digits>` of the value 1, written as users write them
             (Redis `SET key 1 NX EX 3600`, Memcached `ms key 1 T3600 ME`), divided by N
  ratio      ours / naive
  size est.  what `size` prints for the table, divided by N
Memory is Redis's `used_memory` (INFO memory) and Memcached's `bytes` (stats).
--slots-per-item S: the slots of a Memcached item (default 64).
--redis-format F: the key format of the Redis/Valkey table: 3, the compact layout (64 slots
a key, the default), or 2, a key per 8-way set (the earlier layout).
Defaults: N = 300,000, P = 0.99, every store.

Needs redis-server, Valkey 8.1 (as tests/run.sh fetches it) and memcached (or
$REDIS_SERVER_BIN, $VALKEY_SERVER_BIN, $MEMCACHED_BIN); builds the benchmark
with `cargo bench` (release profile).
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
exec cargo bench --quiet --bench store_density -- "$@"
