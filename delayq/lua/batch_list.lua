-- batch_list: the batches of a batch shard in one state, newest first (service.batches).
--
-- KEYS (delayq/keyspace/scripts.py): `bindex`, `bopen`, `bclosed`, `bdone`, `bunconf` of
--   the batch shard.
-- ARGV[1] the state: 'all', 'open', 'waiting', 'done' or 'stuck'; ARGV[2] the most ids;
-- ARGV[3] ms without a member finishing after which a waiting batch is stuck
-- Returns: {now_ms, batch id, created ms, ...} newest first.
-- Guarantees: read-only; reads at most ARGV[2] ids of each set it looks at (stuck: the
-- open ones past their lease, the waiting ones idle too long, those with an add not
-- confirmed past its grace).
local state, limit, idle = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock_ms()
local ids = {}
if state == 'all' then
  ids = redis.call('ZREVRANGE', K_BINDEX, 0, limit - 1)
elseif state == 'open' then
  ids = redis.call('ZRANGE', K_BOPEN, 0, limit - 1)
elseif state == 'waiting' then
  ids = redis.call('ZRANGE', K_BCLOSED, 0, limit - 1)
elseif state == 'done' then
  ids = redis.call('ZREVRANGE', K_BDONE, 0, limit - 1)
else
  local seen = {}
  local function take(list)
    for _, bid in ipairs(list) do
      if not seen[bid] then
        seen[bid] = true
        ids[#ids + 1] = bid
      end
    end
  end
  take(redis.call('ZRANGEBYSCORE', K_BOPEN, '-inf', now, 'LIMIT', 0, limit))
  take(redis.call('ZRANGEBYSCORE', K_BCLOSED, '-inf', now - idle, 'LIMIT', 0, limit))
  local adds = redis.call('ZRANGEBYSCORE', K_BUNCONF, '-inf', now, 'LIMIT', 0, limit)
  local bids = {}
  for _, entry in ipairs(adds) do
    bids[#bids + 1] = string.sub(entry, 1, (string.find(entry, '\0', 1, true) or 0) - 1)
  end
  take(bids)
end
local out = {now}
for _, bid in ipairs(ids) do
  out[#out + 1] = bid
  out[#out + 1] = redis.call('ZSCORE', K_BINDEX, bid) or '0'
end
return out
