-- dead_requeue: give dead letters a fresh start.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `attempts`,
--   `errors`, `dead`, `meta`, `groups`, `retries`, `fkeys`, `klines`, `krot`, `kwait` of the
--   type or one group's view (see _prelude.lua).
--   then `prio`, then the priority levels' ready lists `ready_1` `ready_2` `ready_3`
--   `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua)
-- ARGV[1] delay in ms, ARGV[2] wake-up channel, ARGV[3] type name
-- ARGV[4..] ids
-- Returns: how many dead letters were requeued.
-- Guarantees: each requeued event is scheduled with its attempt count and
-- last error reset; ids that are not dead letters are left alone; a dead
-- letter without an envelope (written by someone else) is dropped.
check_keys('events', 'scheduled', 'ready', 'queued', 'attempts', 'errors', 'dead', 'meta', 'retries')
local now = clock_ms()
local delay = tonumber(ARGV[1])
local k_sched = grouped() and K_RETRIES or K_SCHEDULED  -- with groups: this group alone
local ready_ids, ready_dues = {}, {}
local n = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DEAD, id) == 1 then
    redis.call('HDEL', K_ATTEMPTS, id)
    redis.call('HDEL', K_ERRORS, id)
    if redis.call('HEXISTS', K_EVENTS, id) == 1 then
      n = n + 1
      if delay <= 0 then
        ready_ids[#ready_ids + 1] = id
        ready_dues[#ready_dues + 1] = now
      else
        schedule(id, now + delay, ARGV[2], ARGV[3], k_sched)
      end
    end
  end
end
push_ready(ready_ids, ready_dues)
return n
