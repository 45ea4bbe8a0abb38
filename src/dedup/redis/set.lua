-- One operation on many digests of the shared de-duplication table, atomically (Redis runs a
-- script to its end before any other command). The set of a digest is the string at its key,
-- every entry at a fixed offset, so that a claim or a commit writes only its own entry:
--   u8 version (1, or 2 with commit times) | u8 cursor | u8 ways |
--   k x (u8 slot | 16 B digest | u8 state 0=empty 1=in flight 2=done | u64 time ms |
--        u64 owner), the entry of slot i at byte 3 + 34 i; an empty slot is all zeros.
-- Slots fill in order, so a set holds its first k slots (k <= ways): it grows by one entry
-- until it is full, then keeps its length.
-- ARGV: op (c = claim, m = commit, e = erase, r = renew), owner (8 bytes), now ms, lease end
-- ms, max age ms ("" for none), ways, version to write, then n 16-byte digests, then the n keys
-- of their sets (the i-th digest's set is the i-th key); digests of one set repeat its key, and
-- are decided in order (a digest given twice is claimed new once, then found in flight).
-- Op d is a claim whose new entry is written done (a digest given twice is then a duplicate).
-- KEYS holds the first of those keys only: it routes the run to its node. In a cluster the
-- other keys may be of other slots of the same node (a script without flags may reach any key
-- its node serves); one its node does not serve fails the run when it is read, before any
-- write.
-- Every key is read before any is written, so a key that cannot be read (not a string) fails
-- the whole call with nothing written.
-- Returns one answer per digest (a claim: 0 = new, 1 = in flight, 2 = duplicate; the others:
-- 1 = held, 0 = not), then how many stored values were not sets of this shape (each was read
-- as an empty set).
--
-- A stored set is checked by its length and its header only: every offset the script reads
-- is then inside it, whatever the entries hold. A change inside a set is a SETRANGE of the
-- bytes it changes (building a new value in Lua costs more than the decision); a set that
-- grows is written whole, so that Redis allocates it no more than its length.
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
local pack, unpack = struct.pack, struct.unpack
local call = redis.call

-- Whether value is a set of `ways` ways in a known format.
local function readable(value)
  local n = #value
  if n < 3 or n > SIZE or (n - 3) % ENTRY ~= 0 then return false end
  local v, cursor, w = byte(value, 1, 3)
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
local claim = op == 'c' or op == 'd'
if op == 'd' then CLAIMED = DONE .. owner end

-- Writes `bytes` at 0-based `offset` of the set at key, and the header's version if the
-- stored one differs.
local function write(key, value, offset, bytes)
  call('SETRANGE', key, offset, bytes)
  if byte(value, 1) ~= version then call('SETRANGE', key, 0, char(version)) end
end

-- Claims digest in a set where it is absent: the first empty slot, else the cursor's (which
-- moves on). `value` is what the key holds, or an empty set's header if nothing readable.
local function insert(key, value, digest)
  local n = #value
  for at = 4 + 17, n, ENTRY do
    if byte(value, at) == 0 then
      -- A slot that an erase emptied.
      local slot = (at - 21) / ENTRY
      write(key, value, 3 + slot * ENTRY, char(slot) .. digest .. CLAIMED)
      return
    end
  end
  if n < SIZE then
    call('SET', key, char(version) .. sub(value, 2, n) .. char((n - 3) / ENTRY) .. digest
      .. CLAIMED)
    return
  end
  local cursor = byte(value, 2)
  call('SETRANGE', key, 3 + cursor * ENTRY, char(cursor) .. digest .. CLAIMED)
  call('SETRANGE', key, 0, char(version, (cursor + 1) % ways))
end

-- The answer for digest in the set at key, and whether the set changed.
local function apply(key, value, digest)
  local at = locate(value, digest)
  if not at then
    if not claim then return 0, false end
    insert(key, value, digest)
    return 0, true
  end
  local state = byte(value, at + 17)
  if claim then
    local time = unpack('>I8', value, at + 18)
    if state == 2 then
      if time ~= 0 and max_age and now - time > max_age then
        -- Committed longer ago than max_age: a body sent again on purpose.
        write(key, value, at + 16, CLAIMED)
        return 0, true
      end
      return 2, false
    end
    if time > now then return 1, false end
    -- The owner let the lease lapse: take the entry over, in its slot.
    write(key, value, at + 16, CLAIMED)
    return 0, true
  end
  if op == 'm' and state == 2 then return 1, false end
  -- The owner's id is the entry's last 8 bytes.
  if find(value, owner, at + 26, true) ~= at + 26 then return 0, false end
  if op == 'm' then
    write(key, value, at + 16, DONE)
  elseif op == 'e' then
    call('SETRANGE', key, at - 1, rep('\0', ENTRY))
  else
    if state ~= 1 then return 0, false end
    write(key, value, at + 16, CLAIMED)
  end
  return 1, true
end

-- Every key read first; `left[key]` counts the digests of the run still to be decided in it.
local sets, left, unreadable = {}, {}, 0
for i = 1, n do
  local key = ARGV[7 + n + i]
  if sets[key] then
    left[key] = left[key] + 1
  else
    left[key] = 1
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then return value end
    if value and readable(value) then
      sets[key] = value
    else
      if value then unreadable = unreadable + 1 end
      sets[key] = EMPTY
    end
  end
end

local answers = {}
for i = 1, n do
  local key = ARGV[7 + n + i]
  local answer, changed = apply(key, sets[key], ARGV[7 + i])
  answers[i] = answer
  left[key] = left[key] - 1
  if changed and left[key] > 0 then
    -- Another digest of the run is in this set: it is decided on the set as changed.
    sets[key] = call('GET', key)
  end
end
answers[n + 1] = unreadable
return answers
