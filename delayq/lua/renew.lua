-- renew: push back the lease deadlines of events whose handlers still run.
--
-- KEYS (delayq/keyspace/scripts.py): `inflight`, `leases`, `meta` of the type or one
--   group's view (see _prelude.lua).
-- ARGV[1] visibility timeout in ms; ARGV[2..] pairs id, token
-- Returns: the ids whose lease is no longer held by that token (lost).
-- Guarantees: a lease is only extended for the delivery that holds it.
keep_working_when_full()
local deadline = clock_ms() + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', K_LEASES, id) == ARGV[i + 1] then
    redis.call('ZADD', K_INFLIGHT, 'XX', deadline, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
