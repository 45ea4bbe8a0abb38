-- One operation on many digests of the shared de-duplication table, atomically (Redis runs a
-- script to its end before any other command). The set of a digest is the string at its key,
-- every entry at a fixed offset, so that a claim or a commit writes only its own entry:
--   u8 version (1, or 2 with commit times) | u8 cursor | u8 ways |
--   k x (u8 slot | 16 B digest | u8 state 0=empty 1=in flight 2=done | u64 time ms |
--        u64 owner), the entry of slot i at byte 3 + 34 i; an empty slot is all zeros, and
--        one an erase emptied keeps its slot byte, then 16 bytes 0xFF (a digest no message
--        has, which a search finds at once where zeros are many) and 17 zeros.
-- Slots fill in order, so a set holds its first k slots (k <= ways): it grows by one entry
-- until it is full, then keeps its length.
-- ARGV: op (c = claim, d = claim done, m = commit, e = erase, r = renew), owner (8 bytes),
-- now ms, lease end ms, max age ms ("" for none), ways, version to write, then n digests, then
-- the n keys of their sets (the i-th digest's set is the i-th key); digests of one set repeat
-- its key, and are decided in order (a digest given twice is claimed new once, then found in
-- flight).
-- A digest is 16 bytes, or for a commit, an erase or a renew 17: the slot its claim answered,
-- then the 16 bytes, which is how its entry starts (a hint). Such an operation reads only that
-- entry (GETRANGE) and, when the entry is still this digest's, decides on it; else (the entry
-- was pushed out, erased, or the set rewritten) it reads the whole set, as without a hint.
-- (Most commits do not come here: the store reads and writes their entries with plain
-- commands, see commit.rs; one of them may leave a set whose header is zeros, see `readable`.)
-- Op d is a claim whose new entry is written done (a digest given twice is then a duplicate).
-- KEYS holds the first of those keys only: it routes the run to its node. In a cluster the
-- other keys may be of other slots of the same node (a script without flags may reach any key
-- its node serves); one its node does not serve fails the run when it is read.
-- Every key is read before any is written, but for the write a read makes itself: a claim
-- (c or d) reads its set with `SET key <the set of that one new entry> NX GET`, which writes
-- only when the key holds nothing, and then answers nil: the claim is decided (new, in slot
-- 0), in one call instead of a GET and a SET. Else it wrote nothing and answers what the key
-- holds, decided on as a GET's answer. Once such reads of a run find more sets than they
-- create by more than two (see `lead`), its claims read with GET; the other operations
-- always do (or with GETRANGE, below). A key that cannot be read (not a string, or in a
-- cluster not its node's) fails the whole call, with nothing written: the keys this run
-- created are deleted first (they held nothing). A server that refuses NX with GET (before
-- Redis 7.0) is read with GET for the rest of the run.
-- Returns one answer per digest, then how many stored values were not sets of this shape (each
-- was read as an empty set), then how many of its claims found their key holding no set
-- (which tells the store whether the table is still filling, see create.rs). A claim answers 0 = new, 1 = in flight, 2 = duplicate, plus 4
-- times the slot of the digest's entry (the one it wrote, or found); the others 1 = held,
-- 0 = not.
--
-- A stored set is checked by its length and its header only: every offset the script reads
-- is then inside it, whatever the entries hold. A change inside a set is a SETRANGE of the
-- bytes it changes (building a new value in Lua costs more than the decision), or, when a
-- full set replaces its cursor's entry, of the header through that entry; a set that grows is
-- written whole, so that Redis allocates it no more than its length. A write through a hint
-- leaves the header's version as the claim wrote it.
-- ARGV in a local: the script reads it about four times a digest, and a global costs a lookup.
local ARGV = ARGV
local op, owner = ARGV[1], ARGV[2]
local now, lease_until = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_age = tonumber(ARGV[5])
local ways, version = tonumber(ARGV[6]), tonumber(ARGV[7])
if op ~= 'c' and op ~= 'd' and op ~= 'm' and op ~= 'e' and op ~= 'r' then
  return redis.error_reply('unknown operation ' .. tostring(op))
end
local n = (#ARGV - 7) / 2
local ENTRY = 34
local SIZE = 3 + ways * ENTRY
local byte, sub, char, find, rep = string.byte, string.sub, string.char, string.find, string.rep
-- A set with no entry, for a key that holds none.
local EMPTY = char(version, 0, ways)
-- An erased entry after its slot byte, and the digest field that marks it (see the top).
local FREE = rep('\255', 16)
local ERASED = FREE .. rep('\0', ENTRY - 17)
local pack, unpack = struct.pack, struct.unpack
local call = redis.call

-- The decimal string of a byte offset, made once per run: a number given to redis.call is
-- formatted anew at every call, which costs about as much as a short command.
local decimal = {}
local function at_offset(offset)
  local text = decimal[offset]
  if not text then
    text = tostring(offset)
    decimal[offset] = text
  end
  return text
end

-- Whether value is a set of `ways` ways in a known format: true, or 0 for a set whose header
-- is zeros, which a commit wrote (a `SETRANGE` of its entry, see commit.rs) into a key that
-- held nothing; false if not a set.
local function readable(value)
  local n = #value
  if n < 3 or n > SIZE or (n - 3) % ENTRY ~= 0 then return false end
  local v, cursor, w = byte(value, 1, 3)
  if v == 0 and cursor == 0 and w == 0 then return 0 end
  return (v == 1 or v == 2) and cursor < ways and w == ways
end

-- Where the entry of digest starts (1-based), or nil. A plain search, kept only where it
-- lines up with an occupied entry's digest field.
local function locate(value, digest)
  local from = 5
  while true do
    local at = find(value, digest, from, true)
    if not at then return nil end
    if (at - 5) % ENTRY == 0 and byte(value, at + 16) ~= 0 then return at - 1 end
    from = at + 1
  end
end

-- The fields of an entry of this owner after its slot index and digest: the same for every
-- digest of one run, so made once.
local CLAIMED = pack('>BI8', 1, lease_until) .. owner
local DONE = pack('>BI8', 2, max_age and now or 0)
-- Op d (for a handler whose accepted message is final) is a claim whose entry is written done.
local claiming = op == 'c' or op == 'd'
if op == 'd' then CLAIMED = DONE .. owner end

-- Writes `bytes` at 0-based `offset` of the set at key, and the header's version if
-- `stored` (the stored one; nil when not read) differs: the whole header if it was zeros.
local function write(key, stored, offset, bytes)
  call('SETRANGE', key, at_offset(offset), bytes)
  if stored == 0 then
    call('SETRANGE', key, '0', char(version, 0, ways))
  elseif stored and stored ~= version then
    call('SETRANGE', key, '0', char(version))
  end
end

-- Claims digest in a set where it is absent: the first empty slot, else the cursor's (which
-- moves on). `value` is what the key holds, or an empty set's header if nothing readable.
-- Returns the slot.
local function insert(key, value, digest)
  local n = #value
  local from = 4
  while true do
    -- A slot that an erase emptied, found by one search for its mark (a call per slot costs
    -- more). Slots of zeros (emptied by an earlier version, or before a commit's write in a
    -- key that held nothing) are taken in turn by the cursor.
    local at = find(value, FREE, from, true)
    if not at then break end
    if (at - 5) % ENTRY == 0 and byte(value, at + 16) == 0 then
      local slot = (at - 5) / ENTRY
      write(key, byte(value, 1), 3 + slot * ENTRY, char(slot) .. digest .. CLAIMED)
      return slot
    end
    from = at + 1
  end
  if n < SIZE then
    local slot = (n - 3) / ENTRY
    -- KEEPTTL: an expiry an operator gave the key outlives the append, as a SETRANGE's.
    call('SET', key, char(version) .. sub(value, 2, n) .. char(slot) .. digest .. CLAIMED,
      'KEEPTTL')
    return slot
  end
  -- Full: the cursor's slot, written with the header that moves the cursor on in one
  -- SETRANGE (a second call costs more than copying the entries between them).
  local cursor = byte(value, 2)
  call('SETRANGE', key, '0', char(version, (cursor + 1) % ways, ways)
    .. sub(value, 4, 3 + cursor * ENTRY) .. char(cursor) .. digest .. CLAIMED)
  return cursor
end

-- A claim of digest in the set `value` at key: its answer, and whether the set changed.
local function claim(key, value, digest)
  local at = locate(value, digest)
  if not at then return 4 * insert(key, value, digest), true end
  local slot = 4 * (at - 4) / ENTRY
  local time = unpack('>I8', value, at + 18)
  if byte(value, at + 17) == 2 then
    if time ~= 0 and max_age and now - time > max_age then
      -- Committed longer ago than max_age: a body sent again on purpose.
      write(key, byte(value, 1), at + 16, CLAIMED)
      return slot, true
    end
    return slot + 2, false
  end
  if time > now then return slot + 1, false end
  -- The owner let the lease lapse: take the entry over, in its slot.
  write(key, byte(value, 1), at + 16, CLAIMED)
  return slot, true
end

-- A commit, an erase or a renew of the entry that starts at `at` (1-based) of `value`, which
-- holds the set at key from its 0-based byte `base` on (0 for the whole set; the entry's
-- offset for a hint): its answer, and whether the set changed. `stored` is the set's version
-- (nil when not read).
local function update(key, value, at, base, stored)
  local state = byte(value, at + 17)
  if op == 'm' and state == 2 then return 1, false end
  -- The owner's id is the entry's last 8 bytes.
  if find(value, owner, at + 26, true) ~= at + 26 then return 0, false end
  local offset = base + at - 1
  if op == 'm' then
    write(key, stored, offset + 17, DONE)
  elseif op == 'e' then
    call('SETRANGE', key, at_offset(offset + 1), ERASED)
  else
    if state ~= 1 then return 0, false end
    write(key, stored, offset + 17, CLAIMED)
  end
  return 1, true
end

-- The set at key as it is stored (`value`, when given, is what a read of it answered), or an
-- empty set when it holds none or one of another shape (counted in `unreadable` when
-- `count`); an error reply if it cannot be read.
local unreadable = 0
local function read(key, count, value)
  if value == nil then value = redis.pcall('GET', key) end
  if type(value) == 'table' then return nil, value end
  local shape = value and readable(value)
  -- A header of zeros is read as cursor 0 of `ways` ways, version 0 (see `write`).
  if shape == 0 then return char(0, 0, ways) .. sub(value, 4) end
  if shape then return value end
  if value and count then unreadable = unreadable + 1 end
  return EMPTY
end

-- The keys this run created with SET NX GET (they held nothing before), and undoing them: a
-- run that fails leaves nothing written.
local created = {}
local function fail(error)
  for k = 1, #created do call('DEL', created[k]) end
  return error
end

-- Every key read first (a claim's read may create its set, see the header). `entries[i]` is
-- the entry a hint points at while it is still the digest's; `decided[i]` the answer of a
-- claim that created its set; every other digest is decided on its whole set, `sets[key]`
-- (false once the run changed it: read again when another digest needs it).
local entries, sets, hinted, decided = {}, {}, {}, {}
-- A set whose first slot holds a new entry: its header and that slot's index.
local FIRST = char(version, 0, ways, 0)
-- Claims read with SET NX GET while it mostly creates their sets: one that finds its set costs
-- more than a GET (a new set built and sent for nothing), so once such finds outnumber the
-- sets created by more than two (a table that holds entries), the run's claims read with GET.
local lead = 2
-- Claims that found their key holding no set.
local fresh = 0
for i = 1, n do
  local key, digest = ARGV[7 + n + i], ARGV[7 + i]
  if #digest == 17 and not claiming then
    -- A digest given twice is decided the second time on its whole set, as changed.
    if not hinted[digest] then
      hinted[digest] = true
      local offset = 3 + byte(digest, 1) * ENTRY
      local entry = redis.pcall('GETRANGE', key, at_offset(offset), at_offset(offset + ENTRY - 1))
      if type(entry) == 'table' then return fail(entry) end
      if #entry == ENTRY and find(entry, digest, 1, true) == 1 and byte(entry, 18) ~= 0 then
        entries[i] = entry
      end
    end
  end
  if not entries[i] and sets[key] == nil then
    local value, error
    if claiming and lead >= 0 then
      -- Written only if the key holds nothing, which then answers nil (false in Lua).
      local set = FIRST .. digest .. CLAIMED
      local stored = redis.pcall('SET', key, set, 'NX', 'GET')
      if stored == false then
        lead = lead + 1
        fresh = fresh + 1
        created[#created + 1] = key
        decided[i] = 0
        value = set
      elseif type(stored) == 'table' and find(stored.err or '', 'syntax error', 1, true) then
        -- A server before Redis 7.0 refuses NX with GET: this run reads instead.
        lead = -1
        value, error = read(key, true)
      else
        lead = lead - 1
        value, error = read(key, true, stored)
      end
    else
      value, error = read(key, true)
    end
    if error then return fail(error) end
    if claiming and value == EMPTY then fresh = fresh + 1 end
    sets[key] = value
  end
end

local answers = {}
for i = 1, n do
  local key, entry = ARGV[7 + n + i], entries[i]
  local answer, changed = decided[i], false
  if answer then
    -- Claimed new in slot 0 by the write that created the set, which `sets[key]` holds.
  elseif entry then
    answer, changed = update(key, entry, 1, 3 + byte(entry, 1) * ENTRY, nil)
  else
    local value, digest = sets[key], ARGV[7 + i]
    if not value then
      -- An earlier digest of the run changed the set: this one sees it as changed.
      value = read(key, false) or EMPTY
      sets[key] = value
    end
    if #digest == 17 and not claiming then digest = sub(digest, 2) end
    if claiming then
      answer, changed = claim(key, value, digest)
    else
      local at = locate(value, digest)
      if at then
        answer, changed = update(key, value, at, 0, byte(value, 1))
      else
        answer, changed = 0, false
      end
    end
  end
  answers[i] = answer
  if changed and sets[key] then sets[key] = false end
end
answers[n + 1] = unreadable
answers[n + 2] = fresh
return answers
