-- One operation on many digests of the shared de-duplication table, atomically (Redis runs a
-- script to its end before any other command). The set of a digest is the string at its key,
-- in the Memcached store's value format (see src/dedup/memcached/mod.rs):
--   u8 version (1, or 2 with commit times) | u8 cursor | u8 count |
--   count x (u8 slot | 16 B digest | u8 state 1=in flight 2=done | u64 time ms | u64 owner)
-- KEYS[i] is the set of the i-th digest; digests of one set repeat its key, and are decided in
-- order (a digest given twice is claimed new once, then found in flight).
-- ARGV: op (c = claim, m = commit, e = erase, r = renew), owner (8 bytes), now ms, lease end
-- ms, max age ms ("" for none), ways, version to write, then one 16-byte digest per key.
-- Every key is read before any is written, so a key that cannot be read (not a string) fails
-- the whole call with nothing written.
-- Returns one answer per digest (a claim: 0 = new, 1 = in flight, 2 = duplicate; the others:
-- 1 = held, 0 = not), then how many stored values could not be decoded (each was read as an
-- empty set).
--
-- The sets stay strings and each operation splices the one entry it changes: decoding a set
-- into Lua tables and encoding it again costs several times more than the decision.
local op, owner = ARGV[1], ARGV[2]
local now, lease_until = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_age = tonumber(ARGV[5])
local ways, version = tonumber(ARGV[6]), tonumber(ARGV[7])
if op ~= 'c' and op ~= 'm' and op ~= 'e' and op ~= 'r' then
  return redis.error_reply('unknown operation ' .. tostring(op))
end
local ENTRY = 34
local byte, sub, char, find = string.byte, string.sub, string.char, string.find
local pack, unpack = struct.pack, struct.unpack

-- 2^i for a slot index i: a bit set of slots in a Lua number, tested with arithmetic (a call
-- into the bit library costs as much as the test).
local FLAG = {[0] = 1, 2, 4, 8, 16, 32, 64, 128}

-- Whether value is a set of `ways` ways in a known format: the Memcached store's decoder's
-- checks.
local function readable(value)
  local n = #value
  if n < 3 then return false end
  local v, cursor, count = byte(value, 1, 3)
  if (v ~= 1 and v ~= 2) or cursor >= ways or count > ways or n ~= 3 + count * ENTRY then
    return false
  end
  local seen = 0
  for at = 4, n, ENTRY do
    local index, state = byte(value, at), byte(value, at + 17)
    if index >= ways or (state ~= 1 and state ~= 2) then return false end
    local flag = FLAG[index]
    if seen % (flag + flag) >= flag then return false end
    seen = seen + flag
  end
  return true
end

-- Where the entry of digest starts, or nil. A plain search, kept only where it lines up
-- with an entry's digest field.
local function locate(value, digest)
  local from = 5
  while true do
    local at = find(value, digest, from, true)
    if not at then return nil end
    if (at - 5) % ENTRY == 0 then return at - 1 end
    from = at + 1
  end
end

-- The fields of an entry of this owner after its slot index and digest: the same for every
-- digest of one run, so made once.
local CLAIMED = pack('>BI8', 1, lease_until) .. owner
local DONE = pack('>BI8', 2, max_age and now or 0) .. owner

-- value with the entry at `at` rewritten for this owner.
local function replace(value, at, tail)
  return char(version) .. sub(value, 2, at + 16) .. tail .. sub(value, at + ENTRY)
end

-- value with digest claimed: the first empty slot, else the cursor's (which moves on).
local function insert(value, digest)
  local _, cursor, count = byte(value, 1, 3)
  local n = #value
  if count < ways then
    local used = 0
    for at = 4, n, ENTRY do used = used + FLAG[byte(value, at)] end
    for index = 0, ways - 1 do
      local flag = FLAG[index]
      if used % (flag + flag) < flag then
        -- Entries stay in slot order.
        local at = 4
        while at < n and byte(value, at) < index do at = at + ENTRY end
        return char(version, cursor, count + 1) .. sub(value, 4, at - 1) .. char(index)
          .. digest .. CLAIMED .. sub(value, at)
      end
    end
  end
  -- Full: the cursor's entry, where slot order puts it unless another writer ordered them
  -- otherwise.
  local at = 4 + cursor * ENTRY
  if byte(value, at) ~= cursor then
    at = 4
    while byte(value, at) ~= cursor do at = at + ENTRY end
  end
  return char(version, (cursor + 1) % ways, count) .. sub(value, 4, at)
    .. digest .. CLAIMED .. sub(value, at + ENTRY)
end

-- The answer for digest in value, and the new value if it changed.
local function apply(value, digest)
  local at = locate(value, digest)
  if not at then
    if op ~= 'c' then return 0 end
    return 0, insert(value, digest)
  end
  local state = byte(value, at + 17)
  if op == 'c' then
    local time = unpack('>I8', value, at + 18)
    if state == 2 then
      if time ~= 0 and max_age and now - time > max_age then
        -- Committed longer ago than max_age: a body sent again on purpose.
        return 0, replace(value, at, CLAIMED)
      end
      return 2
    end
    if time > now then return 1 end
    -- The owner let the lease lapse: take the entry over, in its slot.
    return 0, replace(value, at, CLAIMED)
  end
  if op == 'm' and state == 2 then return 1 end
  -- The owner's id is the entry's last 8 bytes.
  if find(value, owner, at + 26, true) ~= at + 26 then return 0 end
  if op == 'm' then
    return 1, replace(value, at, DONE)
  elseif op == 'e' then
    local _, cursor, count = byte(value, 1, 3)
    return 1, char(version, cursor, count - 1) .. sub(value, 4, at - 1) .. sub(value, at + ENTRY)
  else
    if state ~= 1 then return 0 end
    return 1, replace(value, at, CLAIMED)
  end
end

local sets, unreadable = {}, 0
for i = 1, #KEYS do
  local key = KEYS[i]
  if not sets[key] then
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then return value end
    if value and readable(value) then
      sets[key] = value
    else
      if value then unreadable = unreadable + 1 end
      sets[key] = char(version, 0, 0)
    end
  end
end

local answers, changed = {}, {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local answer, value = apply(sets[key], ARGV[7 + i])
  answers[i] = answer
  if value then
    sets[key] = value
    changed[key] = true
  end
end
for i = 1, #KEYS do
  local key = KEYS[i]
  if changed[key] then
    redis.call('SET', key, sets[key])
    changed[key] = nil
  end
end
answers[#KEYS + 1] = unreadable
return answers
