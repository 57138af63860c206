-- members: the live scheduler processes of a prefix that has partitioned types.
--
-- KEYS (delayq/keyspace/scripts.py): `members`: {prefix}:schedulers, ZSET token ->
--   heartbeat deadline (ms, Redis clock).
-- ARGV[1] the caller's token, ARGV[2] heartbeat time to live in ms
-- ARGV[3] 'beat' (add or refresh the caller), 'leave' (remove the caller),
--         'evict:<token>' (remove another member: it left a partition it owns
--         overdue, so it is dead or stalled; a live one adds itself back on
--         its next beat), or 'read' (change nothing)
-- ARGV[4] the wake-up channel: a beat that adds the caller (it joins, or comes
--         back after an eviction or an expiry), 'leave' and 'evict' publish
--         ':members' there so every scheduler reads the membership again at once
-- Returns: {added, token...}: added is 1 when this beat added the caller (it was
--   not a member), else 0; then the tokens of the live members (expired ones are
--   removed first).
-- Guarantees: one key, so one slot; membership only spreads work: every move
-- is atomic on its own, so two processes that disagree on it for a moment
-- just move some partitions twice as often, never an event twice.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[3]
redis.call('ZREMRANGEBYSCORE', K_MEMBERS, '-inf', now)
local added = 0
if mode == 'beat' then
  added = redis.call('ZADD', K_MEMBERS, now + tonumber(ARGV[2]), ARGV[1])
  if added == 1 then redis.call('PUBLISH', ARGV[4], ':members') end
elseif mode == 'leave' then
  if redis.call('ZREM', K_MEMBERS, ARGV[1]) == 1 then redis.call('PUBLISH', ARGV[4], ':members') end
elseif string.sub(mode, 1, 6) == 'evict:' then
  if redis.call('ZREM', K_MEMBERS, string.sub(mode, 7)) == 1 then
    redis.call('PUBLISH', ARGV[4], ':members')
  end
end
local reply = redis.call('ZRANGE', K_MEMBERS, 0, -1)
table.insert(reply, 1, added)
return reply
