-- counts: how many events of a type are in each state, when the next one is
-- due, and how far behind its consumers are.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV: none
-- Returns: {scheduled, ready, in_flight, dead, next_due_ms (-1: none scheduled),
--           scheduled_overdue, oldest_ready_entry or false, now_ms}
--   scheduled_overdue  scheduled events whose due time has passed (the
--                      scheduler has not moved them yet)
--   oldest_ready_entry the "<due ms>:<id>" entry at the head of the ready
--                      list (the next to be popped; it may be stale)
-- Guarantees: read-only; a fixed number of O(log n) commands, whatever the
-- queue's size; every figure is from the same instant on Redis's clock.
local now = clock_ms()
local first = redis.call('ZRANGE', K_SCHEDULED, 0, 0, 'WITHSCORES')
local next_due = -1
if first[2] then next_due = tonumber(first[2]) end
return {
  redis.call('ZCARD', K_SCHEDULED),
  redis.call('ZCARD', K_QUEUED),
  redis.call('ZCARD', K_INFLIGHT),
  redis.call('ZCARD', K_DEAD),
  next_due,
  redis.call('ZCOUNT', K_SCHEDULED, '-inf', now),
  redis.call('LINDEX', K_READY, -1),
  now,
}
