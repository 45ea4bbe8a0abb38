#!/usr/bin/env bash
# What the Redis store's script costs the server per message, on full sets (or empty ones), as
# the sidecar calls it. See `bench/redis-script.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/redis-script.sh [--empty] [--instructions [--plain]] [SCRIPT.lua...]
       bench/redis-script.sh --floor [SCRIPT.lua]

Starts a redis-server (no persistence) on a free loopback port, fills 4,096 sets of 8 ways
(with --empty: fills nothing, and the digests fall in 4,194,304 sets, so that a claim's set
almost always holds nothing, as on a table that starts empty), then runs 400 bursts of 256
fresh digests through each script as the Redis store does: one EVALSHA claiming the burst,
one committing it through the slots the claims answered; last it claims again the digests of
the last 10 bursts, which no later claim pushed out (duplicates). With --instructions the
server runs under valgrind's callgrind and the figures are its instructions per message (all
the claims, then all the commits, of 16 bursts; read with callgrind_control -d around each
phase), which the machine's load does not move, next to the naive write's (`SET key 1 NX EX
3600`, pipelined a burst at a time, measured first on the same server). Prints the server's own time per
message from INFO commandstats (usec of EVALSHA) for the claims, the commits and the
duplicate claims, and the server's CPU per message from /proc. Each script is measured
twice, in the order given and then reversed, so that a script measured early does not look
faster. With --plain (and --instructions) the claims and commits go as the store sends them:
a claim first as a plain `SET key <its set> NX GET` while the table fills (--empty; the claims
that find a set then go to the script), a commit as a `GETRANGE` of its entry and a `SETRANGE`
of the whole entry (src/dedup/redis/create.rs, commit.rs), each step one pipeline a burst. Default: src/dedup/redis/set.lua; name a second file (an edited copy) to compare the
two in one run. Every answer is checked: a fresh digest must be claimed new, a claimed one
committed, a committed one found a duplicate.

With --floor (instructions, full sets only): what a claim of a full set cannot go below on
this server. Each of 16 bursts of 256 fresh digests, one set each, is sent through: the naive
write; the store's claim (SCRIPT.lua) and commit (GETRANGE, SETRANGE); that commit's SETRANGE
alone; a plain GET of each set; and cut-down claims, each the least its layout allows: a
script that only calls SETRANGE (its arguments made by the client), scripts that read the
burst with one MGET and write the header through the new entry, or the new entry alone (a
layout whose cursor needs no write); and, without a script, 4,096 hashes of 8 fields (HSETNX
and HGET, evicting nothing; commit HSET) and sorted sets of 8 members (ZADD NX, ZSCORE,
ZREMRANGEBYRANK; commit ZADD XX). Prints instructions per digest and the ratio to the naive
write.

Needs redis-server (Debian's redis-server package) and python3; with --instructions or
--floor, valgrind too (Debian's valgrind package).
EOF
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
empty=0 instructions=0 plain=0 floor=0
while [ $# -gt 0 ]; do
  case "$1" in
    --floor) floor=1; instructions=1; shift ;;
    --empty) empty=1; shift ;;
    --instructions) instructions=1; shift ;;
    --plain) plain=1; shift ;;
    *) break ;;
  esac
done
cd "$(dirname "$0")/.."
scripts=("$@")
[ "${#scripts[@]}" -gt 0 ] || scripts=(src/dedup/redis/set.lua)
command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)" >&2; exit 1; }

if [ "$floor" = 1 ] && { [ "$empty" = 1 ] || [ "$plain" = 1 ] || [ "${#scripts[@]}" -gt 1 ]; }; then
  echo "--floor goes alone (full sets; at most one SCRIPT.lua)" >&2; exit 2
fi
if [ "$plain" = 1 ] && [ "$instructions" = 0 ]; then
  echo "--plain goes with --instructions" >&2; exit 2
fi
if [ "$instructions" = 1 ]; then
  command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
fi

exec python3 - "$empty" "$instructions" "$plain" "$floor" "${scripts[@]}" <<'PY'
import os, random, socket, struct, subprocess, sys, tempfile, time

EMPTY, INSTRUCTIONS, PLAIN, FLOOR = (a == "1" for a in sys.argv[1:5])
SETS, WAYS, RUN, BURSTS, DUP_BURSTS = (1 << 22 if EMPTY else 4096), 8, 256, 400, 10
if INSTRUCTIONS:
    # Few enough that no claim pushes out another of the run on a full table: the claims all
    # go before the commits.
    BURSTS = 16

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

class Redis:
    """Just enough RESP for EVALSHA, SCRIPT LOAD, INFO and CONFIG."""
    def __init__(self, port):
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.buf = b""

    @staticmethod
    def command(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def call(self, *args):
        self.sock.sendall(self.command(*args))
        return self.reply()

    def pipeline(self, commands):
        """Sends every command (a tuple of arguments) in one write; their replies."""
        self.sock.sendall(b"".join(self.command(*c) for c in commands))
        return [self.reply() for _ in commands]

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise SystemExit("redis-server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(1 << 16)
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise SystemExit(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise SystemExit(f"unexpected reply {line!r}")

def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

# The owner id every claim of these benchmarks is made by (8 bytes, as the store's).
OWNER = struct.pack(">Q", 0x6e73712d64656475)

def entry(slot, digest, state, time=0):
    """An entry of the store's layout (set.lua): slot, digest, state, time, owner."""
    return bytes([slot]) + digest + struct.pack(">BQ", state, time) + OWNER

def start():
    """A redis-server on a free port (under callgrind with --instructions), its working
    folder, and a client of it."""
    port = free_port()
    work = tempfile.mkdtemp()
    valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no",
                f"--callgrind-out-file={work}/callgrind.out"] if INSTRUCTIONS else []
    server = subprocess.Popen(valgrind + ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", work],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return server, work, Redis(port)

class Instructions:
    """The server's instructions between two calls (callgrind zeroes them at each dump)."""
    def __init__(self, server, work):
        self.server, self.work, self.dumps = server, work, 0

    def __call__(self):
        subprocess.run(["callgrind_control", "-d", str(self.server.pid)], check=True,
                       stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.dumps += 1
        for line in open(f"{self.work}/callgrind.out.{self.dumps}"):
            if line.startswith("summary:"):
                return int(line.split()[1])
        raise SystemExit(f"no summary in callgrind dump {self.dumps}")

def measure(path):
    server, work, r = start()
    try:
        sha = r.call("SCRIPT", "LOAD", open(path, "rb").read())
        rng = random.Random(7)

        # The slot each digest was claimed in, sent with its commit as the store does.
        slots = {}

        def run(op, digests, now=1_000_000):
            keys = [b"bench:%d" % (int.from_bytes(d[:8], "big") % SETS) for d in digests]
            args = [bytes([slots.pop(d)]) + d if op == "m" and d in slots else d
                    for d in digests]
            answers = r.call("EVALSHA", sha, 1, keys[0], op, OWNER, now, now + 65_000, "",
                             WAYS, 1, *args, *keys)
            # One per digest, then the counts the script adds (one or two, by its version).
            if len(answers) - len(digests) not in (1, 2):
                raise SystemExit(f"{path}: {len(answers)} answers to {len(digests)} digests")
            answers = answers[:len(digests)]
            if op == "c":
                # A claim's answer is its code plus 4 times the entry's slot.
                for d, a in zip(digests, answers):
                    if a & 3 == 0:
                        slots[d] = a >> 2
                answers = [a & 3 for a in answers]
            return answers

        def key_of(d):
            return b"bench:%d" % (int.from_bytes(d[:8], "big") % SETS)

        def claim(burst):
            """A burst's claims: as the store sends them with --plain, else one script run."""
            if not (PLAIN and EMPTY):
                return run("c", burst)
            sets = [bytes([1, 0, WAYS]) + entry(0, d, 1, 1_065_000) for d in burst]
            created = r.pipeline([("SET", key_of(d), s, "NX", "GET") for d, s in zip(burst, sets)])
            found = [d for d, c in zip(burst, created) if c is not None]
            decided = dict(zip(found, run("c", found))) if found else {}
            for d, c in zip(burst, created):
                if c is None:
                    slots[d] = 0
            return [0 if c is None else decided[d] for d, c in zip(burst, created)]

        def commit(burst):
            """A burst's commits: as the store sends them with --plain, else one script run."""
            if not PLAIN:
                return run("m", burst)
            hinted = [(d, slots.pop(d)) for d in burst]
            entries = r.pipeline([("GETRANGE", key_of(d), 3 + 34 * s, 3 + 34 * s + 33)
                                  for d, s in hinted])
            mine = [(d, s) for (d, s), e in zip(hinted, entries)
                    if e == entry(s, d, 1, 1_065_000)]
            if len(mine) != len(burst):
                raise SystemExit("a claimed entry was not found as its claim left it")
            r.pipeline([("SETRANGE", key_of(d), 3 + 34 * s, entry(s, d, 2)) for d, s in mine])
            return [1] * len(burst)

        def fresh():
            return [rng.randbytes(16) for _ in range(RUN)]

        def usec():
            stats = r.call("INFO", "commandstats").decode()
            for line in stats.splitlines():
                if line.startswith("cmdstat_evalsha:"):
                    return int(line.split("usec=")[1].split(",")[0])
            return 0

        instructions = Instructions(server, work)

        for _ in range(0 if EMPTY else SETS * WAYS * 2 // RUN):
            burst = fresh()
            run("c", burst)
            run("m", burst)
        bursts = [fresh() for _ in range(BURSTS)]
        if INSTRUCTIONS:
            n = BURSTS * RUN
            instructions()
            # The naive write a hand-written consumer sends, pipelined a burst at a time.
            for burst in [fresh() for _ in range(BURSTS)]:
                answers = r.pipeline([("SET", b"naive:" + d.hex().encode(), 1, "NX", "EX", 3600)
                                      for d in burst])
                if any(a != b"OK" for a in answers):
                    raise SystemExit("a naive write was not stored")
            naive = instructions()
            for burst in bursts:
                if any(a != 0 for a in claim(burst)):
                    raise SystemExit(f"{path}: a fresh digest was not claimed new")
            claimed = instructions()
            for burst in bursts:
                if any(a != 1 for a in commit(burst)):
                    raise SystemExit(f"{path}: a claimed digest was not committed")
            committed = instructions()
            for burst in bursts[-DUP_BURSTS:]:
                if any(a != 2 for a in run("c", burst)):
                    raise SystemExit(f"{path}: a committed digest was not a duplicate")
            duplicate = instructions()
            return claimed / n, committed / n, duplicate / (DUP_BURSTS * RUN), naive / n
        claim = commit = 0
        cpu0 = cpu_seconds(server.pid)
        for burst in bursts:
            r.call("CONFIG", "RESETSTAT")
            if any(a != 0 for a in run("c", burst)):
                raise SystemExit(f"{path}: a fresh digest was not claimed new")
            claim += usec()
            r.call("CONFIG", "RESETSTAT")
            if any(a != 1 for a in run("m", burst)):
                raise SystemExit(f"{path}: a claimed digest was not committed")
            commit += usec()
        cpu = cpu_seconds(server.pid) - cpu0
        r.call("CONFIG", "RESETSTAT")
        for burst in bursts[-DUP_BURSTS:]:
            if any(a != 2 for a in run("c", burst)):
                raise SystemExit(f"{path}: a committed digest was not a duplicate")
        duplicate = usec()
        n = BURSTS * RUN
        return claim / n, commit / n, duplicate / (DUP_BURSTS * RUN), cpu * 1e6 / n
    finally:
        server.terminate()
        server.wait()

# Cut-down scripts for --floor: the fewest calls a claim of a full set can make in a script.
# ARGV: the burst's digests; KEYS: their sets (each a full set of the store's layout).
FLOOR_COMMON = r"""
local n = #ARGV
local call, byte, sub, char, find = redis.call, string.byte, string.sub, string.char, string.find
local CLAIMED = struct.pack('>BI8', 1, 1065000) .. 'nsq-dedu'
local decimal = {}
for slot = 0, 7 do decimal[slot] = tostring(3 + 34 * slot) end
local function absent(value, digest)
  local from = 5
  while true do
    local at = find(value, digest, from, true)
    if not at then return true end
    if (at - 5) % 34 == 0 then return false end
    from = at + 1
  end
end
local sets = call('MGET', unpack(KEYS))
local out = {}
"""
FLOOR_HEADER_THROUGH_ENTRY = FLOOR_COMMON + r"""
for i = 1, n do
  local set, digest = sets[i], ARGV[i]
  if absent(set, digest) then
    local c = byte(set, 2)
    call('SETRANGE', KEYS[i], '0', char(byte(set, 1), (c + 1) % 8, 8) .. sub(set, 4, 3 + 34 * c)
      .. char(c) .. digest .. CLAIMED)
    out[i] = 0
  else out[i] = 2 end
end
return out
"""
FLOOR_ENTRY_ONLY = FLOOR_COMMON + r"""
for i = 1, n do
  local set, digest = sets[i], ARGV[i]
  if absent(set, digest) then
    local c = byte(set, 2)
    call('SETRANGE', KEYS[i], decimal[c], char(c) .. digest .. CLAIMED)
    out[i] = 0
  else out[i] = 2 end
end
return out
"""
FLOOR_ONE_CALL = r"""
for i = 1, #KEYS do redis.call('SETRANGE', KEYS[i], ARGV[i], ARGV[#KEYS + i]) end
return #KEYS
"""

def floor(path):
    """Instructions per digest of the store's claim and commit on full sets, of the naive
    write, and of the cheapest claims other layouts allow (see --help)."""
    server, work, r = start()
    try:
        instructions = Instructions(server, work)
        rng = random.Random(7)
        string_key = lambda s: b"bench:%d" % s
        hash_key = lambda s: b"hash:%d" % s
        zset_key = lambda s: b"zset:%d" % s
        score = iter(range(2_000_001, 1 << 40, 2))
        for base in range(0, SETS, 256):
            commands = []
            for s in range(base, base + 256):
                commands.append(("SET", string_key(s), bytes([1, rng.randrange(WAYS), WAYS])
                                 + b"".join(entry(i, rng.randbytes(16), 2) for i in range(WAYS))))
                commands.append(("HSET", hash_key(s), *[x for _ in range(WAYS)
                                 for x in (rng.randbytes(16), rng.randbytes(17))]))
                commands.append(("ZADD", zset_key(s), *[x for _ in range(WAYS)
                                 for x in (next(score), rng.randbytes(16))]))
            r.pipeline(commands)
        sha = {name: r.call("SCRIPT", "LOAD", text) for name, text in
               [("store", open(path, "rb").read()), ("through", FLOOR_HEADER_THROUGH_ENTRY),
                ("entry", FLOOR_ENTRY_ONLY), ("one", FLOOR_ONE_CALL)]}

        def bursts():
            return [[(rng.randbytes(16), s) for s in rng.sample(range(SETS), RUN)]
                    for _ in range(BURSTS)]

        def expect(answers, value, what):
            if any(a != value for a in answers):
                raise SystemExit(f"--floor: {what}: {answers[:4]}...")

        rows = []
        instructions()

        def row(name):
            rows.append((name, instructions() / (BURSTS * RUN)))

        for burst in bursts():
            expect(r.pipeline([("SET", b"naive:" + d.hex().encode(), 1, "NX", "EX", 3600)
                               for d, _ in burst]), b"OK", "a naive write was not stored")
        row("naive: SET key 1 NX EX 3600")
        claimed = []
        for burst in bursts():
            answers = r.call("EVALSHA", sha["store"], 1, string_key(burst[0][1]), "c", OWNER,
                             1_000_000, 1_065_000, "", WAYS, 1, *[d for d, _ in burst],
                             *[string_key(s) for _, s in burst])[:RUN]
            expect([a & 3 for a in answers], 0, "the store's claim of a fresh digest")
            claimed.append([(d, s, a >> 2) for (d, s), a in zip(burst, answers)])
        row(f"store: claim ({path})")
        for burst in claimed:
            entries = r.pipeline([("GETRANGE", string_key(s), 3 + 34 * c, 3 + 34 * c + 33)
                                  for _, s, c in burst])
            expect([e == entry(c, d, 1, 1_065_000) for (d, _, c), e in zip(burst, entries)],
                   True, "a claim's entry")
            r.pipeline([("SETRANGE", string_key(s), 3 + 34 * c, entry(c, d, 2))
                        for d, s, c in burst])
        row("store: commit (GETRANGE, SETRANGE)")
        for burst in claimed:
            r.pipeline([("SETRANGE", string_key(s), 3 + 34 * c, entry(c, d, 2))
                        for d, s, c in burst])
        row("commit without its read (SETRANGE)")
        for burst in bursts():
            r.pipeline([("GET", string_key(s)) for _, s in burst])
        row("read of a full set (GET)")
        for burst in bursts():
            r.call("EVALSHA", sha["one"], RUN, *[string_key(s) for _, s in burst],
                   *[3 + 34 * (i % WAYS) for i in range(RUN)],
                   *[entry(i % WAYS, d, 1) for i, (d, _) in enumerate(burst)])
        row("script: one SETRANGE, nothing read")
        for name, what in [("through", "script: MGET, SETRANGE header..entry"),
                           ("entry", "script: MGET, SETRANGE entry only")]:
            for burst in bursts():
                expect(r.call("EVALSHA", sha[name], RUN, *[string_key(s) for _, s in burst],
                              *[d for d, _ in burst]), 0, f"{what}: a fresh digest")
            row(what)
        hashed = bursts()
        for burst in hashed:
            answers = r.pipeline([c for d, s in burst for c in
                                  (("HSETNX", hash_key(s), d, b"L" * 17), ("HGET", hash_key(s), d))])
            expect(answers[0::2], 1, "HSETNX of a fresh digest")
        row("hash: HSETNX, HGET (no eviction)")
        for burst in hashed:
            r.pipeline([("HSET", hash_key(s), d, b"D" * 17) for d, s in burst])
        row("hash: commit (HSET)")
        sorted_ = bursts()
        for burst in sorted_:
            answers = r.pipeline([c for d, s in burst for c in
                                  (("ZADD", zset_key(s), "NX", next(score), d),
                                   ("ZSCORE", zset_key(s), d),
                                   ("ZREMRANGEBYRANK", zset_key(s), 0, -(WAYS + 1)))])
            expect(answers[0::3], 1, "ZADD NX of a fresh digest")
        row("sorted set: ZADD NX, ZSCORE, ZREMRANGEBYRANK")
        for burst in sorted_:
            r.pipeline([("ZADD", zset_key(s), "XX", next(score) - 1, d) for d, s in burst])
        row("sorted set: commit (ZADD XX)")
        naive = rows[0][1]
        print(f"{'instructions per digest, full sets':<52} {'':>8} {'/naive':>7}")
        for name, value in rows:
            print(f"{name:<52} {value:>8.0f} {value / naive:>6.2f}x")
    finally:
        server.terminate()
        server.wait()

scripts = sys.argv[5:]
if FLOOR:
    print(f"{SETS} full sets of {WAYS} ways, {BURSTS} bursts of {RUN} fresh digests, each on its own set")
    floor(scripts[0])
    sys.exit()
print(f"{SETS} {'empty' if EMPTY else 'full'} sets of {WAYS} ways, {BURSTS} bursts of {RUN} fresh digests, "
      f"load average {os.getloadavg()[0]:.2f}")
if INSTRUCTIONS:
    print(f"{'instructions per message':<40} {'claim':>9} {'commit':>10} {'sum':>6} {'dup claim':>10}"
          f" {'naive':>6} {'sum/naive':>9}")
    for path in scripts + scripts[::-1]:
        claim, commit, duplicate, naive = measure(path)
        print(f"{path:<40} {claim:>9.0f} {commit:>10.0f} {claim + commit:>6.0f} {duplicate:>10.0f}"
              f" {naive:>6.0f} {(claim + commit) / naive:>8.2f}x")
    sys.exit()
print(f"{'script':<40} {'claim µs':>9} {'commit µs':>10} {'sum':>6} {'dup claim':>10} {'CPU µs/msg':>11}")
for path in scripts + scripts[::-1]:
    claim, commit, duplicate, cpu = measure(path)
    print(f"{path:<40} {claim:>9.2f} {commit:>10.2f} {claim + commit:>6.2f} {duplicate:>10.2f} {cpu:>11.2f}")
PY
