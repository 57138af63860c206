-- dep_link: tell parents of one type (shard) about a child, or answer that they are done.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `errors`, `dead`, `meta`, `groups`,
--   `dedup`, `results`, `rexp`, `deps` of the parents' type (shard).
-- ARGV: triples parent id, child shard, child id
-- Returns: per triple 'p' (pending: the parent's completion will be relayed to the child)
--   or the record to apply at once, "<ms>:<outcome>" (see _deps.lua): its last completion
--   while one is kept, a dead letter's "f" .. error (final unless delivery groups hold it),
--   its kept result, else "m" (no such event: done long ago, or never enqueued), or "v"
--   (vanished: it was linked, and left without a completion).
-- Guarantees: idempotent: a child linked already is not linked twice, so the audit may
-- link again whenever it likes. A parent is pending while its envelope is stored and it
-- is not a dead letter of a type without delivery groups. A child linked and neither
-- pending nor covered by a completion since (linked before the parent was enqueued, a
-- batch's member, see dep_prelink.lua, and the parent never came; or the parent left
-- without a completion) is unlinked and answered "v".
local now = clock_ms()
local fan = grouped()
local out, marked = {}, false
for i = 1, #ARGV, 3 do
  local pid, cshard, cid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local lkey = 'l:' .. pid .. '\0' .. cshard .. '\0' .. cid
  local dead = redis.call('ZSCORE', K_DEAD, pid)
  local live = redis.call('HEXISTS', K_EVENTS, pid) == 1 and (fan or not dead)
  local n = tonumber(redis.call('HGET', K_DEPS, lkey))
  if n and (live or dep_covered(pid, n)) then
    out[#out + 1] = 'p'  -- linked: the relay hands it the completion
  elseif live then
    if not marked then dep_mark() marked = true end  -- its acks now write completions
    n = redis.call('HINCRBY', K_DEPS, 'c:' .. pid, 1)
    redis.call('HSET', K_DEPS, 'k:' .. pid .. '\0' .. n, cshard .. '\0' .. cid, lkey, n)
    out[#out + 1] = 'p'
  elseif n then
    -- linked, yet gone without a completion (its last delivery group removed, moved
    -- to another layout, deleted by hand, never enqueued after its link): "vanished", a
    -- failure for the child's policy
    redis.call('HDEL', K_DEPS, lkey, 'k:' .. pid .. '\0' .. n)
    if n == 1 and tonumber(redis.call('HGET', K_DEPS, 'c:' .. pid)) == 1
        and redis.call('HEXISTS', K_DEPS, 'b:' .. pid) == 0 then
      redis.call('HDEL', K_DEPS, 'c:' .. pid)  -- its only link ever: nothing of it is left
    end
    out[#out + 1] = string.format('%.0f', now) .. ':v'
  else
    local record = redis.call('HGET', K_DEPS, 'f:' .. pid)
    if not record then
      local t = string.format('%.0f', now)
      local kept = redis.call('HGET', K_RESULTS, pid)
      if dead then
        record = t .. ':f' .. (redis.call('HGET', K_ERRORS, pid) or '')
      elseif kept and (tonumber(redis.call('ZSCORE', K_REXP, pid)) or 0) > now then
        record = t .. ':' .. kept
      else
        record = t .. ':m'
      end
    end
    out[#out + 1] = record
  end
end
return out
