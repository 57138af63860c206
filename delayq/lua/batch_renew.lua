-- batch_renew: the open batch's block is still running: its open lease is extended.
--
-- KEYS (delayq/keyspace/scripts.py): `bopen` of the batch shard, then the batch's own
--   `brec`, `bmembers`, `bfailed` (see _batches.lua).
-- ARGV[1] batch id, ARGV[2] the lease (ms from now)
-- Returns: 1 renewed, 0 the batch is not open any more (closed by the sweep: its lease
--   ran out first; adds are then refused).
-- Guarantees: only an open batch's lease moves (never one closed).
local bid, lease = ARGV[1], tonumber(ARGV[2])
if not redis.call('ZSCORE', K_BOPEN, bid) then return 0 end
local now = clock_ms()
redis.call('ZADD', K_BOPEN, now + lease, bid)
redis.call('HSET', bkey(1, B_REC), 'lease', now + lease)
return 1
