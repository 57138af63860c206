-- sink_enqueue: enqueue.lua for a Spark streaming sink, applied once per (ledger, batch, id).
--
-- KEYS (delayq/keyspace/scripts.py): `events`, `scheduled`, `ready`, `queued`, `inflight`,
--   `leases`, `attempts`, `errors`, `dead`, `meta`, `groups`, `pending`, `retries`, `sink`,
--   `dedup`, `fkeys`, `klines`, `krot`, `kwait` enqueue.lua's up to retries, then sink,
--   the sink's ledger (ZSET id -> batch id; TypeKeys.sink), then enqueue.lua's others (never
--   sent by the sink), then `prio` and the levels' ready lists `ready_1` `ready_2`
--   `ready_3` `ready_4` `ready_5` `ready_6` `ready_7` `ready_8` `ready_9` (for a sink
--   with a priority column), then `waiting` (never sent by the sink), all under one hash
--   tag.
-- ARGV[1..4] as for enqueue.lua, without ':mp' (mode; replace flag with call id
--          and chunk number; wake-up channel; type name)
-- ARGV[5]  the micro-batch id (an integer >= 0)
-- ARGV[6..] triples: id, envelope, time (as for enqueue.lua); with ':p' after the
--          mode (a priority column) quads: id, envelope, time, priority level
-- Returns: one code per triple: enqueue.lua's (1 added, 0 kept, 2 replaced, 3 not
--          written, see there), or 4 when the ledger already holds the id for
--          this batch (an earlier run of the batch, a retried task, or an earlier
--          row of the batch with that id wrote it): nothing was written for it.
-- Guarantees: the enqueue of an id and its ledger entry are written by one
-- script, so an id is enqueued at most once per (ledger, batch), whatever runs
-- of the batch came before. Ledger entries of earlier batches are removed by the
-- first call of a later batch (Spark replays only the last batch, so they can
-- never be asked for again): the ledger holds at most one batch's ids. A call
-- with a batch id lower than one the ledger holds (a stale task, or the sink's
-- name reused with a new checkpoint) gets the error reply DELAYQ_SINK_REWOUND and
-- changes nothing (so does a ledger key of another type: WRONGTYPE).

-- enqueue.lua's body (inserted by delayq/lua/__init__.py), run on the arguments given
local function enqueue(ARGV)
--@enqueue.lua
end

local found = redis.call('TYPE', K_SINK).ok
if found ~= 'none' and found ~= 'zset' then
  return redis.error_reply('WRONGTYPE delayq key ' .. K_SINK .. ' holds a ' .. found ..
    ', not a zset: something other than delayq wrote it; nothing was changed')
end
local batch = tonumber(ARGV[5])
local top = redis.call('ZREVRANGE', K_SINK, 0, 0, 'WITHSCORES')
if top[2] and tonumber(top[2]) > batch then
  return redis.error_reply('DELAYQ_SINK_REWOUND the sink ledger ' .. K_SINK ..
    ' holds batch ' .. top[2] .. ', later than batch ' .. ARGV[5] .. ' (a stale task, or ' ..
    'the sink name reused with a new checkpoint); nothing was changed')
end

local width = string.sub(ARGV[1], -2) == ':p' and 4 or 3
local ids = {}
for i = 6, #ARGV, width do ids[#ids + 1] = ARGV[i] end
local done = {}
for i = 1, #ids, 1000 do
  local part = {}
  for j = i, math.min(#ids, i + 999) do part[#part + 1] = ids[j] end
  local got = redis.call('ZMSCORE', K_SINK, unpack(part))
  for j = 1, #part do done[i + j - 1] = got[j] end
end

local args, fresh, codes, seen = {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}, {}, {}, {}
for k = 1, #ids do
  local id = ids[k]
  if seen[id] or (done[k] and tonumber(done[k]) == batch) then
    codes[k] = 4
  else
    seen[id] = true
    local i = 6 + (k - 1) * width
    for j = 0, width - 1 do args[#args + 1] = ARGV[i + j] end
    fresh[#fresh + 1] = k
  end
end
if #fresh > 0 then
  local got = enqueue(args)
  local entries = {}
  for j, k in ipairs(fresh) do
    codes[k] = got[j]
    entries[#entries + 1] = batch
    entries[#entries + 1] = ids[k]
    if #entries >= 2000 then
      redis.call('ZADD', K_SINK, unpack(entries))
      entries = {}
    end
  end
  if #entries > 0 then redis.call('ZADD', K_SINK, unpack(entries)) end
end
redis.call('ZREMRANGEBYSCORE', K_SINK, '-inf', '(' .. ARGV[5])
return codes
