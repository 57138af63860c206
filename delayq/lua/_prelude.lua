-- Prelude: the helpers per-type scripts share. delayq/lua/__init__.py sends each
-- script only the definitions below that it uses (following references), after a
-- header that names its KEYS: `local K_READY = KEYS[i]` for each name of the
-- script's list in delayq/keyspace/scripts.py (SCRIPT_KEYS), which is where every
-- key's position is decided. A per-type script's keys are one delivery group's
-- view of one event type (delayq.keyspace.layout.TypeKeys.named), all under the
-- hash tag {prefix:type}, so a script touches one cluster slot. For the default
-- group they are the type's own keys; for a named group `scheduled` (its
-- retries), ready, queued, inflight, leases, attempts, errors, dead and meta are
-- the group's own, and `events` is the type's shared envelope hash. Beside them:
--   groups    the type's group registry (absent: only the default group)
--   pending   id -> groups still holding a fanned-out event
--   retries   the group's retry schedule once groups exist (for a named group
--             the same key as `scheduled`; for the default group its own zset,
--             since the type's `scheduled` then holds events not yet fanned out)
--   limits    HASH of the group's flow limits (absent: no limits; docs/FLOW.md)
--   wake      LIST of wake-up tokens for consumers waiting for a slot
--   dedup     ZSET 'd:<id>' -> end of its debounce window (ms),
--             'u:<id>' -> refused until (ms), or -ttl while not handled yet
--   fkeys, klines, krot, kwait, krun: flow keys (see below)
-- A caller may leave off a script's trailing keys (a plain enqueue sends no
-- dedup or flow keys): the script sees them as nil.

-- Wakes up to n consumers waiting for a slot of a type with flow limits (they
-- BLPOP the wake list, a second at most): one token each, a few kept for a
-- second, so a token nobody takes costs at most one needless claim.
local function wake_waiters(n)
  local tokens = {}
  for i = 1, math.min(n, 16) do tokens[i] = '1' end
  redis.call('LPUSH', K_WAKE, unpack(tokens))
  redis.call('LTRIM', K_WAKE, 0, 15)
  redis.call('PEXPIRE', K_WAKE, 1000)
end

-- True when the type has named delivery groups (its registry exists). Callers
-- that pass no registry key (delayq.spark's older callers, tests) are ungrouped.
local function grouped()
  return K_GROUPS ~= nil and redis.call('EXISTS', K_GROUPS) == 1
end

-- True when some fanned-out event still has groups counted in `pending`
-- (checked once per call: without groups this is the only extra work).
local function counting()
  return K_PENDING ~= nil and redis.call('EXISTS', K_PENDING) == 1
end

-- A group is done with an event (acked, dead letter purged, group removed):
-- the last group to let go deletes the envelope. An id without a count (moved
-- before the type had groups) has one holder. `counted`: from counting().
local function release(id, counted)
  if counted then
    if redis.call('HINCRBY', K_PENDING, id, -1) > 0 then return end
    redis.call('HDEL', K_PENDING, id)
  end
  redis.call('HDEL', K_EVENTS, id)
end

-- Stops the script before its first write when one of the given keys (by
-- name) holds a value of the wrong Redis type, written by something other
-- than delayq. Redis does not roll a script back: failing half-way on such a
-- key could leave an event in no state at all (stranded). Scripts check the
-- keys they write after their first write; keys read before any write need no
-- check (the read fails first). KEY_OF and KEY_KIND (name -> key, name -> its
-- Redis type) come with the script's header (delayq/keyspace/scripts.py).
-- The error's code (its first word) is WRONGTYPE on every server, as for a
-- command that met such a key (see refuse_wrong_type).
-- Ends the script with a WRONGTYPE error naming `key`. A plain error('WRONGTYPE ...')
-- reaches clients as "ERR WRONGTYPE ..." on Redis 7+ and Valkey; an error table keeps
-- its code there but breaks Redis 6.2's error handler, which wraps a string error
-- as "ERR Error running script (...): @user_script:N: WRONGTYPE ..." instead (code
-- unwrapped by delayq.errors.error_code). REDIS_VERSION_NUM exists from Redis 7.0
-- (and in Valkey).
local function refuse_wrong_type(key, found, expected)
  local message = 'WRONGTYPE delayq key ' .. key .. ' holds a ' .. found .. ', not a ' ..
    expected .. ': something other than delayq wrote it; nothing was changed'
  if redis.REDIS_VERSION_NUM then error(redis.error_reply(message)) end
  error(message, 0)
end

local function check_keys(...)
  for _, name in ipairs({...}) do
    local named_key = KEY_OF[name]
    local found = named_key and redis.call('TYPE', named_key).ok or 'none'
    if found ~= 'none' and found ~= KEY_KIND[name] then
      refuse_wrong_type(named_key, found, KEY_KIND[name])
    end
  end
end

-- At maxmemory (noeviction) Redis refuses a script's first write that may grow
-- memory, unless the script has already written. Scripts that drain the queue
-- (claim, renew, fail, move_due) call this first, so handling what is queued
-- goes on while Redis is full; enqueue does not, and fails before writing.
-- (HDEL of a field that never exists: a write that changes nothing.)
local function keep_working_when_full()
  redis.call('HDEL', K_META, '-')
end

-- Redis's own clock decides every due time and lease: client clocks may be off.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Appends ids to the ready list, first id first out, and records each in
-- `queued` with the next sequence numbers. Entries are "<due ms>:<id>" so a
-- consumer can measure lateness. Because the list is only pushed on the left
-- and popped on the right, `pushed - LLEN` tells which sequence numbers have
-- been popped: that is how move_due finds entries a dead consumer popped.
local function push_plain_to(k_ready, k_queued, k_meta, ids, dues)
  local n = #ids
  if n == 0 then return end
  local seq = redis.call('HINCRBY', k_meta, 'pushed', n) - n
  local entries, scored = {}, {}
  for i = 1, n do
    -- due times read back from a sorted set are already whole-ms strings
    local due = dues[i]
    if type(due) ~= 'string' or not string.find(due, '^%d+$') then
      due = string.format('%.0f', due)
    end
    entries[i] = due .. ':' .. ids[i]
    scored[2 * i - 1] = seq + i
    scored[2 * i] = ids[i]
  end
  redis.call('LPUSH', k_ready, unpack(entries))
  redis.call('ZADD', k_queued, unpack(scored))
end

-- Flow keys (docs/FLOW.md, "Flow keys"). Once an event of the type has been
-- enqueued with a key, a group's ready list holds one *marker* entry
-- 'k:<key>' per key in rotation instead of events; the events wait in their
-- key's line. Five more keys (the last four per group, like the ready list):
--   fkeys   HASH id -> its key (keyed events only; none: the key ''), and
--                    '' -> 1 once the type uses keys (ids are never empty)
--   klines  ZSET score 0: '<key>\0<pos>\0<due ms>:<id>', each key's line in
--                    lexical order (pos: 'b' + 15 digits counting up at the back,
--                    'a' + 15 digits counting down at the front); keys have no NUL
--   krot    ZSET key -> push sequence of its marker in the ready list (or
--                    -ms when noticed popped but unclaimed, as in `queued`)
--   kwait   ZSET key -> when a key parked by a per-key limit goes back
--   krun    ZSET score 0: '<key>\0<id>' the key's deliveries (only while a
--                    per-key concurrency limit is set)
-- An event in a key's line is in `queued` with score 0: stale entries are
-- skipped, counts include it, and the orphan check of the ready list ignores it.
-- Group scripts (_groups.lua) pass each group's own to the functions below.
local KEYED = nil
-- True once the type uses flow keys (one EXISTS per script call, cached)
local function keyed_type()
  if KEYED == nil then KEYED = K_FKEYS ~= nil and redis.call('EXISTS', K_FKEYS) == 1 end
  return KEYED
end
local function is_marker(entry) return string.byte(entry, 1) == 107 end  -- 'k'
-- the fk of a claim token "<n>|<fk>" (nil for an unkeyed delivery)
local function token_key(token)
  local sep = string.find(token, '|', 1, true)
  return sep and string.sub(token, sep + 1)
end
-- lexical bounds of one fk's members in klines and krun
local function key_range(fk)
  return '[' .. fk .. '\0', '(' .. fk .. '\1'
end

-- Puts a fk's marker at the back of the line of a ready list (the fk must
-- not be in rotation or parked: the callers check).
local function push_marker(k_ready, k_meta, k_rot, fk)
  local seq = redis.call('HINCRBY', k_meta, 'pushed', 1)
  redis.call('LPUSH', k_ready, 'k:' .. fk)
  redis.call('ZADD', k_rot, seq, fk)
end

-- Brings a fk with events into rotation unless it is in rotation or parked.
local function activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk)
  if redis.call('ZSCORE', k_rot, fk) or redis.call('ZSCORE', k_wait, fk) then return end
  local lo, hi = key_range(fk)
  if redis.call('ZLEXCOUNT', k_lines, lo, hi) == 0 then return end
  push_marker(k_ready, k_meta, k_rot, fk)
end

-- Ids to their keys' lines (the fk from fkeys; none: ''), in order, and their
-- keys into rotation. `front`: at the head of the fk's line (an expired
-- lease: it was due before what waits there, so per-fk order holds).
local function push_keyed_to(k_ready, k_queued, k_meta, k_lines, k_rot, k_wait, ids, dues, front)
  local n = #ids
  local pos = redis.call('HINCRBY', k_meta, front and 'kfront' or 'kback', n) - n
  local keys, members, scored, order, seen = {}, {}, {}, {}, {}
  for i = 1, n, 1000 do
    local got = redis.call('HMGET', K_FKEYS, unpack(ids, i, math.min(n, i + 999)))
    for j = 1, #got do keys[i + j - 1] = got[j] or '' end
  end
  for i = 1, n do
    local due = dues[i]
    if type(due) ~= 'string' or not string.find(due, '^%d+$') then
      due = string.format('%.0f', due)
    end
    -- at the front, later pushes sort first (1e15 - pos counts down)
    local p = front and string.format('a%015.0f', 1e15 - pos - i) or string.format('b%015.0f', pos + i)
    members[#members + 1] = 0
    members[#members + 1] = keys[i] .. '\0' .. p .. '\0' .. due .. ':' .. ids[i]
    scored[#scored + 1] = 0
    scored[#scored + 1] = ids[i]
    if not seen[keys[i]] then
      seen[keys[i]] = true
      order[#order + 1] = keys[i]
    end
  end
  for i = 1, #members, 2000 do
    redis.call('ZADD', k_lines, unpack(members, i, math.min(#members, i + 1999)))
    redis.call('ZADD', k_queued, unpack(scored, i, math.min(#scored, i + 1999)))
  end
  for _, fk in ipairs(order) do activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk) end
end

-- Appends ids to a group's ready list (see push_plain_to), or with flow keys
-- to their keys' lines. k_lines, k_rot, k_wait: the group's flow-key state
-- (nil for a call without them: its events skip the rotation).
local function push_ready_to(k_ready, k_queued, k_meta, ids, dues, front, k_lines, k_rot, k_wait)
  if #ids > 0 and k_lines and keyed_type() then
    push_keyed_to(k_ready, k_queued, k_meta, k_lines, k_rot, k_wait, ids, dues, front)
  else
    push_plain_to(k_ready, k_queued, k_meta, ids, dues)
  end
end

local function push_ready(ids, dues, front)
  push_ready_to(K_READY, K_QUEUED, K_META, ids, dues, front, K_KLINES, K_KROT, K_KWAIT)
end

-- A keyed delivery ended (ack, fail): its per-fk slot is free, and a fk
-- parked by its per-fk concurrency limit goes back into rotation (when
-- `unpark`). The envelope gone, its fk goes too.
local function key_done(id, token, unpark)
  local fk = token_key(token)
  if not fk or not K_KLINES then return end
  redis.call('ZREM', K_KRUN, fk .. '\0' .. id)
  if redis.call('HEXISTS', K_EVENTS, id) == 0 then redis.call('HDEL', K_FKEYS, id) end
  if unpark and redis.call('ZREM', K_KWAIT, fk) == 1 then
    activate_key(K_READY, K_META, K_KLINES, K_KROT, K_KWAIT, fk)
  end
end

-- The scheduler's steps on one delivery list, shared by move_due.lua (a type's
-- lists) and group_move.lua (each group's). `take(id, due)` collects an id to push
-- back to the ready list. Each step returns whether it filled its batch (then the
-- caller says "more": call again at once).

-- A function (id, due) that keeps the pair in into_ids/into_dues when the event
-- is stored, else notes the id in missing (move_due and group_move).
local function taker(into_ids, into_dues, missing)
  local function take(id, due)
    if redis.call('HEXISTS', K_EVENTS, id) == 1 then
      into_ids[#into_ids + 1] = id
      into_dues[#into_dues + 1] = due
    else
      missing[#missing + 1] = id
    end
  end
  return take
end

-- Orphans. Entries with sequence <= pushed - LLEN have left the list; if their
-- id is still in `queued`, no claim has run for them yet. They are marked with
-- the time they were noticed (a negative score) and given back after vt.
local function recover_orphans(k_ready, k_queued, k_meta, now, vt, batch, take)
  local llen = redis.call('LLEN', k_ready)
  local pushed = tonumber(redis.call('HGET', k_meta, 'pushed')) or 0
  local popped_max = pushed - llen
  if llen == 0 then popped_max = '+inf' end
  local suspects = redis.call('ZRANGEBYSCORE', k_queued, 1, popped_max, 'LIMIT', 0, batch)
  for _, id in ipairs(suspects) do
    redis.call('ZADD', k_queued, 'XX', -now, id)
  end
  local orphans = redis.call('ZRANGEBYSCORE', k_queued, -(now - vt), '(0', 'LIMIT', 0, batch)
  for _, id in ipairs(orphans) do
    redis.call('ZREM', k_queued, id)
    take(id, now)
  end
  return #suspects == batch or #orphans == batch
end

-- The same for the markers of a keyed ready list (their pushes are counted in
-- the same `pushed`), and keys parked by a per-key limit whose time has come
-- (a rate token is due, or the lease that held the key's slot ran out: an ack
-- or failure puts them back sooner). Returns whether it filled a batch.
local function recover_keys(k_ready, k_meta, k_lines, k_rot, k_wait, now, vt, batch)
  local llen = redis.call('LLEN', k_ready)
  local popped_max = (tonumber(redis.call('HGET', k_meta, 'pushed')) or 0) - llen
  if llen == 0 then popped_max = '+inf' end
  local suspects = redis.call('ZRANGEBYSCORE', k_rot, 1, popped_max, 'LIMIT', 0, batch)
  for _, fk in ipairs(suspects) do redis.call('ZADD', k_rot, 'XX', -now, fk) end
  local orphans = redis.call('ZRANGEBYSCORE', k_rot, -(now - vt), '(0', 'LIMIT', 0, batch)
  for _, fk in ipairs(orphans) do
    redis.call('ZREM', k_rot, fk)
    activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk)
  end
  local due = redis.call('ZRANGEBYSCORE', k_wait, '-inf', now, 'LIMIT', 0, batch)
  for _, fk in ipairs(due) do
    redis.call('ZREM', k_wait, fk)
    activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk)
  end
  return #suspects == batch or #orphans == batch or #due == batch
end

-- When a keyed ready list next needs a look: a parked fk's time, a marker's
-- orphan check.
local function keyed_looks(k_rot, k_wait, vt, earliest)
  local first = redis.call('ZRANGE', k_wait, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZREVRANGEBYSCORE', k_rot, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then earliest(vt - tonumber(first[2])) end
end

-- Due ids of a schedule: the lowest scores, counted, then popped in one call
-- (no ZREM per id); the scores come back as strings, ready for the entries.
-- Appends them to ids/dues; returns (full, how late the oldest was in ms).
local function pop_due(k_sched, now, batch, ids, dues)
  local n_due = redis.call('ZCOUNT', k_sched, '-inf', now)
  local full = n_due > batch
  if full then n_due = batch end
  if n_due == 0 then return full, 0 end
  local due = redis.call('ZPOPMIN', k_sched, n_due)
  local n = #ids
  for i = 1, #due, 2 do
    n = n + 1
    ids[n] = due[i]
    dues[n] = due[i + 1]
  end
  return full, now - tonumber(due[2])
end

-- Expired leases: the worker died or stalled past its visibility timeout. A
-- lease that expires on the last allowed delivery makes a dead letter; the
-- others are taken back. Returns (full, how late the oldest deadline was, dead).
local function expire_leases(k_inflight, k_leases, k_errors, k_attempts, k_dead,
                             now, batch, max_deliveries, take)
  local expired = redis.call('ZRANGEBYSCORE', k_inflight, '-inf', now, 'LIMIT', 0, batch)
  local late, dead = 0, 0
  if #expired > 0 then
    late = now - tonumber(redis.call('ZSCORE', k_inflight, expired[1]))
  end
  for _, id in ipairs(expired) do
    redis.call('ZREM', k_inflight, id)
    redis.call('HDEL', k_leases, id)
    redis.call('HSET', k_errors, id,
      'LeaseExpired: the handler neither finished nor renewed its lease (worker died or stalled)')
    local n = tonumber(redis.call('HGET', k_attempts, id)) or 0
    if n >= max_deliveries then
      redis.call('ZADD', k_dead, now, id)
      dead = dead + 1
    else
      take(id, now)
    end
  end
  return #expired == batch, late, dead
end

-- When a delivery list next needs a look: its earliest due time, lease
-- deadline or orphan check, each passed to earliest(t).
local function next_looks(k_sched, k_inflight, k_queued, vt, earliest)
  local first = redis.call('ZRANGE', k_sched, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZRANGE', k_inflight, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZREVRANGEBYSCORE', k_queued, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then earliest(vt - tonumber(first[2])) end
end

-- Adds id to the schedule. When it becomes earlier than the time the scheduler
-- last said it would look at this type again, publishes a wake-up. Pub/sub only
-- makes moves faster; the scheduler's timed sweep is what guarantees them.
local function schedule(id, due, channel, type_name, k_scheduled)
  redis.call('ZADD', k_scheduled or K_SCHEDULED, due, id)
  local wake = tonumber(redis.call('HGET', K_META, 'wake'))
  if wake == nil or due < wake then
    redis.call('HSET', K_META, 'wake', string.format('%.0f', due))
    redis.call('PUBLISH', channel, type_name)
  end
end
