-- Pushing ids to a ready list (or, with flow keys, their keys' lines) and to the
-- schedule. Part of the per-type scripts' helpers (see _prelude.lua).

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
