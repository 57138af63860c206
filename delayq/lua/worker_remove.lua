-- worker_remove: a worker process that closes takes itself off the list.
--
-- KEYS[1] the prefix's worker index (ZSET), KEYS[2] this worker's record
-- ARGV[1] worker id
-- Returns: 1 when the record was there, else 0.
-- Guarantees: record and index entry go together.
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2])
