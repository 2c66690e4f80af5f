-- record_exit: record that a job's process on one node ended; when the last
-- node has ended, finish the job and release its GPUs.
--
-- Guarantees (atomic, one script): an exit is counted once per node and
-- attempt (a redelivered event changes nothing); events of an older attempt
-- are ignored; the final state (CANCELLED if a cancel was requested, else
-- SUCCEEDED if every node exited 0, else FAILED), the history entry and the
-- release of every GPU still owned by this job happen together.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3 ..] the job's GPU hashes
-- ARGV[1] job id  ARGV[2] attempt  ARGV[3] node  ARGV[4] exit code
-- ARGV[5] number of nodes  ARGV[6] now  ARGV[7] reason text for the history
-- Returns {status, state, exited_nodes, failed_nodes} where status is
--   "ignored" (stale or repeated), "recorded" (others still running) or "finished".

local h = redis.call("HMGET", KEYS[1], "state", "attempt", "cancel_requested")
local state = h[1]
if not state then
  return {"ignored", "missing", 0, 0}
end
if tostring(h[2]) ~= ARGV[2] then
  return {"ignored", state, 0, 0}
end
if state == "SUCCEEDED" or state == "FAILED" or state == "CANCELLED" or state == "PENDING" then
  return {"ignored", state, 0, 0}
end
if redis.call("HSETNX", KEYS[1], "exit:" .. ARGV[3], ARGV[4]) == 0 then
  return {"ignored", state, 0, 0}
end
local exited = redis.call("HINCRBY", KEYS[1], "exited_nodes", 1)
local failed = tonumber(redis.call("HGET", KEYS[1], "failed_nodes") or "0")
if ARGV[4] ~= "0" then
  failed = redis.call("HINCRBY", KEYS[1], "failed_nodes", 1)
end
if exited < tonumber(ARGV[5]) then
  return {"recorded", state, exited, failed}
end
local final = "SUCCEEDED"
if h[3] == "1" then
  final = "CANCELLED"
elseif failed > 0 then
  final = "FAILED"
end
redis.call("HSET", KEYS[1], "state", final, "updated_at", ARGV[6], "finished_at", ARGV[6])
redis.call("RPUSH", KEYS[2], cjson.encode({state = final, at = tonumber(ARGV[6]), reason = ARGV[7]}))
for i = 3, #KEYS do
  if redis.call("HGET", KEYS[i], "owner") == ARGV[1] then
    redis.call("HSET", KEYS[i], "owner", "")
  end
end
return {"finished", final, exited, failed}
