-- Priority levels (docs/guides/priorities.md): 0, the default, is the most urgent;
-- 9 the least. Part of the per-type scripts' helpers (see _prelude.lua).
--   prio       HASH id -> level of each event at a level above 0; an event at
--              level 0 has no entry, so a type that never uses levels has no
--              prio key and takes the paths it always took
--   ready_<n>  LIST: level n's ready list (level 0's is `ready`), its pushes
--              counted in meta's 'pushed:<n>' (level 0's in 'pushed')
-- Every level's ready ids share `queued`, level n's with scores n * LEVEL_SPAN
-- + its push sequence: a membership test stays one ZSCORE whatever the level,
-- and each level's popped-but-unclaimed entries are found in its own range.
local LEVEL_SPAN = 1099511627776  -- 2^40 pushes per level; scores stay exact doubles

-- meta's field counting the pushes to level n's list
local function pushed_field(n)
  if n == 0 then return 'pushed' end
  return 'pushed:' .. n
end

-- The ready lists of levels 1..9 given to this call (nil: none given, a call for
-- a type without levels)
local function level_lists()
  if not K_READY_1 then return nil end
  return {K_READY_1, K_READY_2, K_READY_3, K_READY_4, K_READY_5, K_READY_6, K_READY_7,
    K_READY_8, K_READY_9}
end

-- True when some event of the type has a level above 0 (one EXISTS per call, cached)
local LEVELLED = nil
local function levelled()
  if LEVELLED == nil then LEVELLED = K_PRIO ~= nil and redis.call('EXISTS', K_PRIO) == 1 end
  return LEVELLED
end

-- The level of each id (0 for none), read in HMGETs of 1000
local function levels_of(ids)
  local out = {}
  for i = 1, #ids, 1000 do
    local got = redis.call('HMGET', K_PRIO, unpack(ids, i, math.min(#ids, i + 999)))
    for j = 1, #got do out[i + j - 1] = tonumber(got[j]) or 0 end
  end
  return out
end

-- Records ids' levels (0: no entry) in HSET/HDEL calls of at most 1000 ids
local function set_levels(ids, levels)
  local put, drop = {}, {}
  for i, id in ipairs(ids) do
    if levels[i] > 0 then
      put[#put + 1] = id
      put[#put + 1] = levels[i]
    else
      drop[#drop + 1] = id
    end
  end
  for i = 1, #put, 2000 do
    redis.call('HSET', K_PRIO, unpack(put, i, math.min(#put, i + 1999)))
    LEVELLED = true
  end
  if #drop > 0 and levelled() then
    for i = 1, #drop, 1000 do
      redis.call('HDEL', K_PRIO, unpack(drop, i, math.min(#drop, i + 999)))
    end
  end
end
