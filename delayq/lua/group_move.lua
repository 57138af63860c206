-- group_move: the scheduler's step for a type with delivery groups (move_due.lua
-- for a type without them), bounded by a batch size per category and group.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `meta`, `groups`, `pending` of
--   the type, then every group's (see _groups.lua), with every registered group.
--   then `prio` (_levels.lua), then every group's ready lists of levels 1..9.
-- ARGV: n, the group names, then
-- ARG(1) batch, ARG(2) visibility timeout in ms, ARG(3) max deliveries for a
--        group registered without one
-- Returns: as move_due.lua, or {'stale', group...} when the groups passed are
--   not the registered ones (nothing changed: call again with those).
--   moved counts deliveries (an event due for three groups counts three);
--   queued sums the groups' ready lists; dead is 0, or {group, count, ...}
--   for each group whose expired leases became its dead letters (so they are
--   counted for the right group).
-- Guarantees: the fan-out: each event due in the type's schedule is pushed to
-- the ready list of every group registered now, in the same atomic step that
-- removes it from the schedule (once per due time, whoever runs it), and
-- `pending` counts the groups that hold it. Per group, as move_due.lua: its
-- own retries become ready, its expired leases and orphaned entries come back
-- to its ready list alone (or become its dead letters after its max
-- deliveries), so no group's failure re-runs another group's handler.
-- Priority levels (_levels.lua): every push goes to the event's level's list of
-- that group (the level is the type's, in `prio`), so a fanned-out event, a retry
-- and an expired lease keep their level in every group; orphans are looked for
-- in every level's list.
local reg, names = registry()
if not reg then return stale(names) end
check_keys('events', 'scheduled', 'meta', 'pending')
check_group_keys()
keep_working_when_full()
local now = clock_ms()
local batch = tonumber(ARG(1))
local vt = tonumber(ARG(2))
local default_max = tonumber(ARG(3))
local moved, more, dead, late, queued = 0, 0, 0, 0, 0
local dead_by_group = {}
local missing = {}
local next_ms = nil
local function earliest(t)
  if t and (next_ms == nil or t < next_ms) then next_ms = t end
end

for g = 1, N_GROUPS do
  local k_ready, k_queued, k_meta = gkey(g, G_READY), gkey(g, G_QUEUED), gkey(g, G_META)
  local k_sched, k_inflight = gkey(g, G_SCHEDULED), gkey(g, G_INFLIGHT)
  local max_deliveries = reg[GROUP_NAMES[g]] or default_max
  local ids, dues = {}, {}
  local take = taker(ids, dues, missing)
  -- expired leases of a keyed type: the head of their key's line (see move_due)
  local k_lines, k_rot, k_wait = gkkey(g, G_KLINES), gkkey(g, G_KROT), gkkey(g, G_KWAIT)
  local fids, fdues = ids, dues
  if keyed_type() then fids, fdues = {}, {} end
  local take_front = taker(fids, fdues, missing)
  local lists = group_levels(g)

  local full, t, expired_dead
  -- 1. Orphans of this group's ready lists.
  if recover_orphans(k_ready, k_queued, k_meta, now, vt, batch, take, lists) then more = 1 end

  -- 2. This group's retries that are due.
  full, t = pop_due(k_sched, now, batch, ids, dues)
  if full then more = 1 end
  if t > late then late = t end

  -- 3. This group's expired leases.
  full, t, expired_dead = expire_leases(k_inflight, gkey(g, G_LEASES), gkey(g, G_ERRORS),
    gkey(g, G_ATTEMPTS), gkey(g, G_DEAD), now, batch, max_deliveries, take_front)
  if full then more = 1 end
  if t > late then late = t end
  dead = dead + expired_dead
  if expired_dead > 0 then
    dead_by_group[#dead_by_group + 1] = GROUP_NAMES[g]
    dead_by_group[#dead_by_group + 1] = expired_dead
  end

  push_ready_to(k_ready, k_queued, k_meta, ids, dues, false, k_lines, k_rot, k_wait, lists)
  moved = moved + #ids
  if keyed_type() then
    push_ready_to(k_ready, k_queued, k_meta, fids, fdues, true, k_lines, k_rot, k_wait, lists)
    moved = moved + #fids
    if recover_keys(k_ready, k_meta, k_lines, k_rot, k_wait, now, vt, batch) then more = 1 end
    keyed_looks(k_rot, k_wait, vt, earliest)
  end

  next_looks(k_sched, k_inflight, k_queued, vt, earliest)
end

-- 4. The fan-out: events due for every group. Pushed to each group's list as
-- move_due.lua pushes to the one list; `pending` counts the groups holding each.
local n_due = redis.call('ZCOUNT', K_SCHEDULED, '-inf', now)
if n_due > batch then
  n_due = batch
  more = 1
end
if n_due > 0 and N_GROUPS > 0 then
  local due = redis.call('ZPOPMIN', K_SCHEDULED, n_due)
  if now - tonumber(due[2]) > late then late = now - tonumber(due[2]) end
  local ids, dues, counts = {}, {}, {}
  for i = 1, #due, 2 do
    ids[#ids + 1] = due[i]
    dues[#dues + 1] = due[i + 1]
    counts[#counts + 1] = due[i]
    counts[#counts + 1] = N_GROUPS
  end
  redis.call('HSET', K_PENDING, unpack(counts))
  for g = 1, N_GROUPS do
    push_ready_to(gkey(g, G_READY), gkey(g, G_QUEUED), gkey(g, G_META), ids, dues, false,
      gkkey(g, G_KLINES), gkkey(g, G_KROT), gkkey(g, G_KWAIT), group_levels(g))
  end
  moved = moved + #ids * N_GROUPS
end
local first = redis.call('ZRANGE', K_SCHEDULED, 0, 0, 'WITHSCORES')
if first[2] then earliest(tonumber(first[2])) end

-- The wake mark, in the type's meta and in each group's (fail.lua compares a
-- retry's due time with its group's mark: see schedule() in _prelude.lua).
local metas = {K_META}
for g = 1, N_GROUPS do
  if gkey(g, G_META) ~= K_META then metas[#metas + 1] = gkey(g, G_META) end
end
for _, meta in ipairs(metas) do
  if next_ms == nil then
    redis.call('HDEL', meta, 'wake')
  else
    redis.call('HSET', meta, 'wake', string.format('%.0f', next_ms))
  end
end
for g = 1, N_GROUPS do queued = queued + redis.call('ZCARD', gkey(g, G_QUEUED)) end

if dead > 0 then dead = dead_by_group end
local result = {moved, more, next_ms or -1, now, dead, queued, late}
for _, id in ipairs(missing) do result[#result + 1] = id end
return result
