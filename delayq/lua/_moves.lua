-- The scheduler's steps on one delivery list, shared by move_due.lua (a type's
-- lists) and group_move.lua (each group's). `take(id, due)` collects an id to push
-- back to the ready list. Each step returns whether it filled its batch (then the
-- caller says "more": call again at once).

-- A function (id, due) that keeps the pair in into_ids/into_dues when the event
-- is stored, else notes the id in missing (move_due and group_move).
local function taker(into_ids, into_dues, missing)
  local function take(id, due)
    if redis.call('HEXISTS', K_EVENTS, id) == 1 then
      into_ids[#into_ids + 1] = id
      into_dues[#into_dues + 1] = due
    else
      missing[#missing + 1] = id
    end
  end
  return take
end

-- Orphans. Entries with sequence <= pushed - LLEN have left the list; if their
-- id is still in `queued`, no claim has run for them yet. They are marked with
-- the time they were noticed (a negative score) and given back after vt.
-- With priority levels (`lists`: the ready lists of levels 1..9) each level's list
-- is checked in its own score range (see _levels.lua).
local function recover_orphans(k_ready, k_queued, k_meta, now, vt, batch, take, lists)
  local full = false
  for n = 0, lists and #lists or 0 do
    local k = n == 0 and k_ready or lists[n]
    local llen = redis.call('LLEN', k)
    local pushed = tonumber(redis.call('HGET', k_meta, pushed_field(n))) or 0
    local base = n * LEVEL_SPAN
    local popped_max = base + pushed - llen
    if llen == 0 then popped_max = lists and base + LEVEL_SPAN - 1 or '+inf' end
    if pushed > 0 or n == 0 then
      local suspects = redis.call('ZRANGEBYSCORE', k_queued, base + 1, popped_max, 'LIMIT', 0, batch)
      for _, id in ipairs(suspects) do
        redis.call('ZADD', k_queued, 'XX', -now, id)
      end
      if #suspects == batch then full = true end
    end
  end
  local orphans = redis.call('ZRANGEBYSCORE', k_queued, -(now - vt), '(0', 'LIMIT', 0, batch)
  for _, id in ipairs(orphans) do
    redis.call('ZREM', k_queued, id)
    take(id, now)
  end
  return full or #orphans == batch
end

-- The same for the markers of a keyed ready list (their pushes are counted in
-- the same `pushed`), and keys parked by a per-key limit whose time has come
-- (a rate token is due, or the lease that held the key's slot ran out: an ack
-- or failure puts them back sooner). Returns whether it filled a batch.
local function recover_keys(k_ready, k_meta, k_lines, k_rot, k_wait, now, vt, batch)
  local llen = redis.call('LLEN', k_ready)
  local popped_max = (tonumber(redis.call('HGET', k_meta, 'pushed')) or 0) - llen
  if llen == 0 then popped_max = '+inf' end
  local suspects = redis.call('ZRANGEBYSCORE', k_rot, 1, popped_max, 'LIMIT', 0, batch)
  for _, fk in ipairs(suspects) do redis.call('ZADD', k_rot, 'XX', -now, fk) end
  local orphans = redis.call('ZRANGEBYSCORE', k_rot, -(now - vt), '(0', 'LIMIT', 0, batch)
  for _, fk in ipairs(orphans) do
    redis.call('ZREM', k_rot, fk)
    activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk)
  end
  local due = redis.call('ZRANGEBYSCORE', k_wait, '-inf', now, 'LIMIT', 0, batch)
  for _, fk in ipairs(due) do
    redis.call('ZREM', k_wait, fk)
    activate_key(k_ready, k_meta, k_lines, k_rot, k_wait, fk)
  end
  return #suspects == batch or #orphans == batch or #due == batch
end

-- When a keyed ready list next needs a look: a parked fk's time, a marker's
-- orphan check.
local function keyed_looks(k_rot, k_wait, vt, earliest)
  local first = redis.call('ZRANGE', k_wait, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZREVRANGEBYSCORE', k_rot, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then earliest(vt - tonumber(first[2])) end
end

-- Due ids of a schedule: the lowest scores, counted, then popped in one call
-- (no ZREM per id); the scores come back as strings, ready for the entries.
-- Appends them to ids/dues; returns (full, how late the oldest was in ms).
local function pop_due(k_sched, now, batch, ids, dues)
  local n_due = redis.call('ZCOUNT', k_sched, '-inf', now)
  local full = n_due > batch
  if full then n_due = batch end
  if n_due == 0 then return full, 0 end
  local due = redis.call('ZPOPMIN', k_sched, n_due)
  local n = #ids
  for i = 1, #due, 2 do
    n = n + 1
    ids[n] = due[i]
    dues[n] = due[i + 1]
  end
  return full, now - tonumber(due[2])
end

-- Expired leases: the worker died or stalled past its visibility timeout. A
-- lease that expires on the last allowed delivery makes a dead letter; the
-- others are taken back. `hold` (nil, or a function of an id): true leaves a lease
-- on its last delivery as it is, for a later call (see move_due.lua). Returns (full,
-- how late the oldest deadline was, dead, the dead letters' ids, held).
local LEASE_EXPIRED =
  'LeaseExpired: the handler neither finished nor renewed its lease (worker died or stalled)'
local function expire_leases(k_inflight, k_leases, k_errors, k_attempts, k_dead,
                             now, batch, max_deliveries, take, hold)
  local expired = redis.call('ZRANGEBYSCORE', k_inflight, '-inf', now, 'LIMIT', 0, batch)
  local late, dead, ids, held = 0, 0, {}, false
  if #expired > 0 then
    late = now - tonumber(redis.call('ZSCORE', k_inflight, expired[1]))
  end
  for _, id in ipairs(expired) do
    local n = tonumber(redis.call('HGET', k_attempts, id)) or 0
    if n >= max_deliveries and hold and hold(id) then
      held = true
    else
      redis.call('ZREM', k_inflight, id)
      redis.call('HDEL', k_leases, id)
      redis.call('HSET', k_errors, id, LEASE_EXPIRED)
      if n >= max_deliveries then
        redis.call('ZADD', k_dead, now, id)
        dead = dead + 1
        ids[dead] = id
      else
        take(id, now)
      end
    end
  end
  return #expired == batch, late, dead, ids, held
end

-- When a delivery list next needs a look: its earliest due time, lease
-- deadline or orphan check, each passed to earliest(t).
local function next_looks(k_sched, k_inflight, k_queued, vt, earliest)
  local first = redis.call('ZRANGE', k_sched, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZRANGE', k_inflight, 0, 0, 'WITHSCORES')
  if first[2] then earliest(tonumber(first[2])) end
  first = redis.call('ZREVRANGEBYSCORE', k_queued, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then earliest(vt - tonumber(first[2])) end
end
