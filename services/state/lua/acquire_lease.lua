-- acquire_lease: become the scheduler that places jobs, if no live one is.
--
-- Guarantees (atomic): at most one holder at a time. When the lease key is
-- absent (never taken, released, or expired because its holder stopped
-- renewing it), it takes a new epoch from the epoch counter and writes
-- "epoch:holder" with a time to live; otherwise nothing changes. Epochs only
-- grow, so a value names one tenure: a script given an older value (a leader
-- that paused past its lease and woke up) is refused (place_jobs.lua,
-- declare_node_dead.lua check it).
--
-- KEYS[1] lease key  KEYS[2] epoch counter
-- ARGV[1] holder id  ARGV[2] time to live (ms)
-- Returns the lease value taken, or false when another holds it.

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "string"}, {KEYS[2], "string"})

if redis.call("EXISTS", KEYS[1]) == 1 then
  return false
end
local epoch = redis.call("INCR", KEYS[2])
local value = epoch .. ":" .. ARGV[1]
redis.call("SET", KEYS[1], value, "PX", ARGV[2])
return value
