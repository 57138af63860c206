-- Redis's clock. Part of the per-type scripts' helpers (see _prelude.lua).

-- Redis's own clock decides every due time and lease: client clocks may be off.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
