-- key_backlog: the flow keys of a group with work: ready events per key, live
-- deliveries per key and parked keys (docs/FLOW.md, "Flow keys").
--
-- KEYS (delayq/keyspace/scripts.py): `klines`, `krot`, `kwait`, `krun` of the type or one
--   group's view (see _prelude.lua).
-- ARGV[1] how many keys to look at at most (the caller bounds it)
-- Returns: {in_rotation, parked, key, ready, running, parked_until_ms (-1: not
--   parked), ...} for up to ARGV[1] keys: those in rotation (in turn order),
--   then the parked ones. running counts deliveries recorded for a per-key
--   concurrency limit (0 without one).
-- Guarantees: read-only; one consistent view; at most 3 O(log n) commands per
-- key looked at.
local scan = tonumber(ARGV[1])
local rot = redis.call('ZRANGE', K_KROT, 0, scan - 1)
local waiting = redis.call('ZRANGE', K_KWAIT, 0, scan - 1, 'WITHSCORES')
local result = {redis.call('ZCARD', K_KROT), redis.call('ZCARD', K_KWAIT)}
local function add(fk, parked_until)
  local lo, hi = key_range(fk)
  result[#result + 1] = fk
  result[#result + 1] = redis.call('ZLEXCOUNT', K_KLINES, lo, hi)
  result[#result + 1] = redis.call('ZLEXCOUNT', K_KRUN, lo, hi)
  result[#result + 1] = parked_until
end
for _, fk in ipairs(rot) do add(fk, -1) end
for i = 1, #waiting, 2 do
  if #result >= 2 + 4 * scan then break end
  add(waiting[i], string.format('%.0f', tonumber(waiting[i + 1])))
end
return result
