-- dead_list: read dead letters, oldest first.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `attempts`, `errors`, `dead` of the type,
--   or one group's read view.
-- ARGV[1] offset, ARGV[2] limit
-- Returns: {id, failed_at_ms, envelope or false, attempts or false,
--           error or false, ...}
-- Guarantees: a consistent view of each dead letter (one atomic read).
local ids = redis.call('ZRANGE', K_DEAD, ARGV[1], tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1,
  'WITHSCORES')
return append_records({}, ids)
