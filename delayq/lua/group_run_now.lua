-- group_run_now: run_now.lua for a type with delivery groups.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `groups`, `pending` of the
--   type, then every group's (see _groups.lua), with every registered group.
--   then `prio` (_levels.lua), then every group's ready lists of levels 1..9.
-- ARGV: n, the group names, then ARG(1) id, ARG(2) the group to run it for
--       ('' for every group)
-- Returns: 1 when something became ready, 0 when nothing was scheduled for
--          that group (or no such group), or {'stale', group...}.
-- Guarantees: an event not fanned out yet (in the type's schedule) is fanned
-- out now in one step, as group_move.lua would at its due time: to every
-- registered group, with `pending` counting them. It becomes ready for the
-- group asked for (every group when none is named); the other groups' copies
-- wait in their own retry schedules until the original due time, so running
-- it now for one group changes nothing for the others. An event already
-- fanned out runs now only in the groups whose retry schedule holds it (a
-- retry waiting for its backoff: attempts and last error are kept). It goes to
-- its priority level's list in each group (_levels.lua).
local reg, names = registry()
if not reg then return stale(names) end
local id, target = ARG(1), ARG(2)
if target ~= '' and reg[target] == nil then return 0 end
if redis.call('HEXISTS', K_EVENTS, id) == 0 then return 0 end  -- the move drops it
check_keys('scheduled', 'pending')
check_group_keys()
local now = clock_ms()
local function wanted(g) return target == '' or GROUP_NAMES[g] == target end
local due = redis.call('ZSCORE', K_SCHEDULED, id)
if due then
  redis.call('ZREM', K_SCHEDULED, id)
  redis.call('HSET', K_PENDING, id, N_GROUPS)
  for g = 1, N_GROUPS do
    if wanted(g) then
      push_ready_to(gkey(g, G_READY), gkey(g, G_QUEUED), gkey(g, G_META), {id}, {now}, false,
        gkkey(g, G_KLINES), gkkey(g, G_KROT), gkkey(g, G_KWAIT), group_levels(g))
    else
      -- no wake-up needed: the scheduler already planned to look by this due time
      redis.call('ZADD', gkey(g, G_SCHEDULED), due, id)
    end
  end
  return 1
end
local moved = 0
for g = 1, N_GROUPS do
  if wanted(g) and redis.call('ZREM', gkey(g, G_SCHEDULED), id) == 1 then
    push_ready_to(gkey(g, G_READY), gkey(g, G_QUEUED), gkey(g, G_META), {id}, {now}, false,
      gkkey(g, G_KLINES), gkkey(g, G_KROT), gkkey(g, G_KWAIT), group_levels(g))
    moved = 1
  end
end
return moved
