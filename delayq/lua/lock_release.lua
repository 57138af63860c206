-- lock_release: give up the scheduler lock.
--
-- KEYS[1] the prefix's scheduler lock
-- ARGV[1] owner token
-- Returns: 1 released, 0 not ours (expired and taken by another scheduler).
-- Guarantees: compare-and-delete: a scheduler never deletes another's lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
