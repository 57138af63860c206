-- Pushing ids to a ready list (or, with flow keys, their keys' lines) and to the
-- schedule. Part of the per-type scripts' helpers (see _prelude.lua).

-- Appends ids to the ready list, first id first out, and records each in
-- `queued` with the next sequence numbers. Entries are "<due ms>:<id>" so a
-- consumer can measure lateness. Because the list is only pushed on the left
-- and popped on the right, `pushed - LLEN` tells which sequence numbers have
-- been popped: that is how move_due finds entries a dead consumer popped.
-- `level` (priority levels, see _levels.lua; nil: 0) numbers the pushes in its own
-- counter and score range.
local function push_plain_to(k_ready, k_queued, k_meta, ids, dues, level)
  local n = #ids
  if n == 0 then return end
  local seq = redis.call('HINCRBY', k_meta, level and pushed_field(level) or 'pushed', n) - n
  if level then seq = seq + level * LEVEL_SPAN end
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
-- With priority levels (`lists`: the group's ready lists of levels 1..9, given
-- for a type whose events have levels) each id goes to its level's list (or, with
-- flow keys, its place in its key's line).
local function push_ready_to(k_ready, k_queued, k_meta, ids, dues, front, k_lines, k_rot, k_wait,
                             lists)
  local levels = #ids > 0 and lists and levels_of(ids)
  if #ids > 0 and k_lines and keyed_type() then
    push_keyed_to(k_ready, k_queued, k_meta, k_lines, k_rot, k_wait, ids, dues, front, levels)
  elseif levels then
    -- one push per level used, each in the ids' order
    local by_level = {}
    for i, id in ipairs(ids) do
      local n = levels[i]
      local group = by_level[n]
      if not group then
        group = {{}, {}}
        by_level[n] = group
      end
      group[1][#group[1] + 1] = id
      group[2][#group[2] + 1] = dues[i]
    end
    for n = 0, #lists do
      local group = by_level[n]
      if group then push_plain_to(n == 0 and k_ready or lists[n], k_queued, k_meta, group[1], group[2], n) end
    end
  else
    push_plain_to(k_ready, k_queued, k_meta, ids, dues)
  end
end

local function push_ready(ids, dues, front)
  push_ready_to(K_READY, K_QUEUED, K_META, ids, dues, front, K_KLINES, K_KROT, K_KWAIT,
    levelled() and level_lists() or nil)
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
