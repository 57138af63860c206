-- dead_list: read dead letters, oldest first.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `attempts`, `errors`, `dead` of the type,
--   or one group's read view.
-- ARGV[1] offset, ARGV[2] limit
-- Returns: {id, failed_at_ms, envelope or false, attempts or false,
--           error or false, ...}
-- Guarantees: a consistent view of each dead letter (one atomic read).
local ids = redis.call('ZRANGE', K_DEAD, ARGV[1], tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1,
  'WITHSCORES')
local result = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  result[#result + 1] = id
  result[#result + 1] = ids[i + 1]
  result[#result + 1] = redis.call('HGET', K_EVENTS, id)
  result[#result + 1] = redis.call('HGET', K_ATTEMPTS, id)
  result[#result + 1] = redis.call('HGET', K_ERRORS, id)
end
return result
