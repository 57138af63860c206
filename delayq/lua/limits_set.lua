-- limits_set: change the flow limits of an event type (or one delivery group).
--
-- KEYS (delayq/keyspace/scripts.py): `limits`, `wake`: the limits HASH of the type or
--   group ({p:T}:limits, {p:T}:g:G:limits) and its wake LIST (consumers waiting for a slot
--   BLPOP it).
-- ARGV: pairs field, value; an empty value deletes the field (see
--   delayq/flow/limits.py for the fields)
-- Returns: the fields now stored, as a flat list (field, value, ...).
-- Guarantees: one atomic change; the key is deleted once no limit is left
-- (the GCRA state alone is no limit), so a type without limits costs claim
-- one EXISTS. Consumers waiting for a slot or a resume are woken at once (the
-- others see the change at their next claim, within a second).
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', K_LIMITS, ARGV[i])
  else
    redis.call('HSET', K_LIMITS, ARGV[i], ARGV[i + 1])
  end
end
-- a per-key rate removed: its per-key GCRA states ('t:<key>') go with it
if redis.call('HEXISTS', K_LIMITS, 'key_rate_n') == 0 then
  local stale = {}
  for _, field in ipairs(redis.call('HKEYS', K_LIMITS)) do
    if string.sub(field, 1, 2) == 't:' then stale[#stale + 1] = field end
  end
  for i = 1, #stale, 1000 do
    redis.call('HDEL', K_LIMITS, unpack(stale, i, math.min(#stale, i + 999)))
  end
end
local n = redis.call('HLEN', K_LIMITS)
if n == 0 or (n == 1 and redis.call('HEXISTS', K_LIMITS, 'tat') == 1) then
  redis.call('DEL', K_LIMITS)
end
local tokens = {}
for i = 1, 16 do tokens[i] = '1' end
redis.call('LPUSH', K_WAKE, unpack(tokens))
redis.call('LTRIM', K_WAKE, 0, 15)
redis.call('PEXPIRE', K_WAKE, 1000)
return redis.call('HGETALL', K_LIMITS)
