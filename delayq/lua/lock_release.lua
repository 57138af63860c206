-- lock_release: give up the scheduler lock and tell the standbys.
--
-- KEYS (delayq/keyspace/scripts.py): `lock`: the prefix's scheduler lock.
-- ARGV[1] owner token, ARGV[2] the prefix's wake-up channel
-- Returns: 1 released, 0 not ours (expired and taken by another scheduler).
-- Guarantees: compare-and-delete: a scheduler never deletes another's lock.
-- The message ':released' (never a type name: names hold no ':') makes the
-- standbys try the lock at once, so a graceful stop hands over within a few ms.
if redis.call('GET', K_LOCK) == ARGV[1] then
  redis.call('DEL', K_LOCK)
  if ARGV[2] then redis.call('PUBLISH', ARGV[2], ':released') end
  return 1
end
return 0
