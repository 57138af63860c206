-- enqueue: add events of one type, or find them already there.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV[1]  'delay' (times are ms from now on Redis's clock) or 'at' (unix ms)
-- ARGV[2]  '1' to replace an existing event with the same id, else '0'
-- ARGV[3]  wake-up channel, ARGV[4] type name
-- ARGV[5..] triples: id, envelope, time
-- Returns: one code per event: 1 added, 0 kept (an event with that id exists),
--          2 replaced.
-- Guarantees: payload, context and due time of an id change together or not
-- at all. An envelope identical to the stored one counts as added: it is this
-- very call, retried after a lost reply. Due times at or before now go
-- straight to the ready list.
local now = clock_ms()
local absolute = ARGV[1] == 'at'
local replace = ARGV[2] == '1'
local channel, type_name = ARGV[3], ARGV[4]
local codes, ready_ids, ready_dues = {}, {}, {}

for i = 5, #ARGV, 3 do
  local id, envelope, t = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local due = t
  if not absolute then due = now + t end
  local code = 1
  local existing = redis.call('HGET', K_EVENTS, id)
  if existing == envelope then
    code = -1
  elseif existing then
    if replace then
      -- forget every trace of the old delivery; a running handler's ack
      -- becomes stale and is ignored
      redis.call('ZREM', K_SCHEDULED, id)
      redis.call('ZREM', K_QUEUED, id)
      redis.call('ZREM', K_INFLIGHT, id)
      redis.call('ZREM', K_DEAD, id)
      redis.call('HDEL', K_LEASES, id)
      redis.call('HDEL', K_ATTEMPTS, id)
      redis.call('HDEL', K_ERRORS, id)
      code = 2
    else
      code = 0
    end
  end
  if code > 0 then
    redis.call('HSET', K_EVENTS, id, envelope)
    if due <= now then
      ready_ids[#ready_ids + 1] = id
      ready_dues[#ready_dues + 1] = due
    else
      schedule(id, due, channel, type_name)
    end
  end
  codes[#codes + 1] = math.abs(code)
end
push_ready(ready_ids, ready_dues)
return codes
