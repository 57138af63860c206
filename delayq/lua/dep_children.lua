-- dep_children: the children linked to a parent and waiting for its next completion (the
-- dashboard's workflow graph).
--
-- KEYS (delayq/keyspace/scripts.py): `deps` of the parent's shard.
-- ARGV[1] parent id, ARGV[2] limit: how many children to list at most
-- Returns: {count, child shard, child id, ...}: how many children wait for the parent's
--   next completion (those linked since its last one, see _deps.lua), then the first
--   `limit` of them in the order they were linked.
-- Guarantees: read-only, one consistent view; reads at most `limit` + 2 fields.
local id, limit = ARGV[1], tonumber(ARGV[2])
local got = redis.call('HMGET', K_DEPS, 'c:' .. id, 'b:' .. id)
local c, b = tonumber(got[1]) or 0, tonumber(got[2]) or 0
local out = {math.max(c - b, 0)}
local last = math.min(c, b + limit)
if last <= b then return out end
local fields = {}
for n = b + 1, last do fields[#fields + 1] = 'k:' .. id .. '\0' .. n end
for _, link in ipairs(redis.call('HMGET', K_DEPS, unpack(fields))) do
  if link then
    local sep = string.find(link, '\0', 1, true)
    out[#out + 1] = string.sub(link, 1, sep - 1)
    out[#out + 1] = string.sub(link, sep + 1)
  end
end
return out
