-- batch_open: a batch is opened (service.batch()), its callbacks and the batch it is
-- nested in (if any) linked as its children.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `deps`, `relay`, `bindex`, `bopen` of the
--   batch shard, then the batch's own `brec`, `bmembers`, `bfailed` (see _batches.lua).
-- ARGV[1] batch id, ARGV[2] name ('' none), ARGV[3] the open lease (ms),
-- ARGV[4] the id of the batch it is a member of ('' none), ARGV[5], ARGV[6] the
-- on_complete and on_success callbacks as "<type> NUL <id>" ('' none), then pairs child
-- shard, child id: its children (the callbacks, the parent batch) to link.
-- Returns: 1 opened, 0 it existed (nothing changed).
-- Guarantees: the batch is written whole (record, live in `events`, open lease, linked
-- children) before any member or callback exists: its callbacks are enqueued after this
-- step (waiting for it, see dep_wait.lua), so a producer that dies in between leaves a
-- batch the lease's sweep closes (it completes, handing its outcome to no one), never a
-- callback that waits for a batch that does not exist.
check_keys('events', 'deps', 'relay', 'bindex', 'bopen')
batch_check(1)
local rec = bkey(1, B_REC)
if redis.call('EXISTS', rec) == 1 then return 0 end
local bid, name, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock_ms()
redis.call('HSET', rec, 'created', now, 'lease', now + lease, 'total', 0, 'pending', 0,
  'ok', 0, 'failed', 0, 'unconf', 0)
if name ~= '' then redis.call('HSET', rec, 'name', name) end
if ARGV[4] ~= '' then redis.call('HSET', rec, 'parent', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', rec, 'complete', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', rec, 'success', ARGV[6]) end
redis.call('HSET', K_EVENTS, bid, '1')
redis.call('ZADD', K_BINDEX, now, bid)
redis.call('ZADD', K_BOPEN, now + lease, bid)
for i = 7, #ARGV, 2 do
  local cshard, cid = ARGV[i], ARGV[i + 1]
  local lkey = 'l:' .. bid .. '\0' .. cshard .. '\0' .. cid
  if redis.call('HEXISTS', K_DEPS, lkey) == 0 then
    local n = redis.call('HINCRBY', K_DEPS, 'c:' .. bid, 1)
    redis.call('HSET', K_DEPS, 'k:' .. bid .. '\0' .. n, cshard .. '\0' .. cid, lkey, n)
  end
end
return 1
