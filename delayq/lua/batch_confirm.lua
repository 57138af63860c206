-- batch_confirm: the last step of adding members: those linked (their completions will
-- reach the batch through the relay) are confirmed.
--
-- KEYS (delayq/keyspace/scripts.py): `bunconf` of the batch shard, then the batch's own
--   `brec`, `bmembers`, `bfailed` (see _batches.lua).
-- ARGV[1] batch id, ARGV[2..] member refs
-- Returns: how many were confirmed now.
-- Guarantees: idempotent (a ref confirmed already, or settled by the sweep, changes
-- nothing).
local bid = ARGV[1]
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZREM', K_BUNCONF, bid .. '\0' .. ARGV[i])
end
if n > 0 and redis.call('EXISTS', bkey(1, B_REC)) == 1 then
  redis.call('HINCRBY', bkey(1, B_REC), 'unconf', -n)
end
return n
