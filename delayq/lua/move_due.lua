-- move_due: the scheduler's step for one type, bounded by a batch size.
--
-- KEYS: the ten keys of the type, then groups (see _prelude.lua).
-- ARGV[1] batch: the most ids handled per category in this call
-- ARGV[2] visibility timeout in ms (how long a popped entry may stay unclaimed)
-- ARGV[3] max deliveries: an event whose lease expires after this many
--         deliveries becomes a dead letter instead of going back to ready
-- Returns: {moved, more, next_ms, now_ms, dead, queued, late, missing_id...},
--   or {'stale', group...} when the type has delivery groups: the caller
--   runs group_move.lua with the keys of those groups instead.
--   moved   ids pushed to the ready list (due, lease expired or orphaned)
--   more    1 when a category filled its batch: call again at once
--   next_ms when this type next needs a look (-1: nothing pending)
--   dead    leases that expired on their last delivery
--   queued  ids waiting in the ready list (they need a look now and then:
--           a consumer may die between popping one and claiming it)
--   late    how overdue (ms) the oldest due time or lease deadline handled
--           here was: a standby scheduler reads a large value as "the
--           leader has stopped moving events" (0 when none was handled)
--   missing expired or orphaned ids without an envelope (dropped; the caller
--           logs them; due ids without one are dropped and reported by claim)
-- Guarantees: an id is moved at most once per due time; nothing is lost: an
-- expired lease or an entry popped by a consumer that died before claiming
-- it goes back to the ready list.
if grouped() then return {'stale', unpack(redis.call('HKEYS', K_GROUPS))} end
check_keys(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
keep_working_when_full()
local now = clock_ms()
local batch = tonumber(ARGV[1])
local vt = tonumber(ARGV[2])
local max_deliveries = tonumber(ARGV[3])
local ids, dues, missing = {}, {}, {}
local more, dead, late = 0, 0, 0

local function take(id, due)
  if redis.call('HEXISTS', K_EVENTS, id) == 1 then
    ids[#ids + 1] = id
    dues[#dues + 1] = due
  else
    missing[#missing + 1] = id
  end
end

-- 1. Orphans. Entries with sequence <= pushed - LLEN have left the list; if
-- their id is still in `queued`, no claim has run for them yet. Mark them with
-- the time we noticed (a negative score) and give them back after vt.
local llen = redis.call('LLEN', K_READY)
local pushed = tonumber(redis.call('HGET', K_META, 'pushed')) or 0
local popped_max = pushed - llen
if llen == 0 then popped_max = '+inf' end
local suspects = redis.call('ZRANGEBYSCORE', K_QUEUED, 1, popped_max, 'LIMIT', 0, batch)
for _, id in ipairs(suspects) do
  redis.call('ZADD', K_QUEUED, 'XX', -now, id)
end
if #suspects == batch then more = 1 end
local orphans = redis.call('ZRANGEBYSCORE', K_QUEUED, -(now - vt), '(0', 'LIMIT', 0, batch)
for _, id in ipairs(orphans) do
  redis.call('ZREM', K_QUEUED, id)
  take(id, now)
end
if #orphans == batch then more = 1 end

-- 2. Due events.
-- They are the lowest scores: count them, then pop that many in one call
-- (no ZREM per id); the scores come back as strings, ready for the entries.
local n_due = redis.call('ZCOUNT', K_SCHEDULED, '-inf', now)
if n_due > batch then
  n_due = batch
  more = 1
end
-- No envelope check here (one call per id): claim skips and reports an id
-- whose envelope is gone, which only something other than delayq can cause.
if n_due > 0 then
  local due = redis.call('ZPOPMIN', K_SCHEDULED, n_due)
  late = now - tonumber(due[2])
  local n = #ids
  for i = 1, #due, 2 do
    n = n + 1
    ids[n] = due[i]
    dues[n] = due[i + 1]
  end
end

-- 3. Expired leases: the worker died or stalled past its visibility timeout.
local expired = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', now, 'LIMIT', 0, batch)
if #expired > 0 then
  local deadline = tonumber(redis.call('ZSCORE', K_INFLIGHT, expired[1]))
  if now - deadline > late then late = now - deadline end
end
for _, id in ipairs(expired) do
  redis.call('ZREM', K_INFLIGHT, id)
  redis.call('HDEL', K_LEASES, id)
  redis.call('HSET', K_ERRORS, id,
    'LeaseExpired: the handler neither finished nor renewed its lease (worker died or stalled)')
  local n = tonumber(redis.call('HGET', K_ATTEMPTS, id)) or 0
  if n >= max_deliveries then
    redis.call('ZADD', K_DEAD, now, id)
    dead = dead + 1
  else
    take(id, now)
  end
end
if #expired == batch then more = 1 end

push_ready(ids, dues)

-- When to look again: the earliest due time, lease deadline or orphan check.
local next_ms = nil
local function earliest(t)
  if t and (next_ms == nil or t < next_ms) then next_ms = t end
end
local first = redis.call('ZRANGE', K_SCHEDULED, 0, 0, 'WITHSCORES')
if first[2] then earliest(tonumber(first[2])) end
first = redis.call('ZRANGE', K_INFLIGHT, 0, 0, 'WITHSCORES')
if first[2] then earliest(tonumber(first[2])) end
first = redis.call('ZREVRANGEBYSCORE', K_QUEUED, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if first[2] then earliest(vt - tonumber(first[2])) end
if next_ms == nil then
  redis.call('HDEL', K_META, 'wake')
  next_ms = -1
else
  redis.call('HSET', K_META, 'wake', string.format('%.0f', next_ms))
end

local result = {#ids, more, next_ms, now, dead, redis.call('ZCARD', K_QUEUED), late}
for _, id in ipairs(missing) do result[#result + 1] = id end
return result
