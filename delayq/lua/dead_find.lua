-- dead_find: dead letters whose last error contains a text, oldest first.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `attempts`, `errors`, `dead` of the type,
--   or one delivery group's read view.
-- ARGV[1] offset: the position in the dead set to start looking at
-- ARGV[2] how many dead letters to look at, at most (the caller bounds it)
-- ARGV[3] the most matches to return
-- ARGV[4] the text, lower case (matched against the lower-cased error, plainly)
-- Returns: {next offset, id, failed_at_ms, envelope or false, attempts or false,
--           error, ...}; next offset is the position after the last dead letter
--           looked at (where a further search continues).
-- Guarantees: read-only; one consistent view; the work is bounded by ARGV[2]
-- (a ZRANGE by rank and one HGET per dead letter looked at).
local start, scan, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local needle = ARGV[4]
local ids = redis.call('ZRANGE', K_DEAD, start, start + scan - 1, 'WITHSCORES')
local result = {0}
local found, looked = 0, 0
for i = 1, #ids, 2 do
  looked = looked + 1
  local id = ids[i]
  local err = redis.call('HGET', K_ERRORS, id)
  if err and string.find(string.lower(err), needle, 1, true) then
    result[#result + 1] = id
    result[#result + 1] = ids[i + 1]
    result[#result + 1] = redis.call('HGET', K_EVENTS, id)
    result[#result + 1] = redis.call('HGET', K_ATTEMPTS, id)
    result[#result + 1] = err
    found = found + 1
    if found >= limit then break end
  end
end
result[1] = start + looked
return result
