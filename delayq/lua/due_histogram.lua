-- due_histogram: how many scheduled events fall due in each time range.
--
-- KEYS (delayq/keyspace/scripts.py): `scheduled`, `retries` of the type, or one group's
--   read view (see counts.lua: the group's retries count too).
-- ARGV: upper bounds of the ranges, in ms from now, ascending (e.g. 0, 60000,
--       3600000, 86400000); one more range holds everything later.
-- Returns: {now_ms, count of due <= now + ARGV[1], count in (ARGV[1], ARGV[2]], ..., later}
-- Guarantees: read-only; ZCOUNT only (O(log n) each), whatever the queue size.
local now = clock_ms()
local schedules = {K_SCHEDULED}
if K_RETRIES and K_RETRIES ~= K_SCHEDULED then schedules[2] = K_RETRIES end
local function count(low, high)
  local n = 0
  for _, key in ipairs(schedules) do n = n + redis.call('ZCOUNT', key, low, high) end
  return n
end
local result = {now}
local low = '-inf'
for i = 1, #ARGV do
  local high = now + tonumber(ARGV[i])
  result[#result + 1] = count(low, high)
  low = '(' .. high
end
result[#result + 1] = count(low, '+inf')
return result
