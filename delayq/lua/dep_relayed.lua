-- dep_relayed: the relay handed completions to children lo..upto: forget them.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `deps`, `relay` of the parent's shard.
-- ARGV: pairs the relay member (see _deps.lua), upto: the last child handed on
-- Returns: per pair 1 when the member is done (all its children handed on), else 0 (the
--   member now starts after upto).
-- Guarantees: only what dep_apply.lua (or batch_apply.lua) has applied is forgotten (the
-- relay calls this after it): a relay killed before this step hands the same children the
-- same record again, which changes nothing. Once every child of a parent has been handed
-- on and no child waits for a later run of it, its fields go.
check_keys('deps', 'relay')
local out = {}
for i = 1, #ARGV, 2 do
  local member, upto = ARGV[i], tonumber(ARGV[i + 1])
  local score = redis.call('ZSCORE', K_RELAY, member)
  if not score then
    out[#out + 1] = 1  -- done already (a relay before us)
  else
    local pid, lo, hi = string.match(member, '^c%z(.*)%z(%d+)%z(%d+)$')
    lo, hi = tonumber(lo), tonumber(hi)
    if upto > hi then upto = hi end
    for n = lo, upto do
      local name = 'k:' .. pid .. '\0' .. n
      local kid = redis.call('HGET', K_DEPS, name)
      if kid then redis.call('HDEL', K_DEPS, name, 'l:' .. pid .. '\0' .. kid) end
    end
    redis.call('ZREM', K_RELAY, member)
    if upto < hi then
      redis.call('ZADD', K_RELAY, score, 'c\0' .. pid .. '\0' .. (upto + 1) .. '\0' .. hi)
      out[#out + 1] = 0
    else
      redis.call('HDEL', K_DEPS, 'r:' .. pid .. '\0' .. hi)
      if tonumber(redis.call('HGET', K_DEPS, 'c:' .. pid)) == hi
          and redis.call('HEXISTS', K_EVENTS, pid) == 0 then
        redis.call('HDEL', K_DEPS, 'c:' .. pid, 'b:' .. pid, 'f:' .. pid)
      end
      out[#out + 1] = 1
    end
  end
end
return out
