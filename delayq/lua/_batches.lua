-- Batches (docs/WORKFLOWS.md, "Batches"): the helpers of the batch shards' scripts. Part
-- of the per-type scripts' helpers (see _prelude.lua); only batch_*.lua use them.
-- A batch shard (delayq/keyspace/shards.py: batch_shard) holds, per batch id B:
--   K_EVENTS    B -> '1' while B is not done: dep_link.lua then sees B live, so its
--               callbacks (children in K_DEPS, linked as any parent's) wait for it
--   K_DEPS, K_RELAY  B as a parent (see _deps.lua): its callbacks and, nested, the batch
--               it is a member of; its completion is dep_complete(B, outcome)
--   K_BINDEX    B -> when it was opened; K_BOPEN B -> when its open lease runs out;
--   K_BCLOSED   B -> when a member last finished (closed, members pending);
--   K_BDONE     B -> when it was done (removed after the retention)
--   K_BUNCONF   "B NUL ref" -> when the sweep settles an add not confirmed by then
--   K_BAUDIT    B -> when the sweep next links B's pending members again (closed B)
--   and its own keys (bkey(b, ...): b-th batch of the call, see keyspace/scripts.py):
--   B_REC       HASH: name, created, lease, closed, done (ms), total, pending, ok,
--               failed, unconf (adds not confirmed), parent (the batch it is a member
--               of), complete/success (the callbacks' "<type> NUL <id>"), outcome, last
--               (when a member last finished)
--   B_MEMBERS   HASH member ref "<type> NUL <id>" -> '' while pending, then the record
--               of its completion "<ms>:<outcome>" (see _deps.lua): its first one counts
--   B_FAILED    LIST: the refs of the members that failed, in that order
-- A member counts as succeeded when its outcome is "o" (done, with its result when its
-- type keeps results) or "m" (done before the batch could link it); else failed.

-- Whether a completion record "<ms>:<outcome>" counts as a failure.
local function batch_failure(record)
  local at = string.find(record, ':', 1, true) or 0
  local kind = string.sub(record, at + 1, at + 1)
  return kind ~= 'o' and kind ~= 'm'
end

-- Ends the script with WRONGTYPE when one of batch b's own keys holds the wrong type.
local function batch_check(b)
  local kinds = {'hash', 'hash', 'list'}
  for j = 1, 3 do
    local found = redis.call('TYPE', bkey(b, j)).ok
    if found ~= 'none' and found ~= kinds[j] then refuse_wrong_type(bkey(b, j), found, kinds[j]) end
  end
end

-- Batch `bid` (record `rec`) is done at `now`: every member finished and it is closed.
-- Its outcome goes to its children (callbacks, a parent batch) through the relay; true
-- when a completion now waits for the relay.
local function batch_complete(bid, rec, now)
  local got = redis.call('HMGET', rec, 'total', 'failed')
  local total, failed = tonumber(got[1]) or 0, tonumber(got[2]) or 0
  local outcome = 'o'
  if failed > 0 then outcome = 'f' .. failed .. ' of ' .. total .. ' members failed' end
  redis.call('HSET', rec, 'done', now, 'outcome', outcome)
  redis.call('HDEL', K_EVENTS, bid)
  redis.call('ZREM', K_BOPEN, bid)
  redis.call('ZREM', K_BCLOSED, bid)
  redis.call('ZREM', K_BAUDIT, bid)
  redis.call('ZADD', K_BDONE, now, bid)
  return dep_complete(bid, outcome, now)
end
