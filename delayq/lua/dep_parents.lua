-- dep_parents: an event's parents and what is known of each (its delivery, inspect).
--
-- KEYS (delayq/keyspace/scripts.py): `deps`, `waiting` of the child's shard.
-- ARGV[1] id
-- Returns: {policy or false, waiting (own due ms or false), parent type, parent id,
--   record ('' while not done), ...}; {false, false} for an event without parents.
-- Guarantees: read-only, one consistent view.
local id = ARGV[1]
local w = redis.call('HGET', K_DEPS, 'w:' .. id)
if not w then return {false, false} end
local fields, rec = dep_fields(id, w)
local out = {rec[1], redis.call('ZSCORE', K_WAITING, id)}
for j = 3, #fields, 1000 do
  local got = redis.call('HMGET', K_DEPS, unpack(fields, j, math.min(#fields, j + 999)))
  for k, record in ipairs(got) do
    local n = j + k - 1
    out[#out + 1] = rec[2 * n - 3]
    out[#out + 1] = rec[2 * n - 2]
    out[#out + 1] = record or ''
  end
end
return out
