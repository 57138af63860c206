-- group_inspect: inspect.lua for a type with delivery groups: where one event
-- is in every group, in one consistent read.
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `groups`, `pending` of the
--   type, its `prio` and `waiting`, then every group's (see _groups.lua), with every
--   registered group.
-- ARGV: n, the group names, then ARG(1) id
-- Returns: {'groups', now_ms, envelope, due ms in the type's schedule (not
--           fanned out yet), pending count, priority level, own due ms while it
--           waits for parents (docs/WORKFLOWS.md), then per group in the order
--           passed: its name, retry due ms, queued score, lease deadline ms,
--           dead-letter time ms, attempts, last error}; values Redis does not
--           have are false. Or {'stale', group...} (see group_move.lua).
-- Guarantees: read-only; one atomic view of the event in every group.
local reg, names = registry()
if not reg then return stale(names) end
local id = ARG(1)
local result = {
  'groups',
  clock_ms(),
  redis.call('HGET', K_EVENTS, id),
  redis.call('ZSCORE', K_SCHEDULED, id),
  redis.call('HGET', K_PENDING, id),
  redis.call('HGET', K_PRIO, id),
  redis.call('ZSCORE', K_WAITING, id),
}
for g = 1, N_GROUPS do
  result[#result + 1] = GROUP_NAMES[g]
  result[#result + 1] = redis.call('ZSCORE', gkey(g, G_SCHEDULED), id)
  result[#result + 1] = redis.call('ZSCORE', gkey(g, G_QUEUED), id)
  result[#result + 1] = redis.call('ZSCORE', gkey(g, G_INFLIGHT), id)
  result[#result + 1] = redis.call('ZSCORE', gkey(g, G_DEAD), id)
  result[#result + 1] = redis.call('HGET', gkey(g, G_ATTEMPTS), id)
  result[#result + 1] = redis.call('HGET', gkey(g, G_ERRORS), id)
end
return result
