-- move_due: the scheduler's step for one type, bounded by a batch size.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `inflight`,
--   `leases`, `attempts`, `errors`, `dead`, `meta`, `groups`, `fkeys`, `klines`, `krot`,
--   `kwait` of the type or one group's view (see _prelude.lua).
--   then `prio`, then the priority levels' ready lists `ready_1` `ready_2` `ready_3`
--   `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua), then
--   `deps`, `relay` (only for a type with dependencies, see step 3)
-- ARGV[1] batch: the most ids handled per category in this call
-- ARGV[2] visibility timeout in ms (how long a popped entry may stay unclaimed)
-- ARGV[3] max deliveries: an event whose lease expires after this many
--         deliveries becomes a dead letter instead of going back to ready
-- Returns: {moved, more, next_ms, now_ms, dead, queued, late, missing_id...},
--   or {'stale', group...} when the type has delivery groups: the caller
--   runs group_move.lua with the keys of those groups instead.
--   moved   ids pushed to the ready list (due, lease expired or orphaned)
--   more    1 when a category filled its batch: call again at once; 2: call again
--           at once with `deps` and `relay` (the type has dependencies, step 3)
--   next_ms when this type next needs a look (-1: nothing pending)
--   dead    leases that expired on their last delivery
--   queued  ids waiting in the ready list (they need a look now and then:
--           a consumer may die between popping one and claiming it)
--   late    how overdue (ms) the oldest due time or lease deadline handled
--           here was: a standby scheduler reads a large value as "the
--           leader has stopped moving events" (0 when none was handled)
--   missing expired or orphaned ids without an envelope (dropped; the caller
--           logs them; due ids without one are dropped and reported by claim)
-- With flow keys (docs/FLOW.md) due ids go to their keys' lists, expired
-- leases to the head of theirs, and keys come back into rotation: their
-- marker was popped by a consumer that died, or their per-key limit's time
-- has come.
-- Guarantees: an id is moved at most once per due time; nothing is lost: an
-- expired lease or an entry popped by a consumer that died before claiming
-- it goes back to the ready list.
if grouped() then return {'stale', unpack(redis.call('HKEYS', K_GROUPS))} end
check_keys('events', 'scheduled', 'ready', 'queued', 'inflight', 'leases', 'attempts', 'errors', 'dead', 'meta')
keep_working_when_full()
local now = clock_ms()
local batch = tonumber(ARGV[1])
local vt = tonumber(ARGV[2])
local max_deliveries = tonumber(ARGV[3])
local ids, dues, missing = {}, {}, {}
local more, dead, late = 0, 0, 0

local take = taker(ids, dues, missing)

-- Expired leases of a keyed type go to the head of their key's line (per-key
-- order: they were due before what waits there); otherwise with the rest.
local keyed = K_KLINES and keyed_type()
local fids, fdues = ids, dues
if keyed then fids, fdues = {}, {} end
local take_front = taker(fids, fdues, missing)

local function max_late(t) if t > late then late = t end end
local full, t

-- 1. Orphans: popped by a consumer that died before claiming them.
-- (with priority levels, per level: _levels.lua)
local lists = levelled() and level_lists() or nil
if recover_orphans(K_READY, K_QUEUED, K_META, now, vt, batch, take, lists) then more = 1 end

-- 2. Due events. No envelope check here (one call per id): claim skips and
-- reports an id whose envelope is gone, which only something other than
-- delayq can cause.
full, t = pop_due(K_SCHEDULED, now, batch, ids, dues)
if full then more = 1 end
max_late(t)

-- 3. Expired leases: the worker died or stalled past its visibility timeout.
-- A parent's lease expiring on its last delivery makes a dead letter its children learn
-- of in the same step (docs/WORKFLOWS.md): with `deps` given (a type with dependencies).
-- A call without them leaves such a lease of a type marked as having dependencies (see
-- _deps.lua) and answers more = 2: the caller calls again with them.
local marked = nil
local function marked_type()
  if marked == nil then marked = redis.call('HEXISTS', K_META, DEP_MARK) == 1 end
  return marked
end
local expired_dead, dead_ids, held
full, t, expired_dead, dead_ids, held = expire_leases(K_INFLIGHT, K_LEASES, K_ERRORS,
  K_ATTEMPTS, K_DEAD, now, batch, max_deliveries, take_front, not K_DEPS and marked_type or nil)
if full then more = 1 end
if held then more = 2 end
max_late(t)
dead = dead + expired_dead
if K_DEPS and expired_dead > 0 and redis.call('EXISTS', K_DEPS) == 1 then
  for _, id in ipairs(dead_ids) do dep_complete(id, 'f' .. LEASE_EXPIRED, now) end
end

push_ready(ids, dues)
if keyed then
  push_ready(fids, fdues, true)
  -- 4. Keys: markers popped but not claimed, parked keys whose time has come.
  if recover_keys(K_READY, K_META, K_KLINES, K_KROT, K_KWAIT, now, vt, batch) then more = 1 end
end

-- When to look again: the earliest due time, lease deadline or orphan check.
local next_ms = nil
local function earliest(t2)
  if t2 and (next_ms == nil or t2 < next_ms) then next_ms = t2 end
end
next_looks(K_SCHEDULED, K_INFLIGHT, K_QUEUED, vt, earliest)
if keyed then keyed_looks(K_KROT, K_KWAIT, vt, earliest) end
if next_ms == nil then
  redis.call('HDEL', K_META, 'wake')
  next_ms = -1
else
  redis.call('HSET', K_META, 'wake', string.format('%.0f', next_ms))
end

local result = {#ids + (keyed and #fids or 0), more, next_ms, now, dead, redis.call('ZCARD', K_QUEUED), late}
for _, id in ipairs(missing) do result[#result + 1] = id end
return result
