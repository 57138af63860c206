-- schedule_write: create, update, pause, resume or remove a schedule in its type.
--
-- KEYS (delayq/keyspace/scripts.py): `schedules`, `schedule_state`: the type's schedules
--   HASH (name -> definition) and schedule-state HASH (name -> state; see
--   schedule_fire.lua).
-- ARGV[1] 'upsert', 'pause', 'resume', 'remove' or 'read'; ARGV[2] the name;
--   for 'upsert' ARGV[3] the definition, ARGV[4] its version (a digest of the
--   definition, no time in it) and ARGV[5] what a different stored version means:
--   '' a change; '?' ask (write nothing, answer found = 2 with what is stored); or
--   a version: if the stored one is exactly that, it is this same definition as an
--   older release encoded it (its template carried an encode time), replaced
--   without moving the mark; any other version is a change
-- Returns: {found (0/1; 2: '?' found another version), gen, state or false,
--   definition or false, now ms} (after the change; for 'remove' what was there).
-- Guarantees: the mark (the last slot fired) never moves back, so no write
--   here lets a slot fire twice. An upsert of the same definition (the same
--   version) writes nothing at all: no new version, no gen, no mark moved (a
--   process that declares its schedules at every start keeps any slot due while
--   it was down, even one another process's firer owes right now); a changed
--   definition, and a resume, move the mark to now: slots before the change are
--   not fired late. A definition and its state's version change together, here
--   only. `gen` (Redis µs) grows with every change (see schedule_index.lua).
local op, name = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gen = tonumber(t[1]) * 1000000 + tonumber(t[2])
local raw = redis.call('HGET', K_SCHEDULE_STATE, name)
local st = raw and cmsgpack.unpack(raw)
local function reply(found)
  local def = redis.call('HGET', K_SCHEDULES, name)
  if not st then return {found, '0', false, def or false, now} end
  return {found, string.format('%.0f', st[7]), cmsgpack.pack(st), def or false, now}
end
if op == 'read' then
  return reply(st and 1 or 0)
end
if op == 'upsert' then
  if not st then
    st = {ARGV[4], now, '', 0, 0, 0, gen, 0, 0, 0}
  elseif st[1] == ARGV[4] then
    return reply(1)  -- the same definition: nothing changes
  elseif ARGV[5] == '?' then
    return reply(2)
  else
    local same = ARGV[5] ~= '' and st[1] == ARGV[5]
    st[1], st[7] = ARGV[4], gen
    if not same and tonumber(st[2]) < now then st[2] = now end
  end
  redis.call('HSET', K_SCHEDULES, name, ARGV[3])
  redis.call('HSET', K_SCHEDULE_STATE, name, cmsgpack.pack(st))
  return reply(1)
end
if not st then return reply(0) end
if op == 'remove' then
  local r = reply(1)
  r[2] = string.format('%.0f', gen)
  redis.call('HDEL', K_SCHEDULES, name)
  redis.call('HDEL', K_SCHEDULE_STATE, name)
  return r
end
if op == 'pause' then
  st[6] = 1
elseif op == 'resume' then
  if tonumber(st[6]) == 1 and tonumber(st[2]) < now then st[2] = now end
  st[6] = 0
else
  return redis.error_reply('ERR unknown schedule_write op ' .. tostring(op))
end
st[7] = gen
redis.call('HSET', K_SCHEDULE_STATE, name, cmsgpack.pack(st))
return reply(1)
