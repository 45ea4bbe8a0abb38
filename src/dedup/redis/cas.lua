-- The compact layout's compare-and-set, for servers without SET … IFEQ (Redis 7.0, Valkey
-- 8.0); the client decides every operation itself and writes a key's value whole (see
-- `items.rs`).
--
-- KEYS[1]: the key. No ARGV: answers what it holds (nil: nothing). ARGV[1] alone: writes it
-- where the key holds nothing. ARGV[1] and ARGV[2]: writes ARGV[1] where the key holds exactly
-- ARGV[2]. A write answers 1 when it wrote, 0 when the key held something else; it keeps
-- whatever expiry the key has (KEEPTTL).
local held = redis.call('GET', KEYS[1])
if #ARGV == 0 then
  return held
end
if #ARGV == 1 then
  if held then
    return 0
  end
elseif held ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
return 1
