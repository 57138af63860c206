-- due_histogram: how many scheduled events fall due in each time range.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV: upper bounds of the ranges, in ms from now, ascending (e.g. 0, 60000,
--       3600000, 86400000); one more range holds everything later.
-- Returns: {now_ms, count of due <= now + ARGV[1], count in (ARGV[1], ARGV[2]], ..., later}
-- Guarantees: read-only; ZCOUNT only (O(log n) each), whatever the queue size.
local now = clock_ms()
local result = {now}
local low = '-inf'
for i = 1, #ARGV do
  local high = now + tonumber(ARGV[i])
  result[#result + 1] = redis.call('ZCOUNT', K_SCHEDULED, low, high)
  low = '(' .. high
end
result[#result + 1] = redis.call('ZCOUNT', K_SCHEDULED, low, '+inf')
return result
