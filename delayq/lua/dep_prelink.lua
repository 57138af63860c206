-- dep_prelink: batch members about to be enqueued learn of their batch first (an add's
-- step between `batch_add.lua` and the enqueue; see delayq/operations/batches.py): the
-- batch becomes each member's child, as dep_link.lua makes it, whether or not the member
-- exists yet, so the member's completion reaches the batch however soon it comes.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `dead`, `meta`, `groups`, `dedup`, `deps`
--   of the members' type (shard): the shard the enqueue writes them to.
-- ARGV[1] the batch's shard, ARGV[2] the batch id, then pairs member id, 'n' or 'u': what
--   batch_add.lua answered for it ('u': an earlier add of it is not confirmed: it may have
--   enqueued the member, which may be done since).
-- Returns: per pair 'e' (enqueue it: linked now, or linked by an earlier add that did not
--   enqueue it; or a dead letter, which the enqueue keeps and whose record the link after
--   the enqueue answers), 'p' (linked, and pending: enqueued already), 'd' (linked, and
--   done since: its completion reaches the batch through the relay), 'x' (a 'u' member
--   not linked here: not linked now; ask the batch again, then link it as 'n': its earlier
--   add died before this step, or its completion was handed to the batch since).
-- Guarantees: idempotent; a member enqueued after this step (by anyone) hands its
-- completion to the batch, and an add answered 'p' or 'd' does not enqueue it again (a
-- retried member adding again never runs a member twice). A member linked here and never
-- enqueued is unlinked by the sweep's link (dep_link.lua: "v"), which drops it from the
-- batch.
check_keys('events', 'dead', 'meta', 'dedup', 'deps')
local bshard, bid = ARGV[1], ARGV[2]
local fan = grouped()
local out, marked = {}, false
for i = 3, #ARGV, 2 do
  local id, mode = ARGV[i], ARGV[i + 1]
  local lkey = 'l:' .. id .. '\0' .. bshard .. '\0' .. bid
  local n = tonumber(redis.call('HGET', K_DEPS, lkey))
  local exists = redis.call('HEXISTS', K_EVENTS, id) == 1
  local live = exists and (fan or not redis.call('ZSCORE', K_DEAD, id))
  if n then
    if live then
      out[#out + 1] = 'p'
    elseif dep_covered(id, n) then
      out[#out + 1] = 'd'
    else
      out[#out + 1] = 'e'
    end
  elseif mode == 'u' then
    out[#out + 1] = 'x'
  elseif exists and not live then
    out[#out + 1] = 'e'  -- a dead letter: not a parent to link (dep_link answers its record)
  else
    if not marked then dep_mark() marked = true end  -- its acks now write completions
    n = redis.call('HINCRBY', K_DEPS, 'c:' .. id, 1)
    redis.call('HSET', K_DEPS, 'k:' .. id .. '\0' .. n, bshard .. '\0' .. bid, lkey, n)
    out[#out + 1] = 'e'
  end
end
return out
