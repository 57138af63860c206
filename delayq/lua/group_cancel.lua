-- group_cancel: cancel.lua for a type with delivery groups.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `groups`, `pending`, `prio`,
--   `deps`, `relay`, `waiting` of the type, then every group's (see _groups.lua), with
--   every registered group.
-- ARGV: n, the group names, then ARG(1) id, ARG(2) the group to cancel it for
--       ('' for every group)
-- Returns: 1 removed (2: and it was a parent whose "cancelled" waits for the relay), 0
--          nothing pending for that group (unknown, done, only dead
--          letters, or no such group), or {'stale', group...} (see group_move.lua).
-- Guarantees: in one step the event leaves the schedule and every group's (or
-- the one group's) retries, ready list and leases (a running handler's ack or
-- failure becomes a no-op). Groups that made it a dead letter keep it (dead
-- letters go with dead_purge), and with them the envelope; otherwise the
-- envelope goes too. For one group: an event not fanned out yet is fanned out
-- now to the other groups, each waiting in its own retry schedule until the
-- original due time (as group_run_now.lua); one already fanned out leaves that
-- group alone, and the last group to let go deletes the envelope. Dependencies
-- (docs/WORKFLOWS.md): a child waiting for its parents is cancelled only for every group
-- (it is in none yet: a cancel for one group finds nothing); a parent whose envelope
-- goes hands "cancelled" to its children.
local reg, names = registry()
if not reg then return stale(names) end
local id, target = ARG(1), ARG(2) or ''
if target ~= '' and reg[target] == nil then return 0 end
-- the only group registered is every group
if N_GROUPS == 1 then target = '' end
local deps = redis.call('EXISTS', K_DEPS) == 1
-- a child waiting for its parents is in no group yet: cancelled for every group only
if deps and redis.call('ZSCORE', K_WAITING, id) then
  if target ~= '' then return 0 end
  redis.call('ZREM', K_WAITING, id)
  redis.call('HDEL', K_EVENTS, id)
  redis.call('HDEL', K_PRIO, id)
  redis.call('HDEL', K_FKEYS, id)
  dep_forget(id)
  if dep_complete(id, 'c', clock_ms()) then return 2 end
  return 1
end
-- the envelope gone (the last holder let go): a parent's children are handed "cancelled"
local function done()
  if deps and redis.call('HEXISTS', K_EVENTS, id) == 0 then
    dep_forget(id)
    if dep_complete(id, 'c', clock_ms()) then return 2 end
  end
  return 1
end
local function wanted(g) return target == '' or GROUP_NAMES[g] == target end
local removed = 0
if target == '' then
  removed = redis.call('ZREM', K_SCHEDULED, id)
else
  local due = redis.call('ZSCORE', K_SCHEDULED, id)
  if due then
    if redis.call('HEXISTS', K_EVENTS, id) == 0 then return 0 end  -- the move drops it
    check_keys('scheduled', 'pending')
    check_group_keys()
    redis.call('ZREM', K_SCHEDULED, id)
    redis.call('HSET', K_PENDING, id, N_GROUPS - 1)
    for g = 1, N_GROUPS do
      -- no wake-up needed: the scheduler already planned to look by this due time
      if not wanted(g) then redis.call('ZADD', gkey(g, G_SCHEDULED), due, id) end
    end
    return 1
  end
end
local dead_holders = 0
for g = 1, N_GROUPS do
  if wanted(g) then
    local held = redis.call('ZREM', gkey(g, G_SCHEDULED), id)
      + redis.call('ZREM', gkey(g, G_QUEUED), id) + redis.call('ZREM', gkey(g, G_INFLIGHT), id)
    if held > 0 then
      removed = 1
      redis.call('HDEL', gkey(g, G_LEASES), id)
      redis.call('HDEL', gkey(g, G_ATTEMPTS), id)
      redis.call('HDEL', gkey(g, G_ERRORS), id)
    elseif redis.call('ZSCORE', gkey(g, G_DEAD), id) then
      dead_holders = dead_holders + 1
    end
  end
end
if removed == 0 then return 0 end
if target ~= '' then
  -- one group let go of it: the last group holding it deletes the envelope
  release(id, counting())
  if redis.call('HEXISTS', K_EVENTS, id) == 0 then redis.call('HDEL', K_FKEYS, id) end
elseif dead_holders == 0 then
  redis.call('HDEL', K_PENDING, id)
  redis.call('HDEL', K_EVENTS, id)
  redis.call('HDEL', K_PRIO, id)
  redis.call('HDEL', K_FKEYS, id)  -- its flow key, if it had one
else
  -- dead letters hold it: its children learn of it when they are purged (dead_purge)
  redis.call('HSET', K_PENDING, id, dead_holders)
end
return done()
