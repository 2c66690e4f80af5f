-- dispatch_job: publish one launch command per node and mark the job launching.
--
-- Guarantees (atomic, one script): the launch messages are written only if the
-- job is still reserved under the same fencing token (a cancel or a newer
-- reservation in between makes this a no-op); the messages and the state
-- change land together, so an agent never sees a launch for a job the
-- scheduler does not consider launching, and a crash cannot publish half.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3 ..] one launch stream per node
-- ARGV[1] fence  ARGV[2] now  ARGV[3] history entry JSON  ARGV[4] stream MAXLEN
-- ARGV[5 ..] one launch message JSON per stream, same order as KEYS[3 ..]
-- Returns {1, ""} or {0, reason}

--#include job_states

local h = redis.call("HMGET", KEYS[1], "state", "fence")
if h[1] ~= JOB_STATE.reserved then
  return {0, "job is " .. tostring(h[1]) .. ", not " .. JOB_STATE.reserved}
end
if h[2] ~= ARGV[1] then
  return {0, "stale fence " .. ARGV[1] .. " (job holds " .. tostring(h[2]) .. ")"}
end
for i = 3, #KEYS do
  redis.call("XADD", KEYS[i], "MAXLEN", "~", ARGV[4], "*", "data", ARGV[i + 2])
end
set_state(KEYS[1], JOB_STATE.launching, "updated_at", ARGV[2])
redis.call("RPUSH", KEYS[2], ARGV[3])
return {1, ""}
