-- lock_take: take the scheduler lock, or keep it if we hold it.
--
-- KEYS (delayq/keyspace/scripts.py): `lock`: the prefix's scheduler lock.
-- ARGV[1] owner token, ARGV[2] time to live in ms
-- Returns: {1} when the caller holds the lock now, else {0, holder's token}
--          (a standby scheduler keeps the token: see lock_steal.lua).
-- Guarantees: only the holder's token renews it; a free lock is taken. A key
-- that cannot be a lock (another Redis type, or a string without the TTL every
-- lock has: written by something else) would stop scheduling for good, so it
-- is taken over.
if redis.call('TYPE', K_LOCK).ok == 'string' then
  local holder = redis.call('GET', K_LOCK)
  if holder == ARGV[1] then
    redis.call('PEXPIRE', K_LOCK, ARGV[2])
    return {1}
  end
  if redis.call('PTTL', K_LOCK) >= 0 then return {0, holder} end  -- another scheduler's
end
-- Free (or garbage). When the key is absent this DEL changes nothing, but as
-- the script's first write it lets the SET below run when Redis is at
-- maxmemory (see _prelude.lua).
redis.call('DEL', K_LOCK)
redis.call('SET', K_LOCK, ARGV[1], 'PX', ARGV[2])
return {1}
