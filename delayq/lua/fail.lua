-- fail: a delivery failed; retry the event later or make it a dead letter.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `inflight`,
--   `leases`, `errors`, `dead`, `meta`, `groups`, `retries`, `limits`, `wake`, `fkeys`,
--   `klines`, `krot`, `kwait`, `krun` of the type or one group's view (see _prelude.lua);
--   then `results`, `rexp` for a type that keeps results.
--   then `prio`, then the priority levels' ready lists `ready_1` `ready_2` `ready_3`
--   `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua); then
--   `deps`, `relay`: a dead letter is sent every key (its children learn of it).
-- ARGV[1] id, ARGV[2] claim token, ARGV[3] 'retry' or 'dead'
-- ARGV[4] retry delay in ms, ARGV[5] error text ("Type: message")
-- ARGV[6] wake-up channel, ARGV[7] type name
-- ARGV[8], ARGV[9] (a type with results= only): how long the outcome is kept (ms), the
--   results channel; a dead letter then also keeps "f" .. error as the event's outcome
--   and publishes "<shard> <id>" (see ack_results.lua)
-- Returns: 1 retried, 2 dead-lettered, 3 dead-lettered and its completion (failed) waits
--   for the relay (a parent, see _deps.lua), 0 stale token (nothing changed).
-- Guarantees: the event keeps its envelope and attempt count; the error is
-- kept for the dead-letter view. Once the type has groups a retry waits in the
-- group's own schedule, so it is delivered to this group alone. With a
-- fleet-wide concurrency limit the freed slot wakes one waiting consumer, as an
-- ack does (one HEXISTS per call when the type has no limits).
local id, token = ARGV[1], ARGV[2]
if redis.call('HGET', K_LEASES, id) ~= token then return 0 end
check_keys('scheduled', 'ready', 'queued', 'inflight', 'errors', 'dead', 'meta', 'retries')
-- read before the first write: a limits key of the wrong type stops the script here
local limited = redis.call('HEXISTS', K_LIMITS, 'concurrency') == 1
keep_working_when_full()
local now = clock_ms()
redis.call('ZREM', K_INFLIGHT, id)
redis.call('HDEL', K_LEASES, id)
redis.call('HSET', K_ERRORS, id, ARGV[5])
if limited then wake_waiters(1) end
key_done(id, token, true)  -- flow keys: the key's slot is free (a no-op without keys)
if ARGV[3] == 'dead' then
  redis.call('ZADD', K_DEAD, now, id)
  if ARGV[8] then
    redis.call('HSET', K_RESULTS, id, 'f' .. ARGV[5])
    redis.call('ZADD', K_REXP, now + tonumber(ARGV[8]), id)
    redis.call('PUBLISH', ARGV[9], ARGV[7] .. ' ' .. id)
  end
  -- a dead letter is final for its children unless a delivery group still holds it
  if K_DEPS and not grouped() and redis.call('EXISTS', K_DEPS) == 1
      and dep_complete(id, 'f' .. ARGV[5], now) then
    return 3
  end
  return 2
end
local delay = tonumber(ARGV[4])
if delay <= 0 then
  push_ready({id}, {now}, true)  -- with flow keys: the head of its key's line
else
  schedule(id, now + delay, ARGV[6], ARGV[7], grouped() and K_RETRIES or K_SCHEDULED)
end
return 1
