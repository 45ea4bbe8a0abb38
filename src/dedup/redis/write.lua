-- The writes of claims the store decided on a plain read of their full sets (see read.rs):
-- each written only if its set's header is still the one that read found, checked and written
-- atomically (Redis runs a script to its end before any other command).
-- ARGV: n keys, then n headers as read (3 bytes each: version, cursor, ways), then the n new
-- entries (34 bytes each, see set.lua; the first byte is the slot, the cursor's), then the n
-- new headers (the cursor moved on). Only the entry and the header are written: what lies
-- between them may have changed since the read (a commit, an erase).
-- The writes are made in order, so that a second write to one set finds the header the
-- first one wrote, and is refused.
-- KEYS holds the first key only: it routes the run to its node (as set.lua's runs do).
-- A claim that adds an entry to a full set moves its cursor, but one into an erased slot
-- (see set.lua), so an unchanged header means no entry was added since the read, but in a
-- slot erased since (read.rs sends a set that holds an erased slot to set.lua instead).
-- Returns, per write, 1 = written; 0 = not, the header changed; 2 = not, the key could not
-- be read or written (not a string; in a cluster, not its node's).
local n = #ARGV / 4
local pcall, byte, tostring = redis.pcall, string.byte, tostring
local ENTRY = 34

-- The decimal string of a slot's offset, made once per run (see set.lua).
local offsets = {}
local function offset_of(slot)
  local text = offsets[slot]
  if not text then
    text = tostring(3 + slot * ENTRY)
    offsets[slot] = text
  end
  return text
end

local answers = {}
for i = 1, n do
  local key = ARGV[i]
  local header = pcall('GETRANGE', key, '0', '2')
  if type(header) == 'table' then
    answers[i] = 2
  elseif header ~= ARGV[n + i] then
    answers[i] = 0
  else
    local entry = ARGV[2 * n + i]
    local written = pcall('SETRANGE', key, offset_of(byte(entry, 1)), entry)
    if type(written) == 'table' then
      answers[i] = 2
    else
      pcall('SETRANGE', key, '0', ARGV[3 * n + i])
      answers[i] = 1
    end
  end
end
return answers
