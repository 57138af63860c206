-- progress: store or clear a running handler's progress.
--
-- KEYS (delayq/keyspace/scripts.py): `leases`, `progress`: the leases of one delivery
--   group of a type (HASH id -> claim token) and that group's progress (HASH id -> token
--   NUL value, {p:T}:progress or {p:T}:g:G:progress), same hash tag.
-- ARGV[1] 'set' or 'clear'; ARGV[2] id; ARGV[3] the run's claim token;
-- ARGV[4] the value ('set': encoded by the caller)
-- Returns: 1 written or cleared, 0 not: 'set' by a run that no longer holds the
--          lease, 'clear' of progress a newer run wrote.
-- Guarantees: only the delivery holding the lease writes its progress, and a
-- run clears only its own. The hash expires a day after its last write, so the
-- progress of runs whose process died does not stay.
local id, token = ARGV[2], ARGV[3]
if ARGV[1] == 'set' then
  if redis.call('HGET', K_LEASES, id) ~= token then return 0 end
  redis.call('HSET', K_PROGRESS, id, token .. '\0' .. ARGV[4])
  redis.call('PEXPIRE', K_PROGRESS, 86400000)
  return 1
end
local stored = redis.call('HGET', K_PROGRESS, id)
if stored and string.sub(stored, 1, #token + 1) == token .. '\0' then
  redis.call('HDEL', K_PROGRESS, id)
  return 1
end
return 0
