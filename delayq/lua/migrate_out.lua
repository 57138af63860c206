-- migrate_out: remove an event from a partition layout that is being retired,
-- after its copy was written to the type's new layout (delayq.repartition).
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `queued`, `inflight`,
--   `leases`, `attempts`, `errors`, `dead`, `prio` of the old partition (see _prelude.lua,
--   _levels.lua).
-- ARGV[1] id, ARGV[2] the envelope that was copied
-- Returns: 1 removed, 0 left alone (the stored envelope is another version, or
--          the event is a dead letter, or gone).
-- Guarantees: only the version that was copied is removed, so a replace that
-- reached the old layout after the copy is not lost; like cancel, every state
-- goes at once (a running handler's ack becomes a no-op: its copy runs again,
-- at least once). Its priority level goes too (the copy was given it).
local id = ARGV[1]
if redis.call('HGET', K_EVENTS, id) ~= ARGV[2] then return 0 end
if redis.call('ZSCORE', K_DEAD, id) then return 0 end
redis.call('HDEL', K_EVENTS, id)
redis.call('HDEL', K_PRIO, id)
forget_delivery(id)
return 1
