-- group_register: make a delivery group of one type exist (durably).
--
-- KEYS (delayq/keyspace/scripts.py): `groups` of the type or one group's view (see
--   _prelude.lua).
-- ARGV[1] group name, ARGV[2] its max deliveries (1 + retry attempts: what the
--         scheduler uses when a lease of this group expires)
-- Returns: 1 newly registered, 0 already registered (its max deliveries are
--          updated), 0 for 'default' while the type has no named group (it is
--          registered implicitly then: nothing to write).
-- Guarantees: the first named group registers the default group with it, so
-- the handlers that never named a group keep getting every event (remove it
-- with group_remove.lua when no process handles it). From the next move on,
-- every event that becomes due is fanned out to the new group too.
local name = ARGV[1]
if redis.call('EXISTS', K_GROUPS) == 0 then
  if name == 'default' then return 0 end
  redis.call('HSET', K_GROUPS, 'default', ARGV[2])
end
return redis.call('HSET', K_GROUPS, name, ARGV[2])
