-- history_add: merge one process's aggregates into the per-type history rings.
--
-- KEYS (delayq/keyspace/scripts.py): `minute`, `coarse`, one pair per event type, the
--   minute ring then the coarse ring (HASHes, all under the prefix's hash tag {prefix}).
-- ARGV[1] slots in the minute ring, ARGV[2] seconds per coarse slot,
-- ARGV[3] slots in the coarse ring, ARGV[4] ring time to live in ms
-- ARGV[5..] one MessagePack array per type: [handled, failed, b1, ..., bN(, cancelled)]
--           (bN: deliveries whose lateness fell in bucket N; cancelled: runs stopped
--           by cancel(), sent only when not 0)
-- Returns: Redis's time in seconds.
-- Guarantees: each ring is a HASH with at most its slot count of fields
-- (field = slot number = period index modulo the slot count; value =
-- MessagePack [period index, handled, failed, b1..bN]), so its size is capped
-- whatever the traffic; a field left from an earlier lap is overwritten, not
-- added to. Counts from several processes in one period add up (a shorter
-- array adds 0 to the columns it lacks, which are kept). Redis's clock names the
-- period.
local now = tonumber(redis.call('TIME')[1])
local rings = {
  {60, tonumber(ARGV[1])},
  {tonumber(ARGV[2]), tonumber(ARGV[3])},
}
local ttl = ARGV[4]
local function merge(key, period, slots, add)
  local index = math.floor(now / period)
  local field = tostring(index % slots)
  local merged = {index}
  local old = redis.call('HGET', key, field)
  local prev = nil
  if old then
    local ok, decoded = pcall(cmsgpack.unpack, old)
    -- a value from an earlier lap (or not ours) is replaced, not added to
    if ok and type(decoded) == 'table' and decoded[1] == index then prev = decoded end
  end
  local width = #add
  if prev and #prev - 1 > width then width = #prev - 1 end
  for i = 1, width do
    merged[i + 1] = (add[i] or 0) + ((prev and prev[i + 1]) or 0)
  end
  redis.call('HSET', key, field, cmsgpack.pack(merged))
  redis.call('PEXPIRE', key, ttl)
end
for i = 5, #ARGV do
  local add = cmsgpack.unpack(ARGV[i])
  merge(block_key(i - 4, B_MINUTE), rings[1][1], rings[1][2], add)
  merge(block_key(i - 4, B_COARSE), rings[2][1], rings[2][2], add)
end
return now
