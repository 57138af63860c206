-- run_now: hand a scheduled event to the consumers now instead of at its due time.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `meta`,
--   `groups`, `fkeys`, `klines`, `krot`, `kwait` of the type or one group's view (see
--   _prelude.lua).
--   then `prio`, then the priority levels' ready lists `ready_1` `ready_2` `ready_3`
--   `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua)
-- ARGV[1] id, ARGV[2] the delivery group asked for ('' for any; a type
--         without named groups has only 'default')
-- Returns: 1 when the event was scheduled and is now ready, else 0 (not
--          scheduled: unknown, already ready or in flight, or a dead letter;
--          or no such group), or {'stale', group...} when the type has
--          delivery groups (the caller runs group_run_now.lua, which fans the
--          event out to every group).
-- Guarantees: the event leaves the schedule and enters the ready list in one
-- step, as move_due would move it; its attempts and last error are kept.
local id, group = ARGV[1], ARGV[2] or ''
if grouped() then return {'stale', unpack(redis.call('HKEYS', K_GROUPS))} end
if group ~= '' and group ~= 'default' then return 0 end
if not redis.call('ZSCORE', K_SCHEDULED, id) then return 0 end
check_keys('events', 'ready', 'queued', 'meta')
if redis.call('HEXISTS', K_EVENTS, id) == 0 then return 0 end  -- move_due drops it
redis.call('ZREM', K_SCHEDULED, id)
push_ready({id}, {clock_ms()})
return 1
