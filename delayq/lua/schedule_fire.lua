-- schedule_fire: fire slots of schedules that live in one event type (shard).
--
-- KEYS: the 13 keys of the type's default view (see _prelude.lua), then
--   KEYS[14] the type's `schedules` hash (name -> definition)
--   KEYS[15] the type's `schedule-state` hash (name -> MessagePack state, below)
-- ARGV[1] wake-up channel, ARGV[2] the shard's name (published on wake-ups)
-- ARGV[3] a MessagePack array, 7 per fire: name, definition version, slot ms
--   ('T' for a manual trigger), event id, due ms (slot + jitter), envelope
--   length, overlap policy; ARGV[4] the envelopes back to back (packing many
--   small arguments costs the client more than this script)
-- State: [version, mark, last id, last fire ms, last slot ms, paused, gen,
--   fires, skipped, triggers]; `mark` is the last slot fired or passed over.
-- Returns: per fire {code, gen, mark}; code 1 fired, 2 skipped by the overlap
--   policy, 0 done already (slot at or before the mark), -1 stale (the
--   definition changed), -2 gone (no such schedule), -3 paused, 3 fired but an
--   event with the id existed (kept, as enqueue keeps it).
-- Guarantees: a slot is fired at most once, whoever calls and however often:
--   the id is derived from (schedule, slot), and the mark, updated in this
--   same script, refuses a slot at or before it even after the fire was
--   handled and deleted. The event is written as enqueue.lua writes a new one
--   (due now: the ready list; later, or a type with delivery groups: the
--   schedule, with a wake-up). `gen` (Redis µs) grows with every state change:
--   the prefix's index (schedule_index.lua) refuses older news.
check_keys(1, 2, 3, 4, 10)
local now = clock_ms()
local t = redis.call('TIME')
local gen_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local channel, type_name = ARGV[1], ARGV[2]
local fan = grouped()
local out = {}
local items, blob, pos = cmsgpack.unpack(ARGV[3]), ARGV[4], 1
for i = 1, #items, 7 do
  local name, version, slot_arg, id, due, overlap =
    items[i], items[i + 1], tostring(items[i + 2]), items[i + 3], tonumber(items[i + 4]), items[i + 6]
  local envelope = string.sub(blob, pos, pos + items[i + 5] - 1)
  pos = pos + items[i + 5]
  local raw = redis.call('HGET', KEYS[15], name)
  local code, st = 1, nil
  if not raw or redis.call('HEXISTS', KEYS[14], name) == 0 then
    code = -2
  else
    st = cmsgpack.unpack(raw)
    if st[1] ~= version then code = -1 end
  end
  local trigger = slot_arg == 'T'
  local slot = tonumber(slot_arg)
  if code == 1 and not trigger then
    if tonumber(st[6]) == 1 then
      code = -3
    elseif slot <= tonumber(st[2]) then
      code = 0
    elseif overlap ~= 'allow' and st[3] ~= '' and redis.call('HEXISTS', K_EVENTS, st[3]) == 1
        and not redis.call('ZSCORE', K_DEAD, st[3]) then
      -- the previous fire is still pending (a dead letter is not): waiting or running
      local waiting = redis.call('ZSCORE', K_SCHEDULED, st[3]) or redis.call('ZSCORE', K_QUEUED, st[3])
      if overlap == 'skip' or waiting then code = 2 end
    end
  end
  if code == 1 or code == 2 then
    if code == 1 then
      if redis.call('HEXISTS', K_EVENTS, id) == 1 then
        code = 3
      else
        redis.call('HSET', K_EVENTS, id, envelope)
        if due <= now and not fan then
          push_ready({id}, {due})
        else
          schedule(id, due, channel, type_name)
        end
      end
    end
    if trigger then
      st[10] = (tonumber(st[10]) or 0) + 1
    else
      st[2] = slot
      st[7] = gen_now
      if code == 2 then
        st[9] = tonumber(st[9]) + 1
      else
        st[3], st[4], st[5], st[8] = id, now, slot, tonumber(st[8]) + 1
      end
    end
    redis.call('HSET', KEYS[15], name, cmsgpack.pack(st))
  end
  if st then
    out[#out + 1] = {code, string.format('%.0f', st[7]), string.format('%.0f', st[2])}
  else
    out[#out + 1] = {code, '0', '0'}
  end
end
return out
