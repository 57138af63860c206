-- heartbeat: a worker process says it is alive.
--
-- KEYS (delayq/keyspace/scripts.py): `workers`, `worker`: the prefix's worker index (ZSET
--   worker id -> expiry ms), this worker's record (STRING).
-- ARGV[1] worker id, ARGV[2] the record (JSON), ARGV[3] time to live in ms
-- Returns: Redis's time in ms.
-- Guarantees: the record and its index entry expire together: a process that
-- stops beating disappears by itself after the TTL. Index entries of workers
-- whose records expired are pruned here, so the index holds live workers and
-- the recently dead only; the index itself expires when every worker is gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('SET', K_WORKER, ARGV[2], 'PX', ttl)
redis.call('ZADD', K_WORKERS, now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', K_WORKERS, '-inf', '(' .. now)
-- keep the index as long as its longest-lived member (no PEXPIRE GT on Redis 6.2)
if redis.call('PTTL', K_WORKERS) < ttl then redis.call('PEXPIRE', K_WORKERS, ttl) end
return now
