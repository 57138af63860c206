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
-- `levels` (priority levels, nil: all 0): a level n > 0 sorts after level 0 in its
-- key's line ('l<n>' before the position), so a key's turn takes its most urgent event.
local function push_keyed_to(k_ready, k_queued, k_meta, k_lines, k_rot, k_wait, ids, dues, front,
                             levels)
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
    if levels and levels[i] > 0 then p = 'l' .. levels[i] .. p end
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
