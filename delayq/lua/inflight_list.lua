-- inflight_list: read in-flight events, earliest lease deadline first.
--
-- KEYS (delayq/keyspace/scripts.py): `inflight`, `attempts` of the type, or one group's
--   read view.
-- ARGV[1] offset, ARGV[2] limit (the caller bounds it)
-- Returns: {now_ms, id, lease deadline ms, attempts or false, id, ...}
-- Guarantees: read-only; one consistent view of the page.
local ids = redis.call('ZRANGE', K_INFLIGHT, ARGV[1], tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1,
  'WITHSCORES')
local result = {clock_ms()}
for i = 1, #ids, 2 do
  result[#result + 1] = ids[i]
  result[#result + 1] = ids[i + 1]
  result[#result + 1] = redis.call('HGET', K_ATTEMPTS, ids[i])
end
return result
