-- Group prelude: sent (after the prelude's helpers) with the scripts that act on
-- every delivery group of one type at once (group_move, group_cancel,
-- group_replace) or on one whole group (group_remove).
-- KEYS: the script's own (the default group's view of the type, by name), then
-- each group's keys, in the order of the names in ARGV[2 .. ARGV[1] + 1]; then
-- each group's flow-key state; then the type's fkeys; then (group_move,
-- group_run_now and group_remove, which push to or delete ready lists) each
-- group's ready lists of priority levels 1..9. The script's header (delayq/keyspace/scripts.py, group_header)
-- names that layout: gkey(g, G_READY), gkkey(g, G_KLINES), K_FKEYS, glkey(g, n),
-- N_GROUPS (for the default group its keys are its retry schedule and the type's
-- own).
-- ARG(i) is the script's own i-th argument, after the names.
local GROUP_NAMES = {}
for i = 1, N_GROUPS do GROUP_NAMES[i] = ARGV[1 + i] end
local function ARG(i) return ARGV[1 + N_GROUPS + i] end

-- The registry as {name -> max deliveries}, or nil and the registered names
-- when the caller passed other groups (another process registered or removed
-- one since the caller last looked): the caller refreshes and calls again, so
-- every move fans out to exactly the groups registered at that moment.
local function registry()
  local flat = redis.call('HGETALL', K_GROUPS)
  local reg, names = {}, {}
  for i = 1, #flat, 2 do
    reg[flat[i]] = tonumber(flat[i + 1]) or false
    names[#names + 1] = flat[i]
  end
  local same = #names == N_GROUPS and N_GROUPS > 0  -- none: the type has no groups
  local seen = {}
  for _, name in ipairs(GROUP_NAMES) do
    if reg[name] == nil or seen[name] then same = false end
    seen[name] = true
  end
  if not same then return nil, names end
  return reg, names
end

local function stale(names)
  return {'stale', unpack(names)}
end

-- check_keys (see _prelude.lua) for the keys of every group passed
local function check_group_keys()
  for g = 1, N_GROUPS do
    for j = 1, GROUP_WIDTH do
      local key = gkey(g, j)
      local found = redis.call('TYPE', key).ok
      if found ~= 'none' and found ~= GKEY_KIND[j] then
        refuse_wrong_type(key, found, GKEY_KIND[j])
      end
    end
  end
end

-- Group g's ready lists of priority levels 1..9 (_levels.lua), for push_ready_to
-- and recover_orphans; nil when no event of the type is above level 0 (one EXISTS
-- per call) or the script takes no level lists
local function group_levels(g)
  if LEVEL_WIDTH == 0 or not levelled() then return nil end
  local lists = {}
  for n = 1, LEVEL_WIDTH do lists[n] = glkey(g, n) end
  return lists
end
