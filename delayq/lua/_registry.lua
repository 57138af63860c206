-- The type's delivery-group registry and the `pending` counts of fanned-out
-- events. Part of the per-type scripts' helpers (see _prelude.lua).

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
  if K_PRIO then redis.call('HDEL', K_PRIO, id) end  -- its priority level, if it had one
end
