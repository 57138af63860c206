-- dead_purge: delete dead letters for good.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `attempts`, `errors`, `dead`, `pending`,
--   `fkeys` of the type or one group's view (see _prelude.lua).
--   then `prio` (_levels.lua)
-- ARGV: ids
-- Returns: how many dead letters were deleted.
-- Guarantees: only dead letters are deleted; pending events with the same
-- ids are untouched. The envelope goes with the last group holding the event.
local counted = counting()
local n = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DEAD, id) == 1 then
    redis.call('HDEL', K_ATTEMPTS, id)
    redis.call('HDEL', K_ERRORS, id)
    release(id, counted)
    if redis.call('HEXISTS', K_EVENTS, id) == 0 then redis.call('HDEL', K_FKEYS, id) end
    n = n + 1
  end
end
return n
