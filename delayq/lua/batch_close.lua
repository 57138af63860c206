-- batch_close: a batch's block ended (or its open lease ran out: the sweep's call): it is
-- closed, and done at once if no member is pending.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `deps`, `relay`, `bopen`, `bclosed`,
--   `bdone`, `baudit` of the batch shard, then the batch's own `brec`, `bmembers`, `bfailed` (see
--   _batches.lua).
-- ARGV[1] batch id, ARGV[2] 'close' (its producer) or 'sweep' (only if its lease ran out),
-- ARGV[3] ms until the sweep first links its pending members again (see batch_sweep.lua)
-- Returns: 0 nothing changed (no such batch, closed already, or its lease not out), 1
--   closed (members pending), 2 closed and done, 3 closed and done with a completion
--   waiting for the relay (its callbacks, a parent batch).
-- Guarantees: a batch is closed once; closing it again changes nothing.
local bid, mode = ARGV[1], ARGV[2]
local rec = bkey(1, B_REC)
local got = redis.call('HMGET', rec, 'created', 'closed', 'pending')
if not got[1] or got[2] then
  redis.call('ZREM', K_BOPEN, bid)  -- (a batch gone or closed is not open)
  return 0
end
local now = clock_ms()
if mode == 'sweep' then
  local lease = tonumber(redis.call('ZSCORE', K_BOPEN, bid))
  if lease and lease > now then return 0 end
end
redis.call('HSET', rec, 'closed', now)
redis.call('ZREM', K_BOPEN, bid)
if (tonumber(got[3]) or 0) <= 0 then
  if batch_complete(bid, rec, now) then return 3 end
  return 2
end
redis.call('ZADD', K_BCLOSED, now, bid)
redis.call('ZADD', K_BAUDIT, now + tonumber(ARGV[3]), bid)
return 1
