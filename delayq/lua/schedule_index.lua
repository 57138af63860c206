-- schedule_index: the prefix's index of schedules (where each lives, when it next fires).
--
-- KEYS (delayq/keyspace/scripts.py): `index`, `homes`: `{p}:schedules` ZSET name -> next
--   fire (unix ms) of every active schedule; `{p}:schedule-homes` HASH name ->
--   "<gen>|<shard>" ('' shard: removed).
-- ARGV[1] wake-up channel, ARGV[2] '1' to publish ':schedules' on it after a change
-- ARGV[3] a MessagePack array, 4 per schedule: name, gen, shard ('' when
--   removed), next fire ms ('' when it fires no more: paused, ended or removed)
-- Returns: how many entries were applied.
-- Guarantees: the index lives under the prefix's hash tag and the schedules
--   under their types' (another cluster slot), so it cannot change in the
--   same script as a schedule. It is news of the schedule's state, tagged
--   with the state's gen: news older than what the index holds is refused,
--   so a slow process can never move a schedule's next fire later than its
--   state says (a stale index entry is at worst early: the firer then looks,
--   finds nothing due and writes the true time).
local applied = 0
local items = cmsgpack.unpack(ARGV[3])
for i = 1, #items, 4 do
  local name, gen, shard, next_ms = items[i], tonumber(items[i + 1]), items[i + 2], items[i + 3]
  local home = redis.call('HGET', K_HOMES, name)
  local known = home and tonumber(string.match(home, '^(%d+)|')) or -1
  if gen >= known then
    applied = applied + 1
    redis.call('HSET', K_HOMES, name, string.format('%.0f', gen) .. '|' .. shard)
    if next_ms == '' then
      redis.call('ZREM', K_INDEX, name)
    else
      redis.call('ZADD', K_INDEX, next_ms, name)
    end
  end
end
if applied > 0 and ARGV[2] == '1' then redis.call('PUBLISH', ARGV[1], ':schedules') end
return applied
