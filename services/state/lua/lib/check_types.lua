-- lib/check_types: every key a script may write has the type it expects, checked before its first write.
--
-- Not a script of its own: frenzy.state.scripts inlines it at load. Redis runs a script to its end
-- or to its first error and does not roll back what it wrote before the error, so a WRONGTYPE
-- part-way (a key of another type where the script expects a hash, say: written by hand, by an older
-- version, or by a bug) would leave the earlier writes applied: a job moved without its history,
-- GPUs owned by a job that is not launching. Each script that writes several keys therefore checks,
-- before its first write, the type of every key it may write (and of the keys derived from them,
-- like the queue's `:users` hash) and fails naming the key, writing nothing. A key that does not
-- exist ("none") always passes: the script makes it.
--
-- The check is TYPE, one O(1) call per key. A Redis user whose ACL predates the check (an agent's
-- made before TYPE was in its command list: frenzy.state.acl) may not run TYPE; the check is then
-- skipped for that key, as before it existed, rather than failing every heartbeat.

-- Why `key` is not usable as a `want` ("hash", "list", "zset", "set", "string", "stream"), or nil.
local function wrong_type(key, want)
  local reply = redis.pcall("TYPE", key)
  local t = type(reply) == "table" and reply["ok"] or nil
  if t == nil or t == "none" or t == want then
    return nil
  end
  return "WRONGTYPE " .. key .. " holds a " .. t .. ", not a " .. want .. " (nothing was written)"
end

-- Fail (an error reply, before any write) on the first of the {key, type} pairs given whose key has
-- another type.
local function check_types(...)
  for _, spec in ipairs({...}) do
    local why = wrong_type(spec[1], spec[2])
    if why then
      error({err = why})
    end
  end
end

-- check_types over KEYS[first], KEYS[first + step], ... up to KEYS[last], each of type `want`.
local function check_key_range(first, last, step, want)
  for i = first, last, step do
    local why = wrong_type(KEYS[i], want)
    if why then
      error({err = why})
    end
  end
end
