-- Checks before a script's first write: keys of the wrong Redis type, and a
-- full Redis (maxmemory). Part of the per-type scripts' helpers (see _prelude.lua).

-- Stops the script before its first write when one of the given keys (by
-- name) holds a value of the wrong Redis type, written by something other
-- than delayq. Redis does not roll a script back: failing half-way on such a
-- key could leave an event in no state at all (stranded). Scripts check the
-- keys they write after their first write; keys read before any write need no
-- check (the read fails first). KEY_OF and KEY_KIND (name -> key, name -> its
-- Redis type) come with the script's header (delayq/keyspace/scripts.py).
-- The error's code (its first word) is WRONGTYPE on every server, as for a
-- command that met such a key (see refuse_wrong_type).
-- Ends the script with a WRONGTYPE error naming `key`. A plain error('WRONGTYPE ...')
-- reaches clients as "ERR WRONGTYPE ..." on Redis 7+ and Valkey; an error table keeps
-- its code there but breaks Redis 6.2's error handler, which wraps a string error
-- as "ERR Error running script (...): @user_script:N: WRONGTYPE ..." instead (code
-- unwrapped by delayq.errors.error_code). REDIS_VERSION_NUM exists from Redis 7.0
-- (and in Valkey).
local function refuse_wrong_type(key, found, expected)
  local message = 'WRONGTYPE delayq key ' .. key .. ' holds a ' .. found .. ', not a ' ..
    expected .. ': something other than delayq wrote it; nothing was changed'
  if redis.REDIS_VERSION_NUM then error(redis.error_reply(message)) end
  error(message, 0)
end

local function check_keys(...)
  for _, name in ipairs({...}) do
    local named_key = KEY_OF[name]
    local found = named_key and redis.call('TYPE', named_key).ok or 'none'
    if found ~= 'none' and found ~= KEY_KIND[name] then
      refuse_wrong_type(named_key, found, KEY_KIND[name])
    end
  end
end

-- At maxmemory (noeviction) Redis refuses a script's first write that may grow
-- memory, unless the script has already written. Scripts that drain the queue
-- (claim, renew, fail, move_due) call this first, so handling what is queued
-- goes on while Redis is full; enqueue does not, and fails before writing.
-- (HDEL of a field that never exists: a write that changes nothing.)
local function keep_working_when_full()
  redis.call('HDEL', K_META, '-')
end
