-- group_cancel: cancel.lua for a type with delivery groups.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `groups`, `pending` of the
--   type, then every group's (see _groups.lua), with every registered group.
-- ARGV: n, the group names, then ARG(1) id
-- Returns: 1 removed, 0 nothing pending (unknown, done, or only dead letters),
--          or {'stale', group...} (see group_move.lua).
-- Guarantees: in one step the event leaves the schedule and every group's
-- retries, ready list and leases (a running handler's ack or failure becomes
-- a no-op). Groups that made it a dead letter keep it (dead letters go with
-- dead_purge), and with them the envelope; otherwise the envelope goes too.
local reg, names = registry()
if not reg then return stale(names) end
local id = ARG(1)
local removed = redis.call('ZREM', K_SCHEDULED, id)
local dead_holders = 0
for g = 1, N_GROUPS do
  local held = redis.call('ZREM', gkey(g, G_SCHEDULED), id) + redis.call('ZREM', gkey(g, G_QUEUED), id)
    + redis.call('ZREM', gkey(g, G_INFLIGHT), id)
  if held > 0 then
    removed = 1
    redis.call('HDEL', gkey(g, G_LEASES), id)
    redis.call('HDEL', gkey(g, G_ATTEMPTS), id)
    redis.call('HDEL', gkey(g, G_ERRORS), id)
  elseif redis.call('ZSCORE', gkey(g, G_DEAD), id) then
    dead_holders = dead_holders + 1
  end
end
if removed == 0 then return 0 end
if dead_holders == 0 then
  redis.call('HDEL', K_PENDING, id)
  redis.call('HDEL', K_EVENTS, id)
  redis.call('HDEL', K_FKEYS, id)  -- its flow key, if it had one
else
  redis.call('HSET', K_PENDING, id, dead_holders)
end
return 1
