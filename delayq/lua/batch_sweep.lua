-- batch_sweep: the relay's look at a batch shard: open batches whose lease ran out (their
-- producer died), adds not confirmed within their grace, done batches past the retention,
-- closed batches whose pending members are due to be linked again (the audit).
--
-- KEYS (delayq/keyspace/scripts.py): `bopen`, `bclosed`, `bdone`, `bunconf`, `baudit` of
--   the batch shard.
-- ARGV[1] the most of each kind read, ARGV[2] the retention (ms), ARGV[3] grace (ms): when
-- an unconfirmed add read now is looked at again if this look does not settle it,
-- ARGV[4], ARGV[5]: a batch is audited once no member of it has finished for ARGV[4] ms,
-- then again as long after as none has finished, at most ARGV[5] ms after
-- Returns: {now_ms, next_ms, n, batch id * n, m, "<batch id> NUL <ref>" * m, k,
--   batch id * k, a, batch id * a}: the batches to close, the adds to settle, the batches
--   to remove, the batches to audit; next_ms when the next of them is due (-1: none).
-- Guarantees: reads, but for the unconfirmed adds' and audits' next looks (settling and
-- auditing are idempotent: a relay that dies after this step loses nothing; see the
-- relay's batch sweep).
local now = clock_ms()
local limit, retention, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local floor, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {now, -1}
local expired = redis.call('ZRANGEBYSCORE', K_BOPEN, '-inf', now, 'LIMIT', 0, limit)
out[#out + 1] = #expired
for _, bid in ipairs(expired) do out[#out + 1] = bid end
local adds = redis.call('ZRANGEBYSCORE', K_BUNCONF, '-inf', now, 'LIMIT', 0, limit)
out[#out + 1] = #adds
for _, entry in ipairs(adds) do
  redis.call('ZADD', K_BUNCONF, now + grace, entry)
  out[#out + 1] = entry
end
local old = redis.call('ZRANGEBYSCORE', K_BDONE, '-inf', now - retention, 'LIMIT', 0, limit)
out[#out + 1] = #old
for _, bid in ipairs(old) do out[#out + 1] = bid end
local due = redis.call('ZRANGEBYSCORE', K_BAUDIT, '-inf', now, 'LIMIT', 0, limit)
local audits = {}
for _, bid in ipairs(due) do
  local last = tonumber(redis.call('ZSCORE', K_BCLOSED, bid)) or 0
  if now - last < floor then
    redis.call('ZADD', K_BAUDIT, last + floor, bid)  -- a member finished lately: not yet
  else
    redis.call('ZADD', K_BAUDIT, now + math.min(cap, now - last), bid)
    audits[#audits + 1] = bid
  end
end
out[#out + 1] = #audits
for _, bid in ipairs(audits) do out[#out + 1] = bid end
local nexts = {}
local first = redis.call('ZRANGE', K_BOPEN, 0, 0, 'WITHSCORES')
if first[2] then nexts[#nexts + 1] = tonumber(first[2]) end
first = redis.call('ZRANGE', K_BUNCONF, 0, 0, 'WITHSCORES')
if first[2] then nexts[#nexts + 1] = tonumber(first[2]) end
first = redis.call('ZRANGE', K_BAUDIT, 0, 0, 'WITHSCORES')
if first[2] then nexts[#nexts + 1] = tonumber(first[2]) end
first = redis.call('ZRANGE', K_BDONE, 0, 0, 'WITHSCORES')
if first[2] then nexts[#nexts + 1] = tonumber(first[2]) + retention end
for _, t in ipairs(nexts) do
  if out[2] < 0 or t < out[2] then out[2] = t end
end
return out
