-- batch_info: all a batch shard holds about one batch (service.batch_info).
--
-- KEYS (delayq/keyspace/scripts.py): the batch's own `brec`, `bmembers`, `bfailed` (see
--   _batches.lua).
-- ARGV[1] batch id, ARGV[2] the most failed refs, ARGV[3] the most pending refs to list
-- Returns: {now_ms, record (field, value, ...), failed refs, pending refs}; the record
--   is empty for no such batch.
-- Guarantees: read-only, one consistent view; the pending refs are looked for in at most
-- 2,000 members (a batch with many done members may list fewer than asked).
local nfailed, nwaiting = tonumber(ARGV[2]), tonumber(ARGV[3])
local rec, members = bkey(1, B_REC), bkey(1, B_MEMBERS)
local record = redis.call('HGETALL', rec)
local failed = {}
if nfailed > 0 and #record > 0 then failed = redis.call('LRANGE', bkey(1, B_FAILED), 0, nfailed - 1) end
local waiting = {}
if nwaiting > 0 and #record > 0 then
  local cursor, looks = '0', 0
  repeat
    local got = redis.call('HSCAN', members, cursor, 'COUNT', 200)
    cursor = got[1]
    for j = 1, #got[2], 2 do
      if got[2][j + 1] == '' and #waiting < nwaiting then waiting[#waiting + 1] = got[2][j] end
    end
    looks = looks + 1
  until cursor == '0' or #waiting >= nwaiting or looks >= 10
end
return {clock_ms(), record, failed, waiting}
