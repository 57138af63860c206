-- progress: store or clear a running handler's progress.
--
-- KEYS[1] the leases of one delivery group of a type (HASH id -> claim token)
-- KEYS[2] that group's progress (HASH id -> token NUL value), same hash tag
-- ARGV[1] 'set' or 'clear'; ARGV[2] id; ARGV[3] the run's claim token;
-- ARGV[4] the value ('set': encoded by the caller)
-- Returns: 1 written or cleared, 0 not: 'set' by a run that no longer holds the
--          lease, 'clear' of progress a newer run wrote.
-- Guarantees: only the delivery holding the lease writes its progress, and a
-- run clears only its own. The hash expires a day after its last write, so the
-- progress of runs whose process died does not stay.
local id, token = ARGV[2], ARGV[3]
if ARGV[1] == 'set' then
  if redis.call('HGET', KEYS[1], id) ~= token then return 0 end
  redis.call('HSET', KEYS[2], id, token .. '\0' .. ARGV[4])
  redis.call('PEXPIRE', KEYS[2], 86400000)
  return 1
end
local stored = redis.call('HGET', KEYS[2], id)
if stored and string.sub(stored, 1, #token + 1) == token .. '\0' then
  redis.call('HDEL', KEYS[2], id)
  return 1
end
return 0
