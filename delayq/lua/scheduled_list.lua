-- scheduled_list: one page of scheduled events, earliest due first.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV[1] offset, ARGV[2] limit (the caller bounds it)
-- Returns: {id, due_ms, envelope or false, attempts or false, error or false, ...}
-- Guarantees: read-only; one consistent view of the page; the work is bounded
-- by the limit (ZRANGE by rank, then one HMGET per hash for the page's ids).
local offset = tonumber(ARGV[1])
local page = redis.call('ZRANGE', K_SCHEDULED, offset, offset + tonumber(ARGV[2]) - 1,
  'WITHSCORES')
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
