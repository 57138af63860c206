-- batch_apply: members' completions reach their batches (the relay's step, and an add's
-- for members done before they were linked); a batch whose last member finished, once
-- closed, is done.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `deps`, `relay`, `bopen`, `bclosed`,
--   `bdone`, `bunconf`, `baudit` of the batch shard, then per batch of the call its own `brec`,
--   `bmembers`, `bfailed` (see _batches.lua).
-- ARGV: per batch: its id, n, then n pairs member ref, record ("<ms>:<outcome>", see
--   _deps.lua; '' drops the member if its add is still not confirmed: it was never
--   enqueued).
-- Returns: {ignored, batch id...}: how many completions were for batches done (or
--   gone), then the batches done now whose completion waits for the relay.
-- Guarantees: idempotent and O(1) per completion: a member takes its first outcome (a
-- record for a member that has one changes nothing), and the counts move once per
-- member. A completion for a member the batch does not know (dropped by the sweep, then
-- enqueued by a very slow add) is counted while the batch is not done. Applying a
-- record also confirms the member's add.
local now = clock_ms()
local ignored, completed = 0, {}
local i, b = 1, 0
while i <= #ARGV do
  b = b + 1
  local bid, n = ARGV[i], tonumber(ARGV[i + 1])
  local rec, members, failed_list = bkey(b, B_REC), bkey(b, B_MEMBERS), bkey(b, B_FAILED)
  local state = redis.call('HMGET', rec, 'created', 'closed', 'done')
  if not state[1] or state[3] then
    ignored = ignored + n
  else
    local total, pending, ok, failed, unconf = 0, 0, 0, 0, 0
    for j = i + 2, i + 1 + 2 * n, 2 do
      local ref, record = ARGV[j], ARGV[j + 1]
      local key = bid .. '\0' .. ref
      local cur = redis.call('HGET', members, ref)
      if record == '' then
        if cur == '' and redis.call('ZREM', K_BUNCONF, key) == 1 then
          redis.call('HDEL', members, ref)
          total, pending, unconf = total - 1, pending - 1, unconf - 1
        end
      elseif not cur or cur == '' then
        redis.call('HSET', members, ref, record)
        if cur then
          pending = pending - 1
          unconf = unconf - redis.call('ZREM', K_BUNCONF, key)
        else
          total = total + 1
        end
        if batch_failure(record) then
          failed = failed + 1
          redis.call('RPUSH', failed_list, ref)
        else
          ok = ok + 1
        end
      end
    end
    if ok + failed > 0 then redis.call('HSET', rec, 'last', now) end
    if total ~= 0 then redis.call('HINCRBY', rec, 'total', total) end
    if ok ~= 0 then redis.call('HINCRBY', rec, 'ok', ok) end
    if failed ~= 0 then redis.call('HINCRBY', rec, 'failed', failed) end
    if unconf ~= 0 then redis.call('HINCRBY', rec, 'unconf', unconf) end
    local left = redis.call('HINCRBY', rec, 'pending', pending)
    if state[2] then
      if left <= 0 then
        if batch_complete(bid, rec, now) then completed[#completed + 1] = bid end
      elseif ok + failed > 0 then
        redis.call('ZADD', K_BCLOSED, now, bid)
      end
    end
  end
  i = i + 2 + 2 * n
end
return {ignored, unpack(completed)}
