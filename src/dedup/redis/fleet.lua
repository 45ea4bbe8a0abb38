-- The fleet's counters (see src/dedup/fleet.rs): adds this consumer's distinct count to the
-- current bucket's counter and reads the last whole buckets' counters, in one run.
-- KEYS[1] is the current bucket's counter, KEYS[2..] the counters to read; all carry the same
-- hash tag, so in a cluster they live on one node.
-- ARGV: the count to add, how long the counter is kept (ms).
-- Returns the counters read, 0 for a missing one, in the order of KEYS[2..].
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local counts = {}
for i = 2, #KEYS do
  local value = redis.call('GET', KEYS[i])
  counts[i - 1] = value and tonumber(value) or 0
end
return counts
