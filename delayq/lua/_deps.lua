-- Dependencies (docs/WORKFLOWS.md, "Dependencies"): a child waits for its parents, which
-- may live on other slots. Part of the per-type scripts' helpers (see _prelude.lua).
-- No script touches two slots: a parent's completion is written in its own slot, and the
-- relay (delayq/runtime/relay.py) hands it to each child's slot, where applying it twice
-- changes nothing. Fields of K_DEPS (NUL separates the parts):
--   as a parent, per id P:
--     c:P           children linked so far (numbered 1..c)
--     b:P           children linked before P's last completion (those are handed on)
--     k:P NUL n     child n: "<child shard> NUL <child id>"
--     l:P NUL s NUL id   child id of shard s is linked (its number): a link again is a no-op
--     f:P           P's last completion record, "<ms>:<outcome>", for children linked late
--     r:P NUL hi    the record of the completion that hands on children up to hi
--   as a child, per id C:
--     w:C           cmsgpack {policy, created ms, parent type, parent id, ...}
--     n:C           parents not done yet
--     e:C NUL T NUL P    '' while parent (T, P) is not done, then its record
-- An outcome is "o" (done) with a kept result after it ("o" .. mark .. value), "f" ..
-- error (a dead letter), "c" (cancelled), "s" (skipped by its own parents' failure) or
-- "m" (no such event when the child linked: done long ago, or never enqueued) or "v"
-- (vanished: linked, then gone without a completion; see dep_link.lua).
-- K_RELAY: "c NUL P NUL lo NUL hi" -> when (children lo..hi of P to hand the record
-- r:P NUL hi), "a NUL C" -> when child C's parents are looked at again (the audit).

-- A shard (type) that takes part in dependencies is marked where the hot scripts already
-- look, so that a type without them pays nothing: its dedup set holds the member 'deps'
-- (ack.lua reads it only when unique_for's EXISTS finds that set) and its meta hash the
-- field 'deps' (move_due.lua reads it only when a lease expires on its last delivery).
-- Their callers then send the dependency keys `deps`, `relay`; a call without them finds
-- the mark and changes nothing (it answers so, and is made again with them).
local DEP_MARK = 'deps'
local function dep_mark()
  redis.call('ZADD', K_DEDUP, '-inf', DEP_MARK)
  redis.call('HSET', K_META, DEP_MARK, 1)
end
local function dep_marked()
  return redis.call('ZSCORE', K_DEDUP, DEP_MARK) ~= false
end

-- P's envelope is gone (acked, purged, cancelled): its parent fields go unless the relay
-- still has children to hand its completion (dep_relayed.lua clears them then).
local function dep_gone(id)
  local c = tonumber(redis.call('HGET', K_DEPS, 'c:' .. id))
  if c and c <= (tonumber(redis.call('HGET', K_DEPS, 'b:' .. id)) or 0)
      and redis.call('HEXISTS', K_EVENTS, id) == 0 then
    local pending = false
    -- a completion not relayed yet keeps r:/k:/l: fields: dep_relayed clears them
    if redis.call('HEXISTS', K_DEPS, 'r:' .. id .. '\0' .. c) == 1 then pending = true end
    if not pending then redis.call('HDEL', K_DEPS, 'c:' .. id, 'b:' .. id, 'f:' .. id) end
  end
end

-- Whether child number n of P (its `l:` field's value) is covered by a completion of P:
-- one came after it was linked (b:P counts those), so the relay hands it on (or has).
local function dep_covered(id, n)
  return n <= (tonumber(redis.call('HGET', K_DEPS, 'b:' .. id)) or 0)
end

-- P is done with `outcome` at `now`: its children linked since the last completion are
-- handed the record (false: P has no children; nothing written).
local function dep_complete(id, outcome, now)
  local c = tonumber(redis.call('HGET', K_DEPS, 'c:' .. id))
  if not c then return false end
  local b = tonumber(redis.call('HGET', K_DEPS, 'b:' .. id)) or 0
  local record = string.format('%.0f', now) .. ':' .. outcome
  redis.call('HSET', K_DEPS, 'f:' .. id, record)
  if c <= b then return false end
  redis.call('HSET', K_DEPS, 'b:' .. id, c, 'r:' .. id .. '\0' .. c, record)
  redis.call('ZADD', K_RELAY, now, 'c\0' .. id .. '\0' .. (b + 1) .. '\0' .. c)
  return true
end

-- The K_DEPS fields of child C, (HDEL'd by dep_forget): its record, its count, its edges.
local function dep_fields(id, w)
  local rec = cmsgpack.unpack(w)
  local fields = {'w:' .. id, 'n:' .. id}
  for i = 3, #rec, 2 do fields[#fields + 1] = 'e:' .. id .. '\0' .. rec[i] .. '\0' .. rec[i + 1] end
  return fields, rec
end

-- C is gone (acked, cancelled, skipped, purged): its waiting record and edges go too.
local function dep_forget(id)
  local w = redis.call('HGET', K_DEPS, 'w:' .. id)
  if not w then return end
  local fields = dep_fields(id, w)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', K_DEPS, unpack(fields, i, math.min(#fields, i + 999)))
  end
  redis.call('ZREM', K_RELAY, 'a\0' .. id)
end
