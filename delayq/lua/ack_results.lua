-- ack_results: ack.lua for a type that keeps results (results= class option): the
-- handlers' return values are kept in the same step that removes their events.
--
-- KEYS (delayq/keyspace/scripts.py): ack.lua's (`events`, `ready`, `inflight`, `leases`,
--   `attempts`, `errors`, `meta`, `pending`, `limits`, `wake`, `dedup`,
--   `fkeys`, `klines`, `krot`, `kwait`, `krun` of the group), then `results` and `rexp`.
--   then `prio` (_levels.lua), then `deps`, `relay` (only for a type with dependencies)
-- ARGV[1] how long a result is kept (ms), ARGV[2] the prefix's results channel,
-- ARGV[3] the shard, then triples id, token, record ("o" .. mark .. value, see
-- delayq/results.py).
-- Returns: how many events were removed (as ack.lua; with the ids of completed parents,
-- whose completion records then carry the kept result; -1 as ack.lua's).
-- Guarantees: a result is written exactly when its ack removes (or, with delivery
-- groups, releases) the event: a stale ack writes nothing. Each group's ack
-- overwrites the record, so the value kept is the last group's. Expired records
-- (rexp, Redis time) are swept, up to 16 per call, before the new ones are written.
-- Each result kept publishes "<shard> <id>" on the channel (a wake-up only: readers
-- re-check on a timer too).

-- ack.lua's body (inserted by delayq/lua/__init__.py), run on the pairs given
local function ack(ARGV)
--@ack.lua
end

local keep, channel, shard = tonumber(ARGV[1]), ARGV[2], ARGV[3]
-- a type with dependencies without their keys: nothing written, -1 (as ack.lua)
if not K_DEPS and redis.call('EXISTS', K_DEDUP) == 1 and dep_marked() then return -1 end
check_keys('results', 'rexp')
local now = clock_ms()
local old = redis.call('ZRANGEBYSCORE', K_REXP, '-inf', now, 'LIMIT', 0, 16)
for _, id in ipairs(old) do
  redis.call('HDEL', K_RESULTS, id)
  redis.call('ZREM', K_REXP, id)
end
local pairs_, kept = {}, {}
for i = 4, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  pairs_[#pairs_ + 1] = id
  pairs_[#pairs_ + 1] = token
  -- written before the ack: a key of the wrong type stops the script before any change
  if redis.call('HGET', K_LEASES, id) == token then
    redis.call('HSET', K_RESULTS, id, ARGV[i + 2])
    redis.call('ZADD', K_REXP, now + keep, id)
    kept[#kept + 1] = id
  end
end
local removed = ack(pairs_)
for _, id in ipairs(kept) do
  redis.call('PUBLISH', channel, shard .. ' ' .. id)
end
if type(removed) == 'table' then
  -- completed parents: their children are handed the kept result with the outcome
  for j = 2, #removed do
    local id = removed[j]
    local value = redis.call('HGET', K_RESULTS, id)
    local hi = redis.call('HGET', K_DEPS, 'c:' .. id)
    local record = string.format('%.0f', now) .. ':' .. value
    redis.call('HSET', K_DEPS, 'f:' .. id, record, 'r:' .. id .. '\0' .. hi, record)
  end
end
return removed
