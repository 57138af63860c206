-- batch_trim: done batches past the retention are removed.
--
-- KEYS (delayq/keyspace/scripts.py): `deps`, `bindex`, `bdone` of the batch shard, then
--   per batch its own `brec`, `bmembers`, `bfailed` (see _batches.lua).
-- ARGV[1] the retention (ms), ARGV[2..] batch ids (one per block of keys)
-- Returns: how many were removed.
-- Guarantees: only a batch done for the retention goes; its completion's fields in
-- `deps` go with it unless the relay still has to hand it on (dep_relayed.lua clears
-- them then).
local now = clock_ms()
local retention = tonumber(ARGV[1])
local removed = 0
for b = 1, #ARGV - 1 do
  local bid = ARGV[b + 1]
  local done = tonumber(redis.call('ZSCORE', K_BDONE, bid))
  if done and done <= now - retention then
    redis.call('UNLINK', bkey(b, B_REC), bkey(b, B_MEMBERS), bkey(b, B_FAILED))
    redis.call('ZREM', K_BDONE, bid)
    redis.call('ZREM', K_BINDEX, bid)
    local c = redis.call('HGET', K_DEPS, 'c:' .. bid)
    if not c or redis.call('HEXISTS', K_DEPS, 'r:' .. bid .. '\0' .. c) == 0 then
      redis.call('HDEL', K_DEPS, 'c:' .. bid, 'b:' .. bid, 'f:' .. bid)
    end
    removed = removed + 1
  end
end
return removed
