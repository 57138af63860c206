-- batch_counts: how many batches of a batch shard are in each state, and the relay's work
-- due there (service.batch_counts, the Prometheus gauges).
--
-- KEYS (delayq/keyspace/scripts.py): `relay`, `bopen`, `bclosed`, `bdone`, `bunconf`,
--   `baudit` of the batch shard.
-- ARGV[1] ms without a member finishing after which a waiting batch is stuck;
-- ARGV[2] ms an add may stay due in `bunconf` (no sweep settled it) before its batch is
-- stuck; ARGV[3] the most such adds looked at.
-- Returns: {now_ms, open, waiting, stuck, done, relay_due, relay_age_ms}: open and
--   waiting exclude the stuck ones (open past the lease; waiting with no member finished
--   for ARGV[1] ms; either, holding an add due for more than ARGV[2] ms); relay_due: done
--   batches' completions not handed on (`relay`), and the sweep's work due (open leases
--   run out, adds past their grace, audits past their time); relay_age_ms: how long the
--   oldest of them has been due (0: none).
-- Guarantees: read-only; ZCARDs and ZCOUNTs (O(log n)), one ZSCORE per batch with a stale
-- add (at most ARGV[3] adds looked at): the counts are exact whatever the number of
-- batches, but for a batch past the first ARGV[3] stale adds, counted open or waiting.
local now = clock_ms()
local idle, stale, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local open_stuck = redis.call('ZCOUNT', K_BOPEN, '-inf', '(' .. now)
local waiting_stuck = redis.call('ZCOUNT', K_BCLOSED, '-inf', now - idle)
local seen = {}
local adds = redis.call('ZRANGEBYSCORE', K_BUNCONF, '-inf', '(' .. (now - stale), 'LIMIT', 0, most)
for _, entry in ipairs(adds) do
  local bid = string.sub(entry, 1, (string.find(entry, '\0', 1, true) or 0) - 1)
  if not seen[bid] then
    seen[bid] = true
    local lease = tonumber(redis.call('ZSCORE', K_BOPEN, bid))
    if lease then
      if lease >= now then open_stuck = open_stuck + 1 end  -- (else counted already)
    else
      local last = tonumber(redis.call('ZSCORE', K_BCLOSED, bid))
      if last and last > now - idle then waiting_stuck = waiting_stuck + 1 end
    end
  end
end
local due, oldest = 0, now
local work = {K_RELAY, K_BOPEN, K_BUNCONF, K_BAUDIT}
for _, key in ipairs(work) do
  local n = redis.call('ZCOUNT', key, '-inf', now)
  if n > 0 then
    due = due + n
    oldest = math.min(oldest, tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]))
  end
end
return {
  now,
  redis.call('ZCARD', K_BOPEN) - open_stuck,
  redis.call('ZCARD', K_BCLOSED) - waiting_stuck,
  open_stuck + waiting_stuck,
  redis.call('ZCARD', K_BDONE),
  due,
  now - oldest,
}
