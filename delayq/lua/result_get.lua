-- result_get: the outcomes of events of a type that keeps results (read-only).
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `dead`, `errors`, `results`, `rexp` of
--   the type (its default group's view).
-- ARGV: ids
-- Returns: per id a pair {state, data}: 'd', error (a dead letter), 'f', record (a kept
-- failure record, "f" .. error, with no event pending), 'p', '' (pending: enqueued, scheduled, running, or
-- held by a delivery group not done yet), 'o', record (a kept result: see
-- delayq/results.py), 'm', '' (missing: no event and no kept, unexpired outcome).
-- Guarantees: one atomic read: a result is never seen without its ack, nor the
-- event gone without its result (the ack writes both in one step). A dead letter
-- wins over everything, then a pending event (a new run of the id, e.g. after a
-- replace or a requeue, is waited for), then the kept record; a record past its
-- expiry (Redis time) counts as missing even before a sweep removes it.
local now = nil
local out = {}
for i, id in ipairs(ARGV) do
  if redis.call('ZSCORE', K_DEAD, id) then
    out[i] = {'d', redis.call('HGET', K_ERRORS, id) or ''}
  elseif redis.call('HEXISTS', K_EVENTS, id) == 1 then
    out[i] = {'p', ''}
  else
    local record = redis.call('HGET', K_RESULTS, id)
    if record then
      now = now or clock_ms()
      if (tonumber(redis.call('ZSCORE', K_REXP, id)) or 0) <= now then record = false end
    end
    if record then
      out[i] = {string.sub(record, 1, 1), record}
    else
      out[i] = {'m', ''}
    end
  end
end
return out
