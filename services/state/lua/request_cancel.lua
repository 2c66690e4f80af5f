-- request_cancel: ask every node running a job to stop it.
--
-- Guarantees (atomic, one script): only a launching or running job is
-- affected; the cancel flag, one cancel command per node stream and the
-- history note land together. The job ends cancelled when every node has
-- reported its exit (record_exit), which also releases the GPUs.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3 ..] launch streams of the job's nodes
-- ARGV[1] now  ARGV[2] history note JSON  ARGV[3] stream MAXLEN
-- ARGV[4] JSON array: the cancel message for each launch stream, same order as KEYS[3 ..]
--         (each is signed with its node's key)
-- ARGV[5] flag field to set: "cancel_requested" (a user cancel: the job ends
--         cancelled) or "stop_requested" (a rank failed: the job ends failed)
-- Returns {1, state} or {0, state}

--#include check_types
--#include job_states

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "list"})
check_key_range(3, #KEYS, 1, "stream")

local state = redis.call("HGET", KEYS[1], "state")
if state ~= JOB_STATE.launching and state ~= JOB_STATE.running then
  return {0, tostring(state)}
end
if redis.call("HGET", KEYS[1], ARGV[5]) == "1" then
  return {1, state}
end
redis.call("HSET", KEYS[1], ARGV[5], "1", "updated_at", ARGV[1])
local cancels = cjson.decode(ARGV[4])
for i = 3, #KEYS do
  redis.call("XADD", KEYS[i], "MAXLEN", "~", ARGV[3], "*", "data", cancels[i - 2])
end
redis.call("RPUSH", KEYS[2], ARGV[2])
return {1, state}
