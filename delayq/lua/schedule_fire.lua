-- schedule_fire: fire slots of schedules that live in one event type (shard).
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `dead`,
--   `meta`, `groups`, `schedules`, `schedule_state`, `fkeys`, `klines`, `krot`, `kwait` of
--   the type's default view (see _prelude.lua), with schedules (name -> definition) and
--   schedule_state (name -> MessagePack state, below), then `prio` and the levels'
--   ready lists `ready_1` `ready_2` `ready_3` `ready_4` `ready_5` `ready_6` `ready_7`
--   `ready_8` `ready_9` (_levels.lua); the caller sends them up to schedule_state
--   unless a fire is above level 0.
-- ARGV[1] wake-up channel, ARGV[2] the shard's name (published on wake-ups)
-- ARGV[3] a MessagePack array, 8 per fire: name, definition version, slot ms
--   ('T' for a manual trigger, 'P' to only look at a buffered fire), event id,
--   due ms (slot + jitter), envelope length, overlap policy, priority level
--   (0..9, the schedule's); ARGV[4] the envelopes back to back (packing many
--   small arguments costs the client more than this script)
-- State: [version, mark, last id, last fire ms, last slot ms, paused, gen,
--   fires, skipped, triggers, buffered]; `mark` is the last slot fired, held or
--   passed over; `buffered` is false or the fire held by overlap="buffer_one":
--   {slot ms, id, due ms, envelope, priority level (absent: 0)}.
-- Returns: per item {code, gen, mark, released slot ms or 0, buffered slot ms
--   or 0}; code 1 fired, 2 skipped by the overlap policy, 4 held (buffer_one),
--   5 looked ('P'), 0 done already (slot at or before the mark), -1 stale (the
--   definition changed), -2 gone (no such schedule), -3 paused, 3 fired but an
--   event with the id existed (kept, as enqueue keeps it).
-- Guarantees: a slot is fired at most once, whoever calls and however often:
--   the id is derived from (schedule, slot), and the mark, updated in this
--   same script, refuses a slot at or before it even after the fire was
--   handled and deleted. The event is written as enqueue.lua writes a new one
--   (due now: the ready list; later, or a type with delivery groups: the
--   schedule, with a wake-up), at the fire's priority level. A buffered fire is written only once the fire
--   before it has left (acked, cancelled or dead-lettered), checked and done
--   in this one script by whichever item of the schedule comes first (the
--   firer sends 'P' items while one is held): two fires of a buffer_one
--   schedule are never pending together. `gen` (Redis µs) grows with every
--   state change: the prefix's index (schedule_index.lua) refuses older news.
check_keys('events', 'scheduled', 'ready', 'queued', 'meta')
local now = clock_ms()
local t = redis.call('TIME')
local gen_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local channel, type_name = ARGV[1], ARGV[2]
local fan = grouped()
local out = {}
local items, blob, pos = cmsgpack.unpack(ARGV[3]), ARGV[4], 1

-- a fire is pending while its event exists and is not a dead letter: waiting or running
local function pending(id)
  return id ~= '' and redis.call('HEXISTS', K_EVENTS, id) == 1
    and not redis.call('ZSCORE', K_DEAD, id)
end

-- writes a fire's event as enqueue.lua writes a new one, at priority `level`; 1, or 3
-- when the id existed
local function write(id, due, envelope, level)
  if redis.call('HEXISTS', K_EVENTS, id) == 1 then return 3 end
  redis.call('HSET', K_EVENTS, id, envelope)
  if level > 0 then set_levels({id}, {level}) end
  if due <= now and not fan then
    push_ready({id}, {due})
  else
    schedule(id, due, channel, type_name)
  end
  return 1
end

for i = 1, #items, 8 do
  local name, version, slot_arg, id, due, overlap =
    items[i], items[i + 1], tostring(items[i + 2]), items[i + 3], tonumber(items[i + 4]), items[i + 6]
  local level = tonumber(items[i + 7]) or 0
  local envelope = string.sub(blob, pos, pos + items[i + 5] - 1)
  pos = pos + items[i + 5]
  local raw = redis.call('HGET', K_SCHEDULE_STATE, name)
  local code, st, released, changed = 1, nil, 0, false
  if not raw or redis.call('HEXISTS', K_SCHEDULES, name) == 0 then
    code = -2
  else
    st = cmsgpack.unpack(raw)
    local held = st[11]
    if type(held) == 'table' and tonumber(st[6]) ~= 1 and not pending(st[3]) then
      -- the fire before the buffered one has left: the buffered one goes now
      write(held[2], math.max(tonumber(held[3]), now), held[4], tonumber(held[5]) or 0)
      released = tonumber(held[1])
      st[3], st[4], st[5], st[8] = held[2], now, released, tonumber(st[8]) + 1
      st[11], st[7], changed = false, gen_now, true
    end
    if st[1] ~= version then code = -1 end
  end
  local trigger = slot_arg == 'T'
  if code == 1 and slot_arg == 'P' then
    code = 5
  elseif code == 1 and not trigger then
    local slot = tonumber(slot_arg)
    if tonumber(st[6]) == 1 then
      code = -3
    elseif slot <= tonumber(st[2]) then
      code = 0
    elseif overlap ~= 'allow' and pending(st[3]) then
      -- the previous fire is still waiting or running
      if overlap == 'buffer_one' and type(st[11]) ~= 'table' then
        code, st[11] = 4, {slot, id, due, envelope, level}
      else
        code = 2
      end
    end
    if code == 1 then code = write(id, due, envelope, level) end
    if code >= 1 then
      st[2], st[7], changed = slot, gen_now, true
      if code == 2 then
        st[9] = tonumber(st[9]) + 1
      elseif code ~= 4 then
        st[3], st[4], st[5], st[8] = id, now, slot, tonumber(st[8]) + 1
      end
    end
  elseif code == 1 then
    code = write(id, due, envelope, level)
    st[10], changed = (tonumber(st[10]) or 0) + 1, true
  end
  if changed then redis.call('HSET', K_SCHEDULE_STATE, name, cmsgpack.pack(st)) end
  if st then
    local buffered = type(st[11]) == 'table' and st[11][1] or 0
    out[#out + 1] = {code, string.format('%.0f', st[7]), string.format('%.0f', st[2]),
      string.format('%.0f', released), string.format('%.0f', buffered)}
  else
    out[#out + 1] = {code, '0', '0', '0', '0'}
  end
end
return out
