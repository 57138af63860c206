-- enqueue: add events of one type, or find them already there.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV[1]  'delay' (times are ms from now on Redis's clock) or 'at' (unix ms)
-- ARGV[2]  '1' to replace an existing event with the same id, else '0'; optionally
--          followed by ':<call id>:<chunk no>' (a hex id per client call, chunks 1..n)
-- ARGV[3]  wake-up channel, ARGV[4] type name
-- ARGV[5..] triples: id, envelope, time
-- Returns: one code per event: 1 added, 0 kept (an event with that id exists),
--          2 replaced.
-- Guarantees: payload, context and due time of an id change together or not
-- at all. An envelope identical to the stored one counts as added when this
-- is the same call retried after a lost reply: the call id in ARGV[2] tells a
-- retry (this chunk already ran) from a new call that happens to encode the
-- same bytes (same event in the same ms), which is kept like any other.
-- Without a call id, identical means retried. Due times at or before now go
-- straight to the ready list.
check_keys(2, 3, 4, 10)  -- scheduled, ready, queued, meta
if string.sub(ARGV[2], 1, 1) == '1' then check_keys(5, 6, 7, 8, 9) end  -- replace: the rest
local now = clock_ms()
local absolute = ARGV[1] == 'at'
local replace = string.sub(ARGV[2], 1, 1) == '1'
local channel, type_name = ARGV[3], ARGV[4]
local codes, ready_ids, ready_dues = {}, {}, {}
local retried, written = true, {}
local call, chunk = string.match(ARGV[2], '^%d:(%x+):(%d+)$')
if call then
  local last_call, last_chunk = string.match(redis.call('HGET', K_META, 'enqueue') or '',
    '^(%x+):(%d+)$')
  retried = last_call == call and tonumber(last_chunk) >= tonumber(chunk)
  if not retried then redis.call('HSET', K_META, 'enqueue', call .. ':' .. chunk) end
end

for i = 5, #ARGV, 3 do
  local id, envelope, t = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local due = t
  if not absolute then due = now + t end
  local code = 1
  local existing = redis.call('HGET', K_EVENTS, id)
  if existing == envelope and retried and not written[id] then
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
  if code ~= 0 then written[id] = true end
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
