-- schedule_due: the schedules due now, and when the next one is.
--
-- KEYS (delayq/keyspace/scripts.py): `index`, `homes`: `{p}:schedules` ZSET name -> next
--   fire ms; `{p}:schedule-homes` HASH name -> "<gen>|<shard>".
-- ARGV[1] at most this many, ARGV[2] how far ahead (ms) a fire counts as due
-- Returns: {now ms (Redis's clock), next fire ms after now + ahead or -1, name1, home1, ...}
-- Guarantees: read-only but for index entries of removed schedules (home
--   without a shard), which it drops; bounded by ARGV[1].
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now, -1}
local horizon = now + (tonumber(ARGV[2]) or 0)
local due = redis.call('ZRANGEBYSCORE', K_INDEX, '-inf', horizon, 'LIMIT', 0, tonumber(ARGV[1]))
for _, name in ipairs(due) do
  local home = redis.call('HGET', K_HOMES, name)
  if not home or string.sub(home, -1) == '|' then
    redis.call('ZREM', K_INDEX, name)
  else
    out[#out + 1] = name
    out[#out + 1] = home
  end
end
local later = redis.call('ZRANGEBYSCORE', K_INDEX, '(' .. horizon, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if later[2] then out[2] = tonumber(later[2]) end
return out
