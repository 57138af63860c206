-- Group prelude: prepended (after _prelude.lua) to the scripts that act on
-- every delivery group of one type at once (group_move, group_cancel,
-- group_replace) or on one whole group (group_remove).
-- KEYS[1..13] as in _prelude.lua (the default group's view of the type), then
-- nine keys per group, in the order of the names in ARGV[2 .. ARGV[1] + 1]:
--   scheduled (the group's retries), ready, queued, inflight, leases,
--   attempts, errors, dead, meta
-- (for the default group: its retry schedule and the type's own keys); then
-- four per group for flow keys and the type's fkeys (see gkkey below).
-- ARG(i) is the script's own i-th argument, after the names.
local N_GROUPS = tonumber(ARGV[1])
local GROUP_NAMES = {}
for i = 1, N_GROUPS do GROUP_NAMES[i] = ARGV[1 + i] end
local function ARG(i) return ARGV[1 + N_GROUPS + i] end
local G_SCHED, G_READY, G_QUEUED, G_INFLIGHT, G_LEASES = 1, 2, 3, 4, 5
local G_ATTEMPTS, G_ERRORS, G_DEAD, G_META = 6, 7, 8, 9
local function gkey(g, j) return KEYS[13 + 9 * (g - 1) + j] end
-- then each group's flow-key state (klines, krot, kwait, krun: see _prelude.lua)
-- and the type's fkeys, after all the groups' nine
local G_KLINES, G_KROT, G_KWAIT = 1, 2, 3
local function gkkey(g, j) return KEYS[13 + 9 * N_GROUPS + 4 * (g - 1) + j] end
-- (the prelude's K_LIMITS .. K_KRUN name other keys here: group scripts pass
-- gkkey's to push_ready_to and never use those)
K_FKEYS = KEYS[13 + 13 * N_GROUPS + 1]

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

local GKEY_TYPES = {'zset', 'list', 'zset', 'zset', 'hash', 'hash', 'hash', 'zset', 'hash'}
-- check_keys (see _prelude.lua) for the keys of every group passed
local function check_group_keys()
  for g = 1, N_GROUPS do
    for j = 1, 9 do
      local key = gkey(g, j)
      local found = redis.call('TYPE', key).ok
      if found ~= 'none' and found ~= GKEY_TYPES[j] then
        refuse_wrong_type(key, found, GKEY_TYPES[j])
      end
    end
  end
end
