-- batch_add: the first step of adding members to a batch: the batch learns of them
-- before they are enqueued.
--
-- KEYS (delayq/keyspace/scripts.py): `bunconf` of the batch shard, then the batch's own
--   `brec`, `bmembers`, `bfailed` (see _batches.lua).
-- ARGV[1] batch id, ARGV[2] grace (ms): when the sweep settles an add not confirmed by
-- then, ARGV[3] the adder: '' (the batch's producer) or a member's ref (a running member
-- adding to its own batch), ARGV[4..] member refs "<type> NUL <id>".
-- Returns: {'a', answer per ref}: 'n' new (pending, not confirmed: enqueue it, link it,
--   confirm it), 'u' pending, not confirmed yet (an earlier add of it has not finished:
--   enqueue it again, which keeps an existing event, and link it), 'p' pending and linked
--   (nothing to do), 'd' done (not enqueued again); or {'x'} no such batch, {'d'} the
--   batch is done, {'c'} it is closed (only a pending member may add to a closed batch).
-- Guarantees: a member is counted once whatever adds it how often (the members hash
-- holds each ref once, and its first outcome). A new member counts as pending at once,
-- so the batch cannot complete before it does; an add that is never confirmed (its
-- producer died) is settled by the sweep after its grace (see batch_sweep.lua).
local bid, grace, adder = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local rec, members = bkey(1, B_REC), bkey(1, B_MEMBERS)
local got = redis.call('HMGET', rec, 'created', 'closed', 'done')
if not got[1] then return {'x'} end
if got[3] then return {'d'} end
if got[2] and (adder == '' or redis.call('HGET', members, adder) ~= '') then return {'c'} end
check_keys('bunconf')
batch_check(1)
local now = clock_ms()
local out, new = {'a'}, 0
for i = 4, #ARGV do
  local ref = ARGV[i]
  local v = redis.call('HGET', members, ref)
  if not v then
    redis.call('HSET', members, ref, '')
    redis.call('ZADD', K_BUNCONF, now + grace, bid .. '\0' .. ref)
    new = new + 1
    out[#out + 1] = 'n'
  elseif v ~= '' then
    out[#out + 1] = 'd'
  elseif redis.call('ZSCORE', K_BUNCONF, bid .. '\0' .. ref) then
    out[#out + 1] = 'u'
  else
    out[#out + 1] = 'p'
  end
end
if new > 0 then
  redis.call('HINCRBY', rec, 'total', new)
  redis.call('HINCRBY', rec, 'pending', new)
  redis.call('HINCRBY', rec, 'unconf', new)
end
return out
