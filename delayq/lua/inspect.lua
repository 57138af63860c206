-- inspect: everything Redis holds about one event, in one consistent read.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `queued`, `inflight`,
--   `attempts`, `errors`, `dead`, `groups`, `prio`, `waiting` of the type or one group's
--   view (see _prelude.lua).
-- ARGV[1] id
-- Returns: {now_ms, envelope, scheduled_due_ms, queued_score, lease_deadline_ms,
--           dead_at_ms, attempts, last_error, priority, waiting_due_ms}; every item after now_ms is false
--           when Redis has no such value. Or {'stale', group...} when the type
--           has delivery groups (the caller runs group_inspect.lua).
-- Guarantees: read-only; one atomic view, so the event is seen in exactly the
-- state it had at one instant (never half-way through a transition).
local id = ARGV[1]
if grouped() then return {'stale', unpack(redis.call('HKEYS', K_GROUPS))} end
return {
  clock_ms(),
  redis.call('HGET', K_EVENTS, id),
  redis.call('ZSCORE', K_SCHEDULED, id),
  redis.call('ZSCORE', K_QUEUED, id),
  redis.call('ZSCORE', K_INFLIGHT, id),
  redis.call('ZSCORE', K_DEAD, id),
  redis.call('HGET', K_ATTEMPTS, id),
  redis.call('HGET', K_ERRORS, id),
  redis.call('HGET', K_PRIO, id),
  K_WAITING and redis.call('ZSCORE', K_WAITING, id),
}
