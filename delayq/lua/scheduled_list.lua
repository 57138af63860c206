-- scheduled_list: one page of scheduled events, earliest due first.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `attempts`, `errors`,
--   `retries` of the type, or one group's read view (see counts.lua): the type's schedule
--   and the group's retries, merged by due time.
-- ARGV[1] offset, ARGV[2] limit (the caller bounds it)
-- Returns: {id, due_ms, envelope or false, attempts or false, error or false, ...}
-- Guarantees: read-only; one consistent view of the page; the work is bounded
-- by the limit (ZRANGE by rank, then one HMGET per hash for the page's ids),
-- and with two schedules by offset + limit per schedule.
local offset, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local page
if K_RETRIES and K_RETRIES ~= K_SCHEDULED then
  local a = redis.call('ZRANGE', K_SCHEDULED, 0, offset + limit - 1, 'WITHSCORES')
  local b = redis.call('ZRANGE', K_RETRIES, 0, offset + limit - 1, 'WITHSCORES')
  page = {}
  local i, j, n = 1, 1, 0
  while n < offset + limit and (i <= #a or j <= #b) do
    local take_a = j > #b
    if i <= #a and j <= #b then
      local sa, sb = tonumber(a[i + 1]), tonumber(b[j + 1])
      take_a = sa < sb or (sa == sb and a[i] <= b[j])
    end
    n = n + 1
    if take_a then
      if n > offset then page[#page + 1] = a[i]; page[#page + 1] = a[i + 1] end
      i = i + 2
    else
      if n > offset then page[#page + 1] = b[j]; page[#page + 1] = b[j + 1] end
      j = j + 2
    end
  end
else
  page = redis.call('ZRANGE', K_SCHEDULED, offset, offset + limit - 1, 'WITHSCORES')
end
if #page == 0 then return {} end
local ids = {}
for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
local envelopes = redis.call('HMGET', K_EVENTS, unpack(ids))
local attempts = redis.call('HMGET', K_ATTEMPTS, unpack(ids))
local errors = redis.call('HMGET', K_ERRORS, unpack(ids))
local result = {}
for i, id in ipairs(ids) do
  result[#result + 1] = id
  result[#result + 1] = page[2 * i]
  result[#result + 1] = envelopes[i]
  result[#result + 1] = attempts[i]
  result[#result + 1] = errors[i]
end
return result
