-- lock_take: take the scheduler lock, or keep it if we hold it.
--
-- KEYS[1] the prefix's scheduler lock
-- ARGV[1] owner token, ARGV[2] time to live in ms
-- Returns: 1 when the caller holds the lock now, else 0.
-- Guarantees: only the holder's token renews it; SET NX PX takes a free lock.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then return 0 end
-- The key is absent: this DEL changes nothing, but as the script's first write
-- it lets the SET below run when Redis is at maxmemory (see _prelude.lua).
redis.call('DEL', KEYS[1])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
