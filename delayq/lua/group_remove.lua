-- group_remove: drop a delivery group and its pending deliveries, a batch at a time.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `meta`, `groups`, `pending` of the type,
--   then every group's (see _groups.lua), with one group.
--   then `prio` (_levels.lua), then the group's ready lists of levels 1..9.
-- ARGV: 1, the group name, ARG(1) batch size, ARG(2) '1' on the first call
-- Returns: -1 refused (the type's last group: a type always has one), 0 not
--          registered (or registered again since the first call: left alone),
--          1 done (the group's keys are gone), 2 call again (more to drop).
-- Guarantees: the first call takes the group out of the registry, so no move
-- fans out to it afterwards; each dropped delivery lets go of the event
-- (the last group holding it deletes the envelope); a handler of the group
-- still running finds its lease gone, and its ack or failure changes nothing.
local name, batch, first = GROUP_NAMES[1], tonumber(ARG(1)), ARG(2) == '1'
local registered = redis.call('HEXISTS', K_GROUPS, name) == 1
if first then
  if not registered then
    if redis.call('EXISTS', gkey(1, G_QUEUED), gkey(1, G_INFLIGHT), gkey(1, G_SCHEDULED),
        gkey(1, G_DEAD)) == 0 then return 0 end
  else
    if redis.call('HLEN', K_GROUPS) == 1 then return -1 end
    redis.call('HDEL', K_GROUPS, name)
  end
elseif registered then
  return 0
end
local counted = counting()
local leases, attempts, errors = gkey(1, G_LEASES), gkey(1, G_ATTEMPTS), gkey(1, G_ERRORS)
local left = 0
for _, j in ipairs({G_SCHEDULED, G_QUEUED, G_INFLIGHT, G_DEAD}) do
  local key = gkey(1, j)
  local ids = redis.call('ZRANGE', key, 0, batch - 1)
  for _, id in ipairs(ids) do
    redis.call('ZREM', key, id)
    redis.call('HDEL', leases, id)
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', errors, id)
    release(id, counted)
  end
  left = left + redis.call('ZCARD', key)
end
if left > 0 then return 2 end
redis.call('DEL', gkey(1, G_READY), leases, attempts, errors)
-- its priority levels' ready lists (entries whose ids left `queued` above)
for n = 1, LEVEL_WIDTH do redis.call('DEL', glkey(1, n)) end
-- its flow keys' lines, rotation, parked keys and running deliveries (see _prelude.lua)
redis.call('DEL', gkkey(1, G_KLINES), gkkey(1, G_KROT), gkkey(1, G_KWAIT), gkkey(1, G_KRUN))
-- the default group's counters live in the type's own meta hash: they stay
if gkey(1, G_META) ~= K_META then redis.call('DEL', gkey(1, G_META)) end
return 1
