-- lock_steal: take the scheduler lock from a holder that stopped moving events.
--
-- KEYS (delayq/keyspace/scripts.py): `lock`: the prefix's scheduler lock.
-- ARGV[1] the holder's token as the caller last saw it, ARGV[2] the caller's
--         token, ARGV[3] time to live in ms
-- Returns: 1 when the caller holds the lock now, else 0.
-- Guarantees: compare-and-set: the lock changes hands only if it is still held
-- by ARGV[1] (or is free), so two standbys that both saw overdue events cannot
-- take it from each other, nor from a leader that took over meanwhile. The
-- lock only saves work (every move is atomic), so a leader that was merely
-- slow loses nothing but the lock.
local holder = redis.call('GET', K_LOCK)
if holder ~= false and holder ~= ARGV[1] and holder ~= ARGV[2] then return 0 end
redis.call('DEL', K_LOCK)  -- first write: lets SET run at maxmemory (see lock_take.lua)
redis.call('SET', K_LOCK, ARGV[2], 'PX', ARGV[3])
return 1
