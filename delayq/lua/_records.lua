-- An event's records beside its envelope (attempts, errors, lease): pages of them
-- read, and a delivery's forgotten. Part of the per-type scripts' helpers (see
-- _prelude.lua).

-- Appends id, score, envelope, attempts, last error for each (id, score) pair of a
-- ZRANGE ... WITHSCORES reply to `result` (a page of a list's events).
local function append_records(result, ids)
  for i = 1, #ids, 2 do
    local id = ids[i]
    result[#result + 1] = id
    result[#result + 1] = ids[i + 1]
    result[#result + 1] = redis.call('HGET', K_EVENTS, id)
    result[#result + 1] = redis.call('HGET', K_ATTEMPTS, id)
    result[#result + 1] = redis.call('HGET', K_ERRORS, id)
  end
  return result
end

-- Forgets every trace of an id's delivery (schedule, ready list entry, lease,
-- attempts, last error); a stale ready entry is skipped by claim, and a running
-- handler's ack finds no lease and is ignored.
local function forget_delivery(id)
  redis.call('ZREM', K_SCHEDULED, id)
  redis.call('ZREM', K_QUEUED, id)
  redis.call('ZREM', K_INFLIGHT, id)
  redis.call('HDEL', K_LEASES, id)
  redis.call('HDEL', K_ATTEMPTS, id)
  redis.call('HDEL', K_ERRORS, id)
end
