-- ready_list: one page of ready events (queued for a consumer, not claimed yet),
-- in the order consumers get them.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `queued`, `attempts`, `errors` of the type,
--   or one group's read view.
-- ARGV[1] offset, ARGV[2] limit (the caller bounds it)
-- Returns: {now_ms, id, queued score, envelope or false, attempts or false,
--           error or false, ...}. A score > 0 is the push sequence number
--           (lower: handed out sooner); < 0 marks an entry a consumer popped
--           but did not claim (the scheduler pushes it again).
-- Guarantees: read-only; one consistent view of the page; the work is bounded
-- by the limit (a ZRANGE by rank, then three HGETs per id of the page).
local offset = tonumber(ARGV[1])
local ids = redis.call('ZRANGE', K_QUEUED, offset, offset + tonumber(ARGV[2]) - 1, 'WITHSCORES')
return append_records({clock_ms()}, ids)
