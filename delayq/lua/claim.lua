-- claim: a consumer takes ready events and starts their leases.
--
-- KEYS: the ten keys of the type (see _prelude.lua), then groups, pending,
--   retries (unused here) and KEYS[14] the limits HASH of the type or group.
-- ARGV[1] visibility timeout in ms (the lease)
-- ARGV[2] how many more entries to pop from the ready list here (0..n)
-- ARGV[3..] entries the consumer already popped with BRPOP
-- Returns: {now_us, id, envelope, attempt, due_ms, token, id, envelope, ...}
--   attempt counts this delivery (1 = first); token identifies this claim
--   for ack, renew and fail. Attempt 0 (empty envelope and token) reports an
--   id that was queued without a stored envelope: it was dropped.
--   When flow limits allowed fewer starts than asked (the type is paused, at
--   its fleet-wide concurrency or out of rate tokens), the first element is
--   instead {now_us, wait_ms, reason, live_leases, concurrency_limit}: wait
--   that long (at most 1000) before claiming again; reason is paused,
--   concurrency or rate; the limit is -1 when none is set.
-- Guarantees: an id leaves `queued` exactly once per push, so two consumers
-- never both claim one ready entry, and stale entries (cancelled, replaced or
-- already claimed ids) are skipped. Entries popped here are claimed in the
-- same atomic step, so only a BRPOP'd entry can be orphaned (see move_due).
-- Flow limits (delayq/limits.py) are decided here, atomically: live leases
-- (deadline after now) never exceed `concurrency`, starts never exceed the
-- GCRA's `burst + elapsed * rate`; BRPOP'd entries not allowed go back to the
-- right end of the ready list, in order, their attempts untouched. Without a
-- limits key the only extra work is one EXISTS.
check_keys(5, 6, 7)  -- inflight, leases, attempts: written after ZREM queued
keep_working_when_full()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local entries = {}
for i = 3, #ARGV do entries[#entries + 1] = ARGV[i] end
local extra = tonumber(ARGV[2])
local flow = K_LIMITS ~= nil and redis.call('EXISTS', K_LIMITS) == 1
local f, live, climit, interval, tat, burst, reason
if flow then
  f = redis.call('HMGET', K_LIMITS, 'paused', 'concurrency', 'rate_n', 'rate_ms', 'burst', 'tat')
  local want = #entries + extra
  local allowed = want
  if f[1] == '1' then allowed, reason = 0, 'paused' end
  climit = tonumber(f[2])
  if climit then
    live = redis.call('ZCOUNT', K_INFLIGHT, '(' .. now, '+inf')
    if climit - live < allowed then allowed, reason = math.max(0, climit - live), 'concurrency' end
  end
  if f[3] and f[4] and f[5] then
    interval = tonumber(f[4]) / tonumber(f[3])
    burst = tonumber(f[5])
    tat = math.max(tonumber(f[6]) or now, now)
    local tokens = math.floor((now + burst * interval - tat) / interval)
    if tokens < allowed then allowed, reason = math.max(0, tokens), 'rate' end
  end
  if allowed < #entries then
    -- back to the right end, the oldest last (it is popped first again)
    local back = {}
    for i = #entries, allowed + 1, -1 do
      back[#back + 1] = entries[i]
      entries[i] = nil
    end
    redis.call('RPUSH', K_READY, unpack(back))
  end
  extra = math.max(0, allowed - #entries)
  -- nothing held back, or nothing to hold back (an empty list): an ordinary reply,
  -- and the consumer blocks in BRPOP again rather than claiming every second
  if allowed >= want or redis.call('LLEN', K_READY) == 0 then flow = false end
end
if extra > 0 then
  local popped = redis.call('RPOP', K_READY, extra)
  if popped then
    for _, e in ipairs(popped) do entries[#entries + 1] = e end
  end
end

local result = {tonumber(t[1]) * 1000000 + tonumber(t[2])}
if #entries == 0 and not flow then return result end
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
if f then
  local started = (#result - 1) / 5
  if interval and started > 0 then
    tat = tat + started * interval
    redis.call('HSET', K_LIMITS, 'tat', string.format('%.3f', tat))
  end
  if flow then
    -- how long until a start may be allowed again, for every limit that holds back
    local wait = 0
    if reason == 'paused' then wait = 1000 end
    if climit and live + started >= climit then
      local first = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      wait = math.max(wait, first[2] and math.min(1000, tonumber(first[2]) - now + 1) or 0)
    end
    if interval then
      -- +1: `now` is floored to the ms, so the token may be up to 1 ms later
      wait = math.max(wait, math.ceil(tat - now - (burst - 1) * interval) + 1)
    end
    result[1] = {result[1], math.min(1000, wait), reason, live or 0, climit or -1}
  end
end
return result
