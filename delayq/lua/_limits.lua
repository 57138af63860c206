-- Flow limits' wake-ups. Part of the per-type scripts' helpers (see _prelude.lua).

-- Wakes up to n consumers waiting for a slot of a type with flow limits (they
-- BLPOP the wake list, a second at most): one token each, a few kept for a
-- second, so a token nobody takes costs at most one needless claim.
local function wake_waiters(n)
  local tokens = {}
  for i = 1, math.min(n, 16) do tokens[i] = '1' end
  redis.call('LPUSH', K_WAKE, unpack(tokens))
  redis.call('LTRIM', K_WAKE, 0, 15)
  redis.call('PEXPIRE', K_WAKE, 1000)
end
