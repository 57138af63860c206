-- limits_set: change the flow limits of an event type (or one delivery group).
--
-- KEYS[1] limits HASH of the type or group ({p:T}:limits, {p:T}:g:G:limits)
-- KEYS[2] wake LIST of the same (consumers waiting for a slot BLPOP it)
-- ARGV: pairs field, value; an empty value deletes the field (see
--   delayq/limits.py for the fields)
-- Returns: the fields now stored, as a flat list (field, value, ...).
-- Guarantees: one atomic change; the key is deleted once no limit is left
-- (the GCRA state alone is no limit), so a type without limits costs claim
-- one EXISTS. Consumers waiting for a slot or a resume are woken at once (the
-- others see the change at their next claim, within a second).
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
-- a per-key rate removed: its per-key GCRA states ('t:<key>') go with it
if redis.call('HEXISTS', KEYS[1], 'key_rate_n') == 0 then
  local stale = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 2) == 't:' then stale[#stale + 1] = field end
  end
  for i = 1, #stale, 1000 do
    redis.call('HDEL', KEYS[1], unpack(stale, i, math.min(#stale, i + 999)))
  end
end
local n = redis.call('HLEN', KEYS[1])
if n == 0 or (n == 1 and redis.call('HEXISTS', KEYS[1], 'tat') == 1) then
  redis.call('DEL', KEYS[1])
end
local tokens = {}
for i = 1, 16 do tokens[i] = '1' end
redis.call('LPUSH', KEYS[2], unpack(tokens))
redis.call('LTRIM', KEYS[2], 0, 15)
redis.call('PEXPIRE', KEYS[2], 1000)
return redis.call('HGETALL', KEYS[1])
