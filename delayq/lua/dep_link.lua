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
-- is not a dead letter of a type without delivery groups.
local now = clock_ms()
local fan = grouped()
local out, marked = {}, false
for i = 1, #ARGV, 3 do
  local pid, cshard, cid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local lkey = 'l:' .. pid .. '\0' .. cshard .. '\0' .. cid
  local dead = redis.call('ZSCORE', K_DEAD, pid)
  local live = redis.call('HEXISTS', K_EVENTS, pid) == 1 and (fan or not dead)
  if redis.call('HEXISTS', K_DEPS, lkey) == 1
      and (live or redis.call('HEXISTS', K_DEPS, 'f:' .. pid) == 1) then
    out[#out + 1] = 'p'  -- linked: the relay hands it the completion
  elseif live then
    if not marked then dep_mark() marked = true end  -- its acks now write completions
    local n = redis.call('HINCRBY', K_DEPS, 'c:' .. pid, 1)
    redis.call('HSET', K_DEPS, 'k:' .. pid .. '\0' .. n, cshard .. '\0' .. cid, lkey, n)
    out[#out + 1] = 'p'
  else
    local record = redis.call('HGET', K_DEPS, 'f:' .. pid)
    local n = redis.call('HGET', K_DEPS, lkey)
    if not record and n then
      -- linked, yet gone without a completion (its last delivery group removed, moved
      -- to another layout, deleted by hand): "vanished", a failure for the child's policy
      redis.call('HDEL', K_DEPS, lkey, 'k:' .. pid .. '\0' .. n)
      record = string.format('%.0f', now) .. ':v'
    elseif not record then
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
