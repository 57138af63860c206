-- worker_remove: a worker process that closes takes itself off the list.
--
-- KEYS (delayq/keyspace/scripts.py): `workers`, `worker`: the prefix's worker index
--   (ZSET), this worker's record.
-- ARGV[1] worker id
-- Returns: 1 when the record was there, else 0.
-- Guarantees: record and index entry go together.
redis.call('ZREM', K_WORKERS, ARGV[1])
return redis.call('DEL', K_WORKER)
