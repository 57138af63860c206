-- cancel: remove an event that has not been handled successfully yet.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `queued`, `inflight`,
--   `leases`, `attempts`, `errors`, `dead`, `groups`, `dedup`, `fkeys` of the type or one
--   group's view (see _prelude.lua).
--   then `prio` (_levels.lua), then `deps`, `relay`, `waiting` (docs/WORKFLOWS.md)
-- ARGV[1] id, ARGV[2] the delivery group asked for ('' for every group; a type
--         without named groups has only 'default')
-- Returns: 1 removed (2: and it was a parent whose "cancelled" waits for the relay),
--          0 no such pending event (unknown, or a dead letter:
--          dead letters are removed with dead_purge; or no such group), or
--          {'stale', group...} when the type has delivery groups (the caller
--          runs group_cancel.lua).
-- Guarantees: the event is gone from every state at once; a stale ready
-- entry is skipped by claim, and a running handler's ack becomes a no-op.
-- A cancelled event was not handled: its unique_for mark (still -ttl) goes. A waiting
-- child stops waiting (its edges go); a parent's children are handed "cancelled".
local id, group = ARGV[1], ARGV[2] or ''
if grouped() then return {'stale', unpack(redis.call('HKEYS', K_GROUPS))} end
if group ~= '' and group ~= 'default' then return 0 end
if redis.call('ZSCORE', K_DEAD, id) then return 0 end
if redis.call('HDEL', K_EVENTS, id) == 0 then return 0 end
forget_delivery(id)
redis.call('HDEL', K_FKEYS, id)  -- its flow key, if it had one
redis.call('HDEL', K_PRIO, id)  -- its priority level, if it had one
local mark = tonumber(redis.call('ZSCORE', K_DEDUP, 'u:' .. id))
if mark and mark < 0 then redis.call('ZREM', K_DEDUP, 'u:' .. id) end
if redis.call('EXISTS', K_DEPS) == 1 then
  redis.call('ZREM', K_WAITING, id)
  dep_forget(id)
  if dep_complete(id, 'c', clock_ms()) then return 2 end
end
return 1
