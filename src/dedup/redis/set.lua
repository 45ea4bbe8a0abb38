-- One operation on one set of the shared de-duplication table, atomically (Redis runs a
-- script to its end before any other command). The set is the string at KEYS[1], in the
-- Memcached store's value format (see src/dedup/memcached/mod.rs):
--   u8 version (1, or 2 with commit times) | u8 cursor | u8 count |
--   count x (u8 slot | 16 B digest | u8 state 1=in flight 2=done | u64 time ms | u64 owner)
-- ARGV: op (c = claim, m = commit, e = erase, r = renew), digest (16 bytes), owner (8 bytes),
-- now ms, lease end ms, max age ms ("" for none), ways, version to write.
-- Returns {answer, unreadable}: a claim answers 0 = new, 1 = in flight, 2 = duplicate, the
-- others 1 = held, 0 = not; unreadable is 1 when the stored value could not be decoded (it
-- was read as an empty set).
local op, digest, owner = ARGV[1], ARGV[2], ARGV[3]
local now, lease_until = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_age = tonumber(ARGV[6])
local ways, version = tonumber(ARGV[7]), tonumber(ARGV[8])
local ENTRY = 34

-- Times are below 2^53 ms, so a Lua number holds them exactly.
local function u64(s, at)
  local n = 0
  for i = at, at + 7 do n = n * 256 + string.byte(s, i) end
  return n
end

local function be64(n)
  local bytes = {}
  for i = 8, 1, -1 do
    bytes[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(bytes)
end

local function decode(value)
  local slots = {}
  if not value then return 0, slots end
  if #value < 3 then return nil end
  local v, cursor, count = string.byte(value, 1, 3)
  if (v ~= 1 and v ~= 2) or cursor >= ways or count > ways or #value ~= 3 + count * ENTRY then
    return nil
  end
  for e = 0, count - 1 do
    local at = 4 + e * ENTRY
    local index, state = string.byte(value, at), string.byte(value, at + 17)
    if index >= ways or slots[index + 1] or (state ~= 1 and state ~= 2) then return nil end
    slots[index + 1] = {
      digest = string.sub(value, at + 1, at + 16),
      state = state,
      time = u64(value, at + 18),
      owner = string.sub(value, at + 26, at + 33),
    }
  end
  return cursor, slots
end

local function encode(cursor, slots)
  local parts, count = {}, 0
  for i = 1, ways do
    local e = slots[i]
    if e then
      count = count + 1
      parts[#parts + 1] = string.char(i - 1) .. e.digest .. string.char(e.state)
        .. be64(e.time) .. e.owner
    end
  end
  return string.char(version, cursor, count) .. table.concat(parts)
end

local cursor, slots = decode(redis.call('GET', KEYS[1]))
local unreadable = 0
if not cursor then
  cursor, slots, unreadable = 0, {}, 1
end

local found
for i = 1, ways do
  if slots[i] and slots[i].digest == digest then found = i break end
end

local function write()
  redis.call('SET', KEYS[1], encode(cursor, slots))
end

if not found then
  if op ~= 'c' then return {0, unreadable} end
  local victim
  for i = 1, ways do
    if not slots[i] then victim = i break end
  end
  if not victim then
    victim = cursor % ways + 1
    cursor = victim % ways
  end
  slots[victim] = {digest = digest, state = 1, time = lease_until, owner = owner}
  write()
  return {0, unreadable}
end

local e = slots[found]
local mine = e.owner == owner
if op == 'c' then
  if e.state == 2 then
    if e.time ~= 0 and max_age and now - e.time > max_age then
      -- Committed longer ago than max_age: a body sent again on purpose.
      e.state, e.owner, e.time = 1, owner, lease_until
      write()
      return {0, unreadable}
    end
    return {2, unreadable}
  end
  if e.time > now then return {1, unreadable} end
  -- The owner let the lease lapse: take the entry over, in its slot.
  e.owner, e.time = owner, lease_until
  write()
  return {0, unreadable}
elseif op == 'm' then
  if e.state == 2 then return {1, unreadable} end
  if not mine then return {0, unreadable} end
  e.state = 2
  if max_age then e.time = now else e.time = 0 end
  write()
  return {1, unreadable}
elseif op == 'e' then
  if not mine then return {0, unreadable} end
  slots[found] = nil
  write()
  return {1, unreadable}
elseif op == 'r' then
  if e.state ~= 1 or not mine then return {0, unreadable} end
  e.time = lease_until
  write()
  return {1, unreadable}
end
return redis.error_reply('unknown operation ' .. tostring(op))
