-- claim: a consumer takes ready events and starts their leases.
--
-- KEYS: the ten keys of the type (see _prelude.lua).
-- ARGV[1] visibility timeout in ms (the lease)
-- ARGV[2] how many more entries to pop from the ready list here (0..n)
-- ARGV[3..] entries the consumer already popped with BRPOP
-- Returns: {now_us, id, envelope, attempt, due_ms, token, id, envelope, ...}
--   attempt counts this delivery (1 = first); token identifies this claim
--   for ack, renew and fail. Attempt 0 (empty envelope and token) reports an
--   id that was queued without a stored envelope: it was dropped.
-- Guarantees: an id leaves `queued` exactly once per push, so two consumers
-- never both claim one ready entry, and stale entries (cancelled, replaced or
-- already claimed ids) are skipped. Entries popped here are claimed in the
-- same atomic step, so only a BRPOP'd entry can be orphaned (see move_due).
check_keys(5, 6, 7)  -- inflight, leases, attempts: written after ZREM queued
keep_working_when_full()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local entries = {}
for i = 3, #ARGV do entries[#entries + 1] = ARGV[i] end
local extra = tonumber(ARGV[2])
if extra > 0 then
  local popped = redis.call('RPOP', K_READY, extra)
  if popped then
    for _, e in ipairs(popped) do entries[#entries + 1] = e end
  end
end

local result = {tonumber(t[1]) * 1000000 + tonumber(t[2])}
if #entries == 0 then return result end
local token = redis.call('HINCRBY', K_META, 'claims', #entries) - #entries
for _, entry in ipairs(entries) do
  token = token + 1
  local sep = string.find(entry, ':', 1, true)
  local id, due = entry, ''
  if sep then
    due = string.sub(entry, 1, sep - 1)
    id = string.sub(entry, sep + 1)
  end
  if redis.call('ZREM', K_QUEUED, id) == 1 then
    local envelope = redis.call('HGET', K_EVENTS, id)
    if envelope then
      local attempt = redis.call('HINCRBY', K_ATTEMPTS, id, 1)
      redis.call('ZADD', K_INFLIGHT, deadline, id)
      redis.call('HSET', K_LEASES, id, token)
      result[#result + 1] = id
      result[#result + 1] = envelope
      result[#result + 1] = attempt
      result[#result + 1] = due
      result[#result + 1] = tostring(token)
    else
      -- queued but no envelope: something other than delayq deleted it; the
      -- entry is dropped and reported (attempt 0) so the caller can log it
      result[#result + 1] = id
      result[#result + 1] = ''
      result[#result + 1] = 0
      result[#result + 1] = due
      result[#result + 1] = ''
    end
  end
end
return result
