-- counts: how many events of a type are in each state, when the next one is
-- due, and how far behind its consumers are.
--
-- KEYS (delayq/keyspace/scripts.py): `scheduled`, `ready`, `queued`, `inflight`, `dead`,
--   `retries`, `limits`, `klines`, `rexp` for one delivery group its read view
--   (TypeKeys.read_view: the type's schedule and the group's lists; the group's retry
--   schedule, counted as scheduled too; for the type's own counts its schedule again, so
--   not counted twice), the limits HASH, the group's flow-key lines, and the type's kept
--   outcomes' expiry times (types with results=).
--   then the priority levels' ready lists `ready_1` `ready_2` `ready_3` `ready_4`
--   `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua), then `waiting`: the
--   type's events waiting for their parents (docs/WORKFLOWS.md), and `relay`: the relay's
--   work in the type's slot (_deps.lua)
-- ARGV: none
-- Returns: {scheduled, ready, in_flight, dead, next_due_ms (-1: none scheduled),
--           scheduled_overdue, oldest_ready_entry or false, now_ms, paused, results_kept,
--           by_level, waiting, relay_due, relay_age_ms}
--   by_level           ids ready at priority levels 0..9 (ten counts), or empty
--                      while none waits above level 0 (_levels.lua; given the
--                      level lists, `ready_1`..`ready_9`, whose heads count for
--                      the oldest entry too)
--   waiting            events waiting for their parents (docs/WORKFLOWS.md)
--   relay_due          the relay's work due and not done: completions of the type's
--                      events not handed to every child yet, and audits of its waiting
--                      children past their time (0 for a type without dependencies)
--   relay_age_ms       how long the oldest of them has been due (0: none)
--   results_kept       outcomes kept and not expired yet (0 for a type without results=)
--   paused             1 while the type (group) is paused (see limits.lua), else 0
--   scheduled_overdue  scheduled events whose due time has passed (the
--                      scheduler has not moved them yet)
--   oldest_ready_entry the "<due ms>:<id>" entry at the head of the ready
--                      list (the next to be popped; it may be stale); with flow
--                      keys, the head of the line of the key whose turn is next
-- Guarantees: read-only; a fixed number of O(log n) commands, whatever the
-- queue's size; every figure is from the same instant on Redis's clock.
local now = clock_ms()
local schedules = {K_SCHEDULED}
if K_RETRIES and K_RETRIES ~= K_SCHEDULED then schedules[2] = K_RETRIES end
local scheduled, overdue, next_due = 0, 0, -1
for _, key in ipairs(schedules) do
  scheduled = scheduled + redis.call('ZCARD', key)
  overdue = overdue + redis.call('ZCOUNT', key, '-inf', now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] and (next_due < 0 or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end
local head = redis.call('LINDEX', K_READY, -1)
if head and is_marker(head) and K_KLINES then
  -- flow keys: the next turn is that key's, and its line's head is the entry
  local lo, hi = key_range(string.sub(head, 3))
  local first = redis.call('ZRANGEBYLEX', K_KLINES, lo, hi, 'LIMIT', 0, 1)[1]
  head = first and string.match(first, '^[^%z]*%z[^%z]*%z(.*)$') or false
end
-- Priority levels (_levels.lua): the oldest head of every level's list, and how
-- many ids wait at each level (level 0: the rest of `queued`)
local by_level = {}
local lists = level_lists()
if lists and redis.call('ZCOUNT', K_QUEUED, LEVEL_SPAN, '+inf') > 0 then
  local rest = redis.call('ZCARD', K_QUEUED)
  for n = 1, #lists do
    by_level[n + 1] = redis.call('ZCOUNT', K_QUEUED, n * LEVEL_SPAN, '(' .. ((n + 1) * LEVEL_SPAN))
    rest = rest - by_level[n + 1]
    local h = redis.call('LINDEX', lists[n], -1)
    if h and (not head or (tonumber(string.match(h, '^(%d+):')) or now)
        < (tonumber(string.match(head, '^(%d+):')) or now)) then
      head = h
    end
  end
  by_level[1] = rest
end
-- the relay's backlog (_deps.lua): members due at or before now
local relay_due, relay_age = 0, 0
if K_RELAY then
  relay_due = redis.call('ZCOUNT', K_RELAY, '-inf', now)
  if relay_due > 0 then
    relay_age = now - tonumber(redis.call('ZRANGE', K_RELAY, 0, 0, 'WITHSCORES')[2])
  end
end
return {
  scheduled,
  redis.call('ZCARD', K_QUEUED),
  redis.call('ZCARD', K_INFLIGHT),
  redis.call('ZCARD', K_DEAD),
  next_due,
  overdue,
  head,
  now,
  K_LIMITS and redis.call('HEXISTS', K_LIMITS, 'paused') or 0,
  K_REXP and redis.call('ZCOUNT', K_REXP, '(' .. now, '+inf') or 0,
  by_level,
  K_WAITING and redis.call('ZCARD', K_WAITING) or 0,
  relay_due,
  relay_age,
}
