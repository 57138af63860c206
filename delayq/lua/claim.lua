-- claim: a consumer takes ready events and starts their leases.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `ready`, `queued`, `inflight`, `leases`,
--   `attempts`, `meta`, `limits`, `klines`, `krot`, `kwait`, `krun` of the type or group
--   (see _prelude.lua); the flow-key state only when a marker may come.
--   then the priority levels' ready lists `ready_1` `ready_2` `ready_3` `ready_4`
--   `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (_levels.lua)
-- ARGV[1] visibility timeout in ms (the lease)
-- ARGV[2] how many more entries to pop from the ready list here (0..n); with
--         priority levels '<n>/<level>': the level whose list ARGV[3..] came from
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
-- Flow limits (delayq/flow/limits.py) are decided here, atomically: live leases
-- (deadline after now) never exceed `concurrency`, starts never exceed the
-- GCRA's `burst + elapsed * rate`; BRPOP'd entries not allowed go back to the
-- right end of the ready list, in order, their attempts untouched. Without a
-- limits key the only extra work is one EXISTS.
-- Flow keys (docs/FLOW.md): an entry 'k:<key>' is a key's turn. It becomes the
-- head of that key's list, and the key goes back to the end of the line while
-- it has events (one event per key per round: fair turns). A key at its
-- per-key limit (limits fields key_concurrency, key_rate_n/key_rate_ms/
-- key_burst; the per-key GCRA states are fields 't:<key>' of limits) is
-- parked in kwait instead, until its slot or token is due (move_due puts it
-- back then; an ack or failure of its event at once). The token of a keyed
-- delivery is "<n>|<key>". The flow-key state (klines, krot, kwait, krun, see
-- _prelude.lua) is needed only when a marker may come: the caller sends
-- them when it popped one; a marker met without them goes back to the right
-- end of the list. A type without keys pays one byte test per entry.
-- Priority levels (_levels.lua, docs/guides/priorities.md): given the ready lists
-- of levels 1..9 (a caller that has seen one of them), a claim takes from the most
-- urgent non-empty level first, then the next, and so on: entries already popped
-- from a less urgent level go back to the right end of their list (they are next
-- there) when more urgent ones fill the claim. With the limits field `aging` (ms)
-- an entry ready (due) for t ms competes as level max(0, level - floor(t / aging)),
-- ties to the earlier due time: the heads of the lists are compared entry by entry.
-- Without them only `ready` (level 0) is read, as always (with aging set the caller is
-- told to send them: see below).
-- '<due ms>:<id>' -> due, id (a bare id: '', id)
local function split_entry(entry)
  local sep = string.find(entry, ':', 1, true)
  if not sep then return '', entry end
  return string.sub(entry, 1, sep - 1), string.sub(entry, sep + 1)
end

-- Redis's clock, read once: ms (due times, leases) and µs (the reply's first element)
local function read_clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The type's (group's) flow limits, or nil without a limits key (one EXISTS)
local function read_limits(now)
  if K_LIMITS == nil or redis.call('EXISTS', K_LIMITS) == 0 then return nil end
  local f = redis.call('HMGET', K_LIMITS, 'paused', 'concurrency', 'rate_n', 'rate_ms', 'burst',
    'tat', 'key_concurrency', 'key_rate_n', 'key_rate_ms', 'key_burst', 'channel', 'shard',
    'aging')
  local lim = {paused = f[1] == '1', climit = tonumber(f[2]), kc = tonumber(f[7]),
    channel = f[11], shard = f[12], aging = tonumber(f[13])}
  if f[3] and f[4] and f[5] then
    lim.interval = tonumber(f[4]) / tonumber(f[3])
    lim.burst = tonumber(f[5])
    lim.tat = math.max(tonumber(f[6]) or now, now)
  end
  if f[8] and f[9] and f[10] then
    lim.kinterval = tonumber(f[9]) / tonumber(f[8])
    lim.kburst = tonumber(f[10])
  end
  return lim
end

-- How many of `want` starts the limits allow now, and which limit held back (nil: none)
local function allowance(lim, want, now)
  local allowed, reason = want, nil
  if lim.paused then allowed, reason = 0, 'paused' end
  if lim.climit then
    lim.live = redis.call('ZCOUNT', K_INFLIGHT, '(' .. now, '+inf')
    if lim.climit - lim.live < allowed then
      allowed, reason = math.max(0, lim.climit - lim.live), 'concurrency'
    end
  end
  if lim.interval then
    local tokens = math.floor((now + lim.burst * lim.interval - lim.tat) / lim.interval)
    if tokens < allowed then allowed, reason = math.max(0, tokens), 'rate' end
  end
  return allowed, reason
end

-- Entries past `allowed` go back to the right end of ready list `k`, the oldest last
-- (it is popped first again)
local function hold_back(entries, allowed, k)
  if allowed >= #entries then return end
  local back = {}
  for i = #entries, allowed + 1, -1 do
    back[#back + 1] = entries[i]
    entries[i] = nil
  end
  redis.call('RPUSH', k, unpack(back))
end

-- How long (ms, at most 1000) until a start may be allowed again, for every limit
-- that holds back, after `started` starts
local function wait_ms(lim, reason, started, now)
  local wait = 0
  if reason == 'paused' then wait = 1000 end
  if lim.climit and lim.live + started >= lim.climit then
    local first = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '(' .. now, '+inf', 'WITHSCORES',
      'LIMIT', 0, 1)
    wait = math.max(wait, first[2] and math.min(1000, tonumber(first[2]) - now + 1) or 0)
  end
  if lim.interval then
    -- +1: `now` is floored to the ms, so the token may be up to 1 ms later
    wait = math.max(wait, math.ceil(lim.tat - now - (lim.burst - 1) * lim.interval) + 1)
  end
  return math.min(1000, wait)
end

-- Flow keys' turns: markers become their key's next event (or nothing: the key is
-- parked at its per-key limit, or the marker is stale). `lim`: the limits or nil.
local function key_turns(lim, now)
  local kc = lim and lim.kc
  local kinterval, kburst = lim and lim.kinterval, lim and lim.kburst
  local taken = {}   -- key -> deliveries started in this call (not yet in krun)
  local repush = {}  -- keys whose turn came in this round and that have more events

  -- when (ms on Redis's clock) the key may start one more event, or nil: now
  local function key_held(fk)
    local hold
    if kc then
      local lo, hi = key_range(fk)
      local held = redis.call('ZRANGEBYLEX', K_KRUN, lo, hi)
      local n, first = taken[fk] or 0, nil
      for _, member in ipairs(held) do
        local id = string.sub(member, #fk + 2)
        local tok = redis.call('HGET', K_LEASES, id)
        local dl = tok and token_key(tok) == fk and tonumber(redis.call('ZSCORE', K_INFLIGHT, id))
        if dl and dl > now then
          n = n + 1
          if first == nil or dl < first then first = dl end
        else
          redis.call('ZREM', K_KRUN, member)  -- settled or expired: its slot is free
        end
      end
      -- a slot comes back at the latest when the first live lease runs out
      if n >= kc then hold = first or (now + 1000) end
    end
    if kinterval then
      local ktat = math.max(tonumber(redis.call('HGET', K_LIMITS, 't:' .. fk)) or now, now)
      if ktat - now > (kburst - 1) * kinterval then
        hold = math.max(hold or 0, math.ceil(ktat - (kburst - 1) * kinterval) + 1)
      end
    end
    return hold
  end

  -- puts this round's keys back at the end of the line, in their order, in three calls
  local function flush()
    local n = #repush
    if n == 0 then return end
    local seq = redis.call('HINCRBY', K_META, 'pushed', n) - n
    local markers, scored = {}, {}
    for i, fk in ipairs(repush) do
      markers[i] = 'k:' .. fk
      scored[2 * i - 1] = seq + i
      scored[2 * i] = fk
    end
    redis.call('LPUSH', K_READY, unpack(markers))
    redis.call('ZADD', K_KROT, unpack(scored))
    repush = {}
  end

  -- the key's next event (it leaves `queued` here), or nil
  local function turn(fk)
    if redis.call('ZREM', K_KROT, fk) == 0 then return nil end  -- stale marker
    if kc or kinterval then
      local hold = key_held(fk)
      if hold then
        redis.call('ZADD', K_KWAIT, hold, fk)
        if kinterval and lim.channel and lim.shard then
          -- wake the scheduler for it (as schedule() in _prelude.lua does)
          local wake = tonumber(redis.call('HGET', K_META, 'wake'))
          if wake == nil or hold < wake then
            redis.call('HSET', K_META, 'wake', string.format('%.0f', hold))
            redis.call('PUBLISH', lim.channel, lim.shard)
          end
        end
        return nil
      end
    end
    local lo, hi = key_range(fk)
    local got, more
    for _ = 1, 10 do  -- skips stale entries (cancelled, replaced, claimed)
      local head = redis.call('ZRANGEBYLEX', K_KLINES, lo, hi, 'LIMIT', 0, 2)
      more = head[2] ~= nil
      if not head[1] then break end
      redis.call('ZREM', K_KLINES, head[1])
      -- '<key>\0<pos>\0<due>:<id>': the entry after the second NUL
      local entry = string.sub(head[1], string.find(head[1], '\0', #fk + 2, true) + 1)
      -- still queued: it leaves `queued` here (the claim below counts on it)
      local _, id = split_entry(entry)
      if redis.call('ZREM', K_QUEUED, id) == 1 then
        got = entry
        break
      end
      if not more then break end
    end
    -- back to the end of the line while the key has events (pushed after this round)
    if more then repush[#repush + 1] = fk end
    if got then
      taken[fk] = (taken[fk] or 0) + 1
      if kinterval then
        local ktat = math.max(tonumber(redis.call('HGET', K_LIMITS, 't:' .. fk)) or now, now)
        redis.call('HSET', K_LIMITS, 't:' .. fk, string.format('%.3f', ktat + kinterval))
      end
    end
    return got
  end
  return turn, flush
end

-- The entries to claim: those given (their markers turned into events) and up to
-- `extra` more popped here; and ekeys: index in entries -> key, for keyed entries.
local function collect(given, extra, lim, now)
  local entries, ekeys, back = {}, {}, {}
  local turn, flush = key_turns(lim, now)
  -- a marker given without the keyed keys (a caller that did not expect one) goes back
  -- to the right end of the ready list: the next consumer claims it with them
  local function add(entry)
    if is_marker(entry) then
      if not K_KLINES then
        back[#back + 1] = entry
        return false
      end
      local fk = string.sub(entry, 3)
      local got = turn(fk)
      if not got then return false end
      entries[#entries + 1] = got
      ekeys[#entries] = fk
    else
      entries[#entries + 1] = entry
    end
    return true
  end
  for _, e in ipairs(given) do add(e) end
  flush()
  -- Extra pops: one RPOP, as many as asked; again while markers were among
  -- them (a marker may give nothing, and may come back within this call). Each
  -- round takes at least one event or drops a marker, so rounds are bounded.
  for _ = 1, extra + 8 do
    if extra <= 0 then break end
    local popped = redis.call('RPOP', K_READY, extra)
    if not popped then break end
    local markers = false
    for _, e in ipairs(popped) do
      if is_marker(e) then markers = true end
      if add(e) then extra = extra - 1 end
    end
    flush()
    if not markers or #back > 0 then break end
  end
  if #back > 0 then redis.call('RPUSH', K_READY, unpack(back)) end
  return entries, ekeys
end

-- Leases for `entries` until `deadline`, appended to result as id, envelope, attempt,
-- due, token (attempt 0: an id queued without an envelope, dropped).
local function lease(entries, ekeys, deadline, kc, result)
  local token = redis.call('HINCRBY', K_META, 'claims', #entries) - #entries
  for i, entry in ipairs(entries) do
    token = token + 1
    local due, id = split_entry(entry)
    -- a keyed entry left `queued` when its key's turn took it (see key_turns)
    if ekeys[i] or redis.call('ZREM', K_QUEUED, id) == 1 then
      local envelope = redis.call('HGET', K_EVENTS, id)
      if envelope then
        local attempt = redis.call('HINCRBY', K_ATTEMPTS, id, 1)
        local tok = tostring(token)
        local fk = ekeys[i]
        if fk then
          tok = tok .. '|' .. fk
          if kc then redis.call('ZADD', K_KRUN, 0, fk .. '\0' .. id) end
        end
        redis.call('ZADD', K_INFLIGHT, deadline, id)
        redis.call('HSET', K_LEASES, id, tok)
        result[#result + 1] = id
        result[#result + 1] = envelope
        result[#result + 1] = attempt
        result[#result + 1] = due
        result[#result + 1] = tok
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
end

-- Priority levels: the ready lists (index 0: level 0's), or nil without levels
local LISTS = level_lists()
if LISTS then LISTS[0] = K_READY end

-- Whether any ready list holds an entry
local function any_ready()
  for n = 0, LISTS and #LISTS or 0 do
    if redis.call('LLEN', n == 0 and K_READY or LISTS[n]) > 0 then return true end
  end
  return false
end

-- Level by level, most urgent first: `given` (popped from level `from`) are taken
-- when their level's turn comes; `want` entries at most. Returns entries, ekeys.
local function collect_levels(given, from, want, lim, now)
  local entries, ekeys
  if from == 0 then
    entries, ekeys = collect(given, want - #given, lim, now)
    given = {}
  else
    entries, ekeys = collect({}, want, lim, now)
  end
  for n = 1, #LISTS do
    local left = want - #entries
    if left <= 0 then break end
    if n == from then
      for i = 1, math.min(left, #given) do entries[#entries + 1] = given[i] end
      hold_back(given, left, LISTS[n])
      given = {}
      left = want - #entries
    end
    if left > 0 then
      local popped = redis.call('RPOP', LISTS[n], left)
      if popped then
        for _, e in ipairs(popped) do entries[#entries + 1] = e end
      end
    end
  end
  -- more urgent levels filled the claim: these are next in their list again
  if #given > 0 then hold_back(given, 0, LISTS[from]) end
  return entries, ekeys
end

-- With aging (ms per level): the head (oldest entry) of every list competes as
-- level max(0, level - floor(waited / aging)), ties to the earlier due time, then
-- the lower level; `given` stand for the head of level `from`. Returns entries, ekeys.
local function collect_aged(given, from, want, aging, lim, now)
  local heads, gi, entries = {}, 1, {}
  local function head(n)
    if n == from and gi <= #given then return given[gi] end
    if heads[n] == nil then heads[n] = redis.call('LINDEX', LISTS[n], -1) or false end
    return heads[n]
  end
  -- flow keys' markers live in level 0's list only, and a keyed type's events wait in
  -- their keys' lines: such a type is served level by level
  local h0 = head(0)
  if h0 and is_marker(h0) then return collect_levels(given, from, want, lim, now) end
  while #entries < want do
    local best, best_eff, best_due = nil, nil, nil
    for n = 0, #LISTS do
      local e = head(n)
      if e then
        local due = tonumber((split_entry(e))) or now
        local eff = math.max(0, n - math.floor(math.max(0, now - due) / aging))
        if best == nil or eff < best_eff or (eff == best_eff and due < best_due) then
          best, best_eff, best_due = n, eff, due
        end
      end
    end
    if best == nil then break end
    if best == from and gi <= #given then
      entries[#entries + 1] = given[gi]
      gi = gi + 1
    else
      entries[#entries + 1] = redis.call('RPOP', LISTS[best])
      heads[best] = nil
    end
  end
  local rest = {}
  for i = gi, #given do rest[#rest + 1] = given[i] end
  if #rest > 0 then hold_back(rest, 0, LISTS[from]) end
  return entries, {}
end

check_keys('inflight', 'leases', 'attempts')  -- written after ZREM queued
keep_working_when_full()
local now, now_us = read_clock()
local given = {}
for i = 3, #ARGV do given[#given + 1] = ARGV[i] end
local extra, from = string.match(ARGV[2], '^(%d+)/?(%d*)$')
extra, from = tonumber(extra), tonumber(from) or 0
local from_list = from > 0 and LISTS and LISTS[from] or K_READY
local lim = read_limits(now)
-- Aging needs every level's list (a saturated level 0 must not hide an aged level 9
-- from a caller that never popped above level 0): a caller that sent none gets its
-- entries put back (they came from level 0's list, next in line again) and the reply
-- {{now_us, 0, 'levels', 0, -1}}; it sends the lists from then on and claims again.
if lim and lim.aging and not LISTS then
  hold_back(given, 0, K_READY)
  return {{now_us, 0, 'levels', 0, -1}}
end
local held, reason = false, nil  -- held: the limits allowed fewer starts than asked
if lim then
  local want = #given + extra
  local allowed
  allowed, reason = allowance(lim, want, now)
  hold_back(given, allowed, from_list)
  extra = math.max(0, allowed - #given)
  -- nothing held back, or nothing to hold back (an empty list): an ordinary reply,
  -- and the consumer blocks in BRPOP again rather than claiming every second
  held = allowed < want and any_ready()
end
local entries, ekeys
if not LISTS then
  entries, ekeys = collect(given, extra, lim, now)
elseif lim and lim.aging then
  entries, ekeys = collect_aged(given, from, #given + extra, lim.aging, lim, now)
else
  entries, ekeys = collect_levels(given, from, #given + extra, lim, now)
end

local result = {now_us}
if #entries == 0 and not held then return result end
lease(entries, ekeys, now + tonumber(ARGV[1]), lim and lim.kc, result)
if lim then
  local started = (#result - 1) / 5  -- (a dropped id took its start too)
  if lim.interval and started > 0 then
    lim.tat = lim.tat + started * lim.interval
    redis.call('HSET', K_LIMITS, 'tat', string.format('%.3f', lim.tat))
  end
  if held then
    result[1] = {now_us, wait_ms(lim, reason, started, now), reason, lim.live or 0,
      lim.climit or -1}
  end
end
return result
