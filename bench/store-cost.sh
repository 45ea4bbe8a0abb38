#!/usr/bin/env bash
# What the shared table costs its store server per distinct message, against the pipelined
# naive write. See `bench/store-cost.sh --help`.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: bench/store-cost.sh [--messages N] [--burst B] [--tasks T] [--full-slots S]
                           [--consumers C] [--slots-per-item S] [--redis-format F]
                           [--instructions]
                           [redis] [redis-cluster] [valkey] [memcached]

Starts its own redis-server, Redis Cluster (three masters, no replicas), valkey-server and
memcached on free loopback ports and prints, for each server (each master of the cluster), its
CPU per distinct message of the whole stream (user + system from /proc/PID/stat, before and
after each case) for:
  naive        the write users send instead, pipelined a burst at a time: Redis
               `SET key 1 NX EX 3600`, Memcached `ms key 1 T3600 ME` (add)
  ours empty   a claim and a commit of each message, bursts as the sidecar sends them
               (claim_many, then commit_many), on a table the messages do not fill
  ours full    the same on a table of S slots (default 65,536) filled first
  one-shot empty, one-shot full
               the same two tables, each burst claimed done at once (claim_done_many, no
               commit), as the sidecar writes for a sink that cannot fail (--sink null)
  naive again  the naive write once more; the ratios are to the mean of both naive runs
with the ratio ours/naive and the messages per second one server core would serve.
valkey runs these cases twice on one Valkey 8.1 server: as the store runs there (claims and
commits decided in the client and written with SET … IFEQ), then with the store forced
through its script (valkey-script), as on Redis 7.0 and Valkey 8.0: in the compact layout the
compare-and-set script, in a key per set (--redis-format 2) the set script.
--slots-per-item S: the slots of a Memcached item (default 64; 8 is an item per 8-way set).
--redis-format F: the key format of the Redis and Valkey tables (standalone): 3, the compact
layout (the default), or 2, a key per 8-way set (the earlier layout).
--consumers C: C stores of each table (C owners, a fleet's consumers) take the bursts in
turn, so that a set is often written last by another store than the one that meets it (the
stores keep the sets they wrote last, and such a kept value is then out of date).
--instructions: the Redis and Valkey servers run under valgrind's callgrind, and the cost
is their instructions per message (read with callgrind_control -d around each case), which
the machine's other load does not move; give fewer --messages and --full-slots, it is slow.
Redis (each master of the cluster) is emptied (FLUSHALL) before each case, the full tables
before they are filled, so that no case meets the keys an earlier one left. Memcached cannot
be emptied that way (its hash table keeps its size), so it starts with a hash table big enough
for every case's items (-o hashpower): no case pays for growing it.
The cluster's naive write sends each burst as one pipeline per master, routed by key slot, as
a cluster client does.
Defaults: 300,000 messages per case, bursts of 128, 4 bursts at once, redis and memcached
(redis-cluster when named).
Every answer is checked (a fresh digest claimed new, its commit held, each naive write stored).
A commit may answer false only for an entry that 8 newer claims of its set may have pushed out
between its claim and its commit (a burst that waited while the others went on): those are
counted and printed above the case, any other commit answering false fails the run.

Needs redis-server and memcached (or $REDIS_SERVER_BIN, $MEMCACHED_BIN), for valkey the
Valkey 8.1.8 that `bash tests/run.sh` fetches into target/valkey-8.1.8 (or
$VALKEY_SERVER_BIN), for --instructions valgrind; builds the benchmark with `cargo bench`
(release profile). The machine's other load shows in the figures: run it more than once.
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
exec cargo bench --quiet --bench store_cost -- "$@"
