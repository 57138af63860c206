-- dep_work: the relay's due work in one shard, read (and audits rescheduled) in one step.
--
-- KEYS (delayq/keyspace/scripts.py): `deps`, `relay` of the shard.
-- ARGV[1] the most relay members read, ARGV[2] the most children per completion
-- ARGV[3] ms to the next audit at least (a child's audits then back off: each waits as
--         long as the child has waited so far, up to ARGV[4] ms)
-- ARGV[5] (optional) the most children read in all: once a call has read that many, it
--         reads no further member and ends its items with {'more'}
-- Returns: {now_ms, next_ms, item...}; next_ms: when the next member is due (-1: none).
--   Items are arrays: {'c', member, parent id, record, lo, hi, child shard, child id, ...}
--   a completion to hand to children lo.. (at most ARGV[2] of them, up to hi), or
--   {'a', child id, parent type, parent id, ...} an audit: the child's parents not done;
--   {'more'} (last): it stopped at ARGV[5] children, more members are due.
-- Guarantees: reads only, but for the audits' next times (an audit is idempotent: a
-- relay that dies after this step loses nothing). Completions stay until dep_relayed.lua
-- clears them, so a relay killed at any step hands them on again (applied once: see
-- dep_apply.lua).
check_keys('deps', 'relay')
local now = clock_ms()
local limit, per, floor, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local most = tonumber(ARGV[5])
local out = {now, -1}
local read = 0
local due = redis.call('ZRANGEBYSCORE', K_RELAY, '-inf', now, 'LIMIT', 0, limit)
for _, member in ipairs(due) do
  if most and read >= most then
    out[#out + 1] = {'more'}
    break
  end
  if string.sub(member, 1, 1) == 'c' then
    local pid, lo, hi = string.match(member, '^c%z(.*)%z(%d+)%z(%d+)$')
    lo, hi = tonumber(lo), tonumber(hi)
    local item = {'c', member, pid, redis.call('HGET', K_DEPS, 'r:' .. pid .. '\0' .. hi) or '', lo, hi}
    local last = math.min(hi, lo + per - 1)
    local names = {}
    for n = lo, last do names[#names + 1] = 'k:' .. pid .. '\0' .. n end
    read = read + #names
    if #names > 0 then
      for _, kid in ipairs(redis.call('HMGET', K_DEPS, unpack(names))) do
        local cshard, cid = string.match(kid or '', '^(.-)%z(.*)$')
        item[#item + 1] = cshard or ''
        item[#item + 1] = cid or ''
      end
    end
    out[#out + 1] = item
  else
    local cid = string.sub(member, 3)
    local w = redis.call('HGET', K_DEPS, 'w:' .. cid)
    if not w then
      redis.call('ZREM', K_RELAY, member)  -- the child is gone
    else
      local fields, rec = dep_fields(cid, w)
      local item = {'a', cid}
      for j = 3, #fields, 1000 do
        local got = redis.call('HMGET', K_DEPS, unpack(fields, j, math.min(#fields, j + 999)))
        for k, record in ipairs(got) do
          if record == '' then
            local n = j + k - 1
            item[#item + 1] = rec[2 * n - 3]
            item[#item + 1] = rec[2 * n - 2]
          end
        end
      end
      local wait = math.max(floor, math.min(cap, now - tonumber(rec[2])))
      redis.call('ZADD', K_RELAY, now + wait, member)
      out[#out + 1] = item
    end
  end
end
local first = redis.call('ZRANGE', K_RELAY, 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out
