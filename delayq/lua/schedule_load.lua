-- schedule_load: schedules' definitions and states, read together.
--
-- KEYS (delayq/keyspace/scripts.py): `schedules`, `schedule_state`: the type's schedules
--   HASH (name -> definition) and schedule-state HASH (name -> state; see
--   schedule_fire.lua).
-- ARGV the names (the caller sends at most 1000)
-- Returns: {definition or false, state or false} per name, flattened, in ARGV's order.
-- Guarantees: read-only, and one moment's view: schedule_write.lua changes a
--   definition and its state's version in one script, so a state read here always
--   carries the version of the definition read with it (two separate reads could pair
--   an old definition with a new version: a firer that cached that pair never fired
--   the schedule again).
local defs = redis.call('HMGET', K_SCHEDULES, unpack(ARGV))
local states = redis.call('HMGET', K_SCHEDULE_STATE, unpack(ARGV))
local out = {}
for i = 1, #ARGV do
  out[2 * i - 1] = defs[i]
  out[2 * i] = states[i]
end
return out
