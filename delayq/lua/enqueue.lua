-- enqueue: add events of one type, or find them already there.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `inflight`,
--   `leases`, `attempts`, `errors`, `dead`, `meta`, `groups`, `pending`, `retries`, `dedup`,
--   `fkeys`, `klines`, `krot`, `kwait`, `prio` and the levels' ready lists `ready_1`
--   `ready_2` `ready_3` `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` of the
--   type (see _prelude.lua, _levels.lua), then `waiting`; a plain keep-first enqueue
--   sends them up to retries, a flow key or priority level up to `ready_9`, a replace
--   or dedup mode all.
-- ARGV[1]  'delay' (times are ms from now on Redis's clock) or 'at' (unix ms);
--          with ':mp' appended the triples come packed in ARGV[5] and ARGV[6]
--          (two arguments per call instead of three per event: cheaper to send);
--          with ':mpk' packed as quads id, time, envelope length, flow key ('':
--          none), and the type becomes keyed (docs/FLOW.md, "Flow keys");
--          with ':mpp' (or ':mpkp', after the flow key) one more element per
--          event: its priority level 0..9 (_levels.lua; a replace without one
--          puts the event back at level 0); with ':p' (unpacked, the Spark
--          writers') ARGV[5..] are quads id, envelope, time, priority level
-- ARGV[2]  '1' to replace an existing event with the same id, '0' to keep it,
--          'd<ms>' to debounce (max wait ms), 'u<ms>' for unique-for (ttl ms);
--          optionally followed by ':<call id>:<chunk no>' (a hex id per client
--          call, chunks 1..n)
-- ARGV[3]  wake-up channel, ARGV[4] type name
-- ARGV[5..] triples: id, envelope, time; or with ':mp': ARGV[5] a MessagePack
--          array id, time, envelope length, ... and ARGV[6] the envelopes joined
-- Returns: one code per event: 1 added, 0 kept (an event with that id exists),
--          2 replaced, 3 not written: a replace of an event already fanned out
--          to delivery groups (the caller runs group_replace.lua with the keys
--          of every group). A replace of a child waiting for its parents
--          (docs/WORKFLOWS.md, "Dependencies") changes its envelope only (stored
--          behind the byte 0xC1 that marks it as a child: delayq/codec.py): it
--          stays waiting, and its parents' completion schedules it (code 2).
-- Guarantees: payload, context and due time of an id change together or not
-- at all. An envelope identical to the stored one counts as added when this
-- is the same call retried after a lost reply: the call id in ARGV[2] tells a
-- retry (this chunk already ran) from a new call that happens to encode the
-- same bytes (same event in the same ms), which is kept like any other.
-- Without a call id, identical means retried. Due times at or before now go
-- straight to the ready list, or, once the type has delivery groups, to the
-- schedule at their due time (the scheduler fans them out: enqueue costs the
-- same whatever the number of groups).
-- Dedup modes (docs/FLOW.md), only when ARGV[2] asks (the plain path is
-- unchanged): 'd' debounce = a replace whose due time never passes the end
-- of the id's window (its first enqueue + max wait, `d:<id>` in dedup);
-- 'u' unique-for = keep-first, and refused while `u:<id>` in dedup holds a
-- time after now (set by ack.lua to handled + ttl from the pending -ttl
-- written here). Expired dedup entries are pruned, 100 per call.
check_keys('scheduled', 'ready', 'queued', 'meta')
local dmode = string.sub(ARGV[2], 1, 1)
if dmode == '1' or dmode == 'd' then check_keys('inflight', 'leases', 'attempts', 'errors', 'dead') end  -- replace: the rest
local now = clock_ms()
local mode, items, first = ARGV[1], ARGV, 5
local ikeys = nil  -- flow keys, by event number ('' for none), with ':mpk'
local ilevels = nil  -- priority levels, by event number, with ':mpp' or ':mpkp'
local packing = string.match(mode, ':mp(k?p?)$')
if packing and packing ~= '' then
  -- as ':mp' below, with one more element per event: its flow key ('k'), then one
  -- more: its priority level ('p')
  local width = 3 + #packing
  local packed, blob, pos = cmsgpack.unpack(ARGV[5]), ARGV[6], 1
  mode, items, first = string.sub(mode, 1, -(4 + #packing)), {}, 1
  if string.find(packing, 'k', 1, true) then ikeys = {} end
  if string.find(packing, 'p', 1, true) then ilevels = {} end
  local n = 0
  for j = 1, #packed, width do
    local next_pos = pos + packed[j + 2]
    items[n + 1], items[n + 2], items[n + 3] = packed[j], string.sub(blob, pos, next_pos - 1), packed[j + 1]
    n = n + 3
    if ikeys then ikeys[#ikeys + 1] = packed[j + 3] end
    if ilevels then ilevels[#ilevels + 1] = tonumber(packed[j + width - 1]) end
    pos = next_pos
  end
elseif string.sub(mode, -2) == ':p' then
  -- unpacked quads: id, envelope, time, priority level
  mode, items, first, ilevels = string.sub(mode, 1, -3), {}, 1, {}
  for j = 5, #ARGV, 4 do
    items[#items + 1], items[#items + 2], items[#items + 3] = ARGV[j], ARGV[j + 1], ARGV[j + 2]
    ilevels[#ilevels + 1] = tonumber(ARGV[j + 3])
  end
elseif string.sub(mode, -3) == ':mp' then
  -- ARGV[5]: MessagePack [id, time, envelope length, ...]; ARGV[6]: the
  -- envelopes back to back (Redis's cmsgpack has no binary type for them)
  local packed, blob, pos = cmsgpack.unpack(ARGV[5]), ARGV[6], 1
  mode, items, first = string.sub(mode, 1, -4), {}, 1
  for j = 1, #packed, 3 do
    local next_pos = pos + packed[j + 2]
    items[j], items[j + 1], items[j + 2] = packed[j], string.sub(blob, pos, next_pos - 1), packed[j + 1]
    pos = next_pos
  end
end
local fan = grouped()
local absolute = mode == 'at'
local replace = dmode == '1' or dmode == 'd'
local dms
if dmode == 'd' or dmode == 'u' then
  dms = tonumber(string.match(ARGV[2], '^[du](%d+)'))
  local expired = redis.call('ZRANGEBYSCORE', K_DEDUP, 0, now, 'LIMIT', 0, 100)
  if #expired > 0 then redis.call('ZREM', K_DEDUP, unpack(expired)) end
end
local channel, type_name = ARGV[3], ARGV[4]
local codes, ready_ids, ready_dues = {}, {}, {}
local retried, written = true, {}
local call, chunk = string.match(ARGV[2], '^%w+:(%x+):(%d+)$')
if call then
  local last_call, last_chunk = string.match(redis.call('HGET', K_META, 'enqueue') or '',
    '^(%x+):(%d+)$')
  retried = last_call == call and tonumber(last_chunk) >= tonumber(chunk)
  if not retried then redis.call('HSET', K_META, 'enqueue', call .. ':' .. chunk) end
end

-- The writes of new events are gathered and sent as one HSET and one ZADD
-- (far cheaper than two calls per event); `written` keeps what this call has
-- written so far, so an id that comes twice sees its first write. The wake
-- mark is read once and published at most once.
local envs, sched = {}, {}
local lids, lvls = {}, {}  -- written ids and their levels (priority levels, _levels.lua)
local mark = redis.call('HMGET', K_META, 'wake', 'keyed')
local wake = tonumber(mark[1])
local woken = false
-- Flow keys (docs/FLOW.md): the first keyed enqueue makes the type keyed (its
-- ready events then wait in their keys' lists); fkeys maps a keyed id to its key.
-- A call without the keyed keys (a plain enqueue sends 13) schedules the
-- events of a keyed type at their due time instead, for move_due to route.
local keyed = mark[2] == '1'
if ikeys and not keyed then
  redis.call('HSET', K_META, 'keyed', '1')
  redis.call('HSET', K_FKEYS, '', '1')  -- keyed_type() in _prelude.lua
  keyed = true
end
local to_schedule = fan or (keyed and not K_KLINES)
local fkeys, unkeyed = {}, {}
local function flush()
  if #envs > 0 then redis.call('HSET', K_EVENTS, unpack(envs)) end
  if #lids > 0 then set_levels(lids, lvls) end
  if #sched > 0 then redis.call('ZADD', K_SCHEDULED, unpack(sched)) end
  if #fkeys > 0 then redis.call('HSET', K_FKEYS, unpack(fkeys)) end
  if #unkeyed > 0 and K_FKEYS then redis.call('HDEL', K_FKEYS, unpack(unkeyed)) end
  envs, sched, fkeys, unkeyed, lids, lvls = {}, {}, {}, {}, {}, {}
end

-- A replace of a child waiting for its parents (after=[...]) keeps it waiting; the
-- waiting set is read only when the type has one (one EXISTS per replace call).
local any_waiting = nil
local AFTER_PREFIX = '\193'
local function is_waiting(id)
  if any_waiting == nil then any_waiting = redis.call('EXISTS', K_WAITING) == 1 end
  return any_waiting and redis.call('ZSCORE', K_WAITING, id) ~= false
end

-- What is stored under each id, read in a few HMGETs rather than one HGET per
-- event (each redis.call costs about a microsecond of its own)
local stored = {}
for i = first, #items, 3000 do
  local ids = {}
  for j = i, math.min(#items, i + 2999), 3 do ids[#ids + 1] = items[j] end
  local got = redis.call('HMGET', K_EVENTS, unpack(ids))
  for j = 1, #ids do stored[#stored + 1] = got[j] end
end

for i = first, #items, 3 do
  local id, envelope, t = items[i], items[i + 1], tonumber(items[i + 2])
  local due = t
  if not absolute then due = now + t end
  local code = 1
  local existing = written[id]
  if existing == nil then existing = stored[(i - first) / 3 + 1] end
  local refused, held = false, false
  if dmode == 'd' and not (existing == envelope and retried and not written[id]) then
    local key = 'd:' .. id
    local cap = tonumber(redis.call('ZSCORE', K_DEDUP, key))
    if cap == nil and existing then
      -- no open window: an event due but not moved yet keeps its time, and one
      -- waiting in the ready list stays due now (its window is over); otherwise
      -- this enqueue opens one
      local s = tonumber(redis.call('ZSCORE', K_SCHEDULED, id))
      if s and s <= now then cap = s
      elseif s == nil and redis.call('ZSCORE', K_QUEUED, id) then cap = now end
    end
    if cap == nil then
      cap = now + dms
      redis.call('ZADD', K_DEDUP, cap, key)
    end
    if due > cap then due = cap end
  elseif dmode == 'u' and not existing then
    local key = 'u:' .. id
    local until_ms = tonumber(redis.call('ZSCORE', K_DEDUP, key))
    if until_ms and until_ms > now then
      refused = true  -- handled less than ttl ago
    else
      redis.call('ZADD', K_DEDUP, -dms, key)  -- ack.lua turns it into handled + ttl
    end
  end
  if refused then
    code = 0
  elseif existing == envelope and retried and not written[id] then
    code = -1
  elseif existing then
    if replace and fan and redis.call('HEXISTS', K_PENDING, id) == 1 then
      code = 3  -- every group's state must change: group_replace.lua does it
    elseif replace and K_WAITING and is_waiting(id) then
      -- a child waiting for its parents (docs/WORKFLOWS.md): only its envelope changes,
      -- prefixed with the byte that tells its consumer to read its parents (delayq/codec.py:
      -- the replacing envelope may lack the after=[...] mark in its context)
      held = true
      envelope = AFTER_PREFIX .. envelope
      code = 2
    elseif replace then
      -- this call's own earlier write of the id must land before it is undone
      if written[id] then flush() end
      -- forget every trace of the old delivery; a running handler's ack
      -- becomes stale and is ignored
      forget_delivery(id)
      if K_RETRIES then redis.call('ZREM', K_RETRIES, id) end
      redis.call('ZREM', K_DEAD, id)
      code = 2
    else
      code = 0
    end
  end
  if code ~= 0 and code ~= 3 then written[id] = envelope end
  if code > 0 and code ~= 3 then
    envs[#envs + 1] = id
    envs[#envs + 1] = envelope
    -- a level given, or a replace (its level may go back to 0): the level is recorded
    local level = ilevels and ilevels[(i - first) / 3 + 1] or 0
    if level > 0 or (existing and K_PRIO) then
      lids[#lids + 1] = id
      lvls[#lvls + 1] = level
    end
    local fk = ikeys and ikeys[(i - first) / 3 + 1] or ''
    if fk ~= '' then
      fkeys[#fkeys + 1] = id
      fkeys[#fkeys + 1] = fk
    elseif keyed and existing then
      unkeyed[#unkeyed + 1] = id  -- replaced by an event without a key
    end
    if held then
      -- stays waiting: its parents' last completion schedules it (dep_apply.lua)
    elseif due <= now and not to_schedule then
      ready_ids[#ready_ids + 1] = id
      ready_dues[#ready_dues + 1] = due
    else
      sched[#sched + 1] = due
      sched[#sched + 1] = id
      if wake == nil or due < wake then
        wake = due
        woken = true
      end
    end
    if #envs >= 2000 then flush() end  -- keeps unpack() far below Lua's stack limit
  end
  codes[#codes + 1] = math.abs(code)
end
flush()
if woken then
  -- an earlier due time than the scheduler planned to look: wake it (see schedule())
  redis.call('HSET', K_META, 'wake', string.format('%.0f', wake))
  redis.call('PUBLISH', channel, type_name)
end
push_ready(ready_ids, ready_dues)
return codes
