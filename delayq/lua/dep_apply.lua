-- dep_apply: parents' outcomes reach their children's slot (the relay's and the linking
-- caller's step); a child whose last parent is done stops waiting.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `errors`, `dead`, `meta`,
--   `groups`, `deps`, `relay`, `waiting`, then `results`, `rexp` of the children's type
--   (shard).
-- ARGV[1] wake-up channel, ARGV[2] the shard's name (published on it)
-- ARGV[3] how long the type keeps results (ms; '' for a type without results=)
-- ARGV[4] the results channel
-- ARGV[5..] triples: child id, "<parent type> NUL <parent id>", record ("<ms>:<outcome>")
-- Returns: {released, dead, skipped, parent...}: children that became due, that became
--   dead letters (ParentFailed), that were skipped; then the ids of those of them that are
--   parents in turn and whose own completion now waits for the relay.
-- Guarantees: idempotent: an edge takes the first record it is given (a record for an
-- edge done already, or for a child that is gone, changes nothing), and the count of
-- parents left drops once per edge. A released child is due at the later of its own due
-- time and its last parent's completion, in the type's schedule (the scheduler moves it,
-- woken as by an enqueue). With a failed parent (a dead letter, cancelled, skipped, or
-- vanished: gone without a completion)
-- the policy decides: 'fail' makes the child a dead letter with the error
-- "ParentFailed: ..." (its own children then see it failed: and so on down a chain),
-- 'skip' removes it (counted in meta's `skipped`), 'run' runs it.
check_keys('events', 'scheduled', 'errors', 'dead', 'meta', 'deps', 'relay', 'waiting')
local now = clock_ms()
local channel, shard, keep, rchannel = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local released, dead, skipped, parents = 0, 0, 0, {}

local function failure(record)
  local c = string.sub(record, (string.find(record, ':', 1, true) or 0) + 1, -1)
  local kind = string.sub(c, 1, 1)
  if kind == 'f' or kind == 'c' or kind == 's' or kind == 'v' then return kind, string.sub(c, 2) end
  return nil
end

local function finish(id)
  local w = redis.call('HGET', K_DEPS, 'w:' .. id)
  local own = tonumber(redis.call('ZSCORE', K_WAITING, id))
  if not w or not own then return end
  local fields, rec = dep_fields(id, w)
  local latest, failed = 0, nil
  for j = 3, #fields, 1000 do
    local got = redis.call('HMGET', K_DEPS, unpack(fields, j, math.min(#fields, j + 999)))
    for k, record in ipairs(got) do
      local t = tonumber(string.match(record or '', '^(%d+):')) or 0
      if t > latest then latest = t end
      if not failed and record then
        local kind, detail = failure(record)
        if kind then
          local n = j + k - 1  -- field n is parent (n - 2) of the record
          local what = ({f = 'failed', c = 'was cancelled', s = 'was skipped',
            v = 'vanished'})[kind]
          failed = 'ParentFailed: ' .. rec[2 * (n - 2) + 1] .. ' ' .. rec[2 * (n - 2) + 2]
            .. ' ' .. what .. (detail ~= '' and (' (' .. detail .. ')') or '')
        end
      end
    end
  end
  redis.call('ZREM', K_WAITING, id)
  redis.call('ZREM', K_RELAY, 'a\0' .. id)
  local policy = rec[1]
  if failed and policy == 'fail' then
    redis.call('ZADD', K_DEAD, now, id)
    redis.call('HSET', K_ERRORS, id, failed)
    if keep then
      redis.call('HSET', K_RESULTS, id, 'f' .. failed)
      redis.call('ZADD', K_REXP, now + keep, id)
      redis.call('PUBLISH', rchannel, shard .. ' ' .. id)
    end
    dead = dead + 1
    if dep_complete(id, 'f' .. failed, now) then parents[#parents + 1] = id end
  elseif failed and policy == 'skip' then
    redis.call('HDEL', K_EVENTS, id)
    dep_forget(id)
    redis.call('HINCRBY', K_META, 'skipped', 1)
    skipped = skipped + 1
    if dep_complete(id, 's', now) then parents[#parents + 1] = id end
  else
    local due = own
    if latest > due then due = latest end
    schedule(id, due, channel, shard, K_SCHEDULED)
    released = released + 1
  end
end

for i = 5, #ARGV, 3 do
  local id = ARGV[i]
  local field = 'e:' .. id .. '\0' .. ARGV[i + 1]
  if redis.call('HGET', K_DEPS, field) == '' then
    redis.call('HSET', K_DEPS, field, ARGV[i + 2])
    if redis.call('HINCRBY', K_DEPS, 'n:' .. id, -1) <= 0 then finish(id) end
  end
end
return {released, dead, skipped, unpack(parents)}
