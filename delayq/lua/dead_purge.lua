-- dead_purge: delete dead letters for good.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `attempts`, `errors`, `dead`, `pending`,
--   `fkeys` of the type or one group's view (see _prelude.lua).
--   then `prio` (_levels.lua), then `deps`, `relay` (docs/WORKFLOWS.md)
-- ARGV: ids
-- Returns: how many dead letters were deleted; {deleted, completions} when some were
--   parents of a type with delivery groups whose failure now waits for the relay.
--   A purged child's edges go, and a purged parent's records once handed on.
-- Guarantees: only dead letters are deleted; pending events with the same
-- ids are untouched. The envelope goes with the last group holding the event.
local counted = counting()
local deps = K_DEPS and redis.call('EXISTS', K_DEPS) == 1
local n, completed = 0, 0
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DEAD, id) == 1 then
    local err = deps and redis.call('HGET', K_ERRORS, id)
    redis.call('HDEL', K_ATTEMPTS, id)
    redis.call('HDEL', K_ERRORS, id)
    release(id, counted)
    if redis.call('HEXISTS', K_EVENTS, id) == 0 then
      redis.call('HDEL', K_FKEYS, id)
      if deps then
        dep_forget(id)  -- a child (a ParentFailed one, say): its edges go
        -- a fanned-out parent whose last group let go: a failure for its children (a
        -- type without groups told them when it became a dead letter: fail.lua)
        if counted and dep_complete(id, 'f' .. (err or ''), clock_ms()) then
          completed = completed + 1
        end
        dep_gone(id)
      end
    end
    n = n + 1
  end
end
if completed > 0 then return {n, completed} end
return n
