-- set_pending_reasons: write the pending reason of several waiting jobs in one call.
--
-- Guarantees: a job hash that no longer exists is not written (an HSET would create a stub
-- record of a deleted job); nothing else of the job is touched. Not a state change: the
-- reasons are what `frenzy job` shows while a job waits.
--
-- KEYS: the job hashes  ARGV: their reasons, same order
-- Returns how many were written.

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_key_range(1, #KEYS, 1, "hash")

local written = 0
for i, key in ipairs(KEYS) do
  if redis.call("EXISTS", key) == 1 then
    redis.call("HSET", key, "pending_reason", ARGV[i])
    written = written + 1
  end
end
return written
