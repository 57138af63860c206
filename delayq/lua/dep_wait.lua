-- dep_wait: add events that wait for parents (enqueue_*(..., after=[...])), the first
-- step of registering their edges.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `meta`, `dedup`, `deps`, `relay`, `waiting`
--   of the child's type (shard).
-- ARGV[1] 'delay' (times are ms from now on Redis's clock) or 'at' (unix ms)
-- ARGV[2] the policy when a parent fails: 'fail', 'run' or 'skip'
-- ARGV[3] ms until the first audit (the relay links the edges again then, in case the
--         caller died before linking them)
-- ARGV[4] cmsgpack array: parent type, parent id, ... (no pair twice)
-- ARGV[5..] triples: id, envelope, time
-- Returns: one code per event: 1 added (waiting), 0 kept (an event with that id exists:
--   its own dependencies, if any, stay as they were). The same call again (a lost reply)
--   answers 1 for the events it added.
-- Guarantees: a child is written whole (envelope, waiting entry, record, every edge
-- waiting, its audit) or not at all, before any parent learns of it: a caller that dies
-- after this step leaves a child the audit links (see _deps.lua); one that dies before
-- leaves nothing. A waiting child is in no schedule: nothing delivers it until its last
-- parent is done (dep_apply.lua).
check_keys('events', 'meta', 'dedup', 'deps', 'relay', 'waiting')
local now = clock_ms()
local absolute = ARGV[1] == 'at'
local policy, grace = ARGV[2], tonumber(ARGV[3])
local parents = cmsgpack.unpack(ARGV[4])
local codes, marked = {}, false
for i = 5, #ARGV, 3 do
  local id, envelope, t = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local due = t
  if not absolute then due = now + t end
  local existing = redis.call('HGET', K_EVENTS, id)
  if existing == envelope and redis.call('ZSCORE', K_WAITING, id) then
    codes[#codes + 1] = 1
  elseif existing then
    codes[#codes + 1] = 0
  else
    if not marked then dep_mark() marked = true end  -- its acks now handle edges
    redis.call('HSET', K_EVENTS, id, envelope)
    redis.call('ZADD', K_WAITING, due, id)
    local rec = {policy, now}
    local fields = {}
    for j = 1, #parents, 2 do
      rec[#rec + 1] = parents[j]
      rec[#rec + 1] = parents[j + 1]
      fields[#fields + 1] = 'e:' .. id .. '\0' .. parents[j] .. '\0' .. parents[j + 1]
      fields[#fields + 1] = ''
    end
    redis.call('HSET', K_DEPS, 'w:' .. id, cmsgpack.pack(rec), 'n:' .. id, #parents / 2)
    for j = 1, #fields, 1000 do
      redis.call('HSET', K_DEPS, unpack(fields, j, math.min(#fields, j + 999)))
    end
    redis.call('ZADD', K_RELAY, now + grace, 'a\0' .. id)
    codes[#codes + 1] = 1
  end
end
return codes
