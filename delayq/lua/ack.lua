-- ack: handlers succeeded; their events leave Redis.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `ready`, `inflight`, `leases`, `attempts`,
--   `errors`, `meta`, `pending`, `limits`, `wake`, `dedup`, `fkeys`, `klines`, `krot`,
--   `kwait`, `krun` of the group (see _prelude.lua); the flow-key state only for keyed
--   deliveries.
--   then `prio` (_levels.lua), then `deps`, `relay` (only for a type with dependencies)
-- ARGV: pairs id, token (the claim token of the delivery that succeeded)
-- Returns: how many events were removed; {removed, id...} when the events of these ids
-- were parents whose completion now waits for the relay (see _deps.lua); -1: the type
-- has dependencies and `deps` was not given (nothing changed).
-- Guarantees: only the current delivery removes an event. A stale ack (the
-- lease expired and the event was redelivered, replaced or cancelled) is a
-- no-op, so a newer delivery or a replaced payload is never lost. The envelope
-- goes with the last group holding the event (see release in _prelude.lua).
-- With a fleet-wide concurrency limit, consumers waiting for a slot are woken
-- (one HEXISTS per call when the type has none). An event enqueued with
-- unique_for, once its last group is done, is refused for its ttl from now
-- (one EXISTS per call when no dedup mode was ever used). A keyed delivery
-- (token "<n>|<key>") frees its key's per-key slot and puts the key back into
-- rotation if its per-key concurrency limit had parked it. Dependencies (docs/WORKFLOWS.md;
-- nothing more than unique_for's EXISTS when the type never had any): an event done (its
-- envelope gone) that has children records its completion for the relay, and a child's
-- own edges go; they need the keys `deps`, `relay`, sent only for a type marked as having
-- dependencies (see dep_mark in _deps.lua): a call without them for such a type changes
-- nothing and returns -1.
local counted = counting()
local unique = redis.call('EXISTS', K_DEDUP) == 1
-- a type with dependencies has its dedup set marked (dep_marked): a call without their
-- keys changes nothing and answers -1, and the caller calls again with them
if unique and not K_DEPS and dep_marked() then return -1 end
local deps = K_DEPS and redis.call('EXISTS', K_DEPS) == 1
local now = (unique or deps) and clock_ms()
local removed = 0
local completed = nil
local unpark = nil
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', K_LEASES, id) == ARGV[i + 1] then
    -- the envelope and the lease go last: a key of the wrong type (see
    -- check_keys in _prelude.lua) stops the script before the event is gone
    redis.call('HDEL', K_ERRORS, id)
    redis.call('HDEL', K_ATTEMPTS, id)
    redis.call('ZREM', K_INFLIGHT, id)
    redis.call('HDEL', K_LEASES, id)
    release(id, counted)
    removed = removed + 1
    if string.find(ARGV[i + 1], '|', 1, true) then
      -- a keyed delivery: its key's slot is free (see key_done in _prelude.lua)
      if unpark == nil then unpark = redis.call('HEXISTS', K_LIMITS, 'key_concurrency') == 1 end
      key_done(id, ARGV[i + 1], unpark)
    end
    if deps and redis.call('HEXISTS', K_EVENTS, id) == 0 then
      dep_forget(id)
      if dep_complete(id, 'o', now) then
        completed = completed or {}
        completed[#completed + 1] = id
      end
    end
    if unique then
      local ttl = tonumber(redis.call('ZSCORE', K_DEDUP, 'u:' .. id))
      if ttl and ttl < 0 and redis.call('HEXISTS', K_EVENTS, id) == 0 then
        redis.call('ZADD', K_DEDUP, now - ttl, 'u:' .. id)
      end
    end
  end
end
if removed > 0 and redis.call('HEXISTS', K_LIMITS, 'concurrency') == 1 then
  wake_waiters(removed)
end
if completed then return {removed, unpack(completed)} end
return removed
