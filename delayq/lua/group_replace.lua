-- group_replace: replace an event that was already fanned out to delivery groups
-- (enqueue.lua answers 3 for it and changes nothing).
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `meta`, `groups`, `pending` of
--   the type, then every group's (see _groups.lua), with every registered group.
--   then `prio` (_levels.lua)
-- ARGV: n, the group names, then ARG(1) id, ARG(2) envelope, ARG(3) time,
--       ARG(4) 'at' (unix ms) or 'delay' (ms from now), ARG(5) wake-up channel,
--       ARG(6) type name, ARG(7) the new priority level (absent: 0)
-- Returns: 2 replaced, 1 added (no such event any more), or {'stale', group...}.
-- Guarantees: payload, context and due time change together for every group
-- that still holds the event (waiting, ready, running or a dead letter): each
-- gets the new version at the new due time, with its attempts and error
-- reset; a running handler of the old version finds its lease gone, so its
-- ack or failure changes nothing. Groups that already acked it do not get it
-- again. An event not yet fanned out is replaced as enqueue.lua does, and
-- reaches every group when due. The event's priority level becomes ARG(7) for
-- every group (as enqueue.lua's replace sets it).
local reg, names = registry()
if not reg then return stale(names) end
check_keys('events', 'scheduled', 'meta', 'pending')
check_group_keys()
local now = clock_ms()
local id, envelope = ARG(1), ARG(2)
local due = tonumber(ARG(3))
if ARG(4) ~= 'at' then due = now + due end
local existed = redis.call('HEXISTS', K_EVENTS, id) == 1
local fanned = redis.call('ZREM', K_SCHEDULED, id) == 0 and existed
  and redis.call('HEXISTS', K_PENDING, id) == 1
local holders = 0
if fanned then
  for g = 1, N_GROUPS do
    local held = redis.call('ZREM', gkey(g, G_SCHEDULED), id) + redis.call('ZREM', gkey(g, G_QUEUED), id)
      + redis.call('ZREM', gkey(g, G_INFLIGHT), id) + redis.call('ZREM', gkey(g, G_DEAD), id)
    if held > 0 then
      holders = holders + 1
      redis.call('HDEL', gkey(g, G_LEASES), id)
      redis.call('HDEL', gkey(g, G_ATTEMPTS), id)
      redis.call('HDEL', gkey(g, G_ERRORS), id)
      redis.call('ZADD', gkey(g, G_SCHEDULED), due, id)
    end
  end
end
redis.call('HSET', K_EVENTS, id, envelope)
set_levels({id}, {tonumber(ARG(7)) or 0})
if holders == 0 then
  redis.call('HDEL', K_PENDING, id)
  redis.call('ZADD', K_SCHEDULED, due, id)
else
  redis.call('HSET', K_PENDING, id, holders)
end
local wake = tonumber(redis.call('HGET', K_META, 'wake'))
if wake == nil or due < wake then
  redis.call('HSET', K_META, 'wake', string.format('%.0f', due))
  redis.call('PUBLISH', ARG(5), ARG(6))
end
if existed then return 2 end
return 1
