-- record_exit: record that a job's process on one node ended; when the last
-- node has ended, finish the job and release its GPUs and rendezvous port.
--
-- Guarantees (atomic, one script): an exit is counted once per node and
-- attempt (a redelivered event changes nothing); events of an older attempt
-- are ignored; the first failure that was not caused by stopping the job
-- (a non-zero exit of a node not told to stop) is kept as the job's failure:
-- node, node rank and exit code. The final state (cancelled if a cancel was
-- requested, else succeeded if every node exited 0, else failed), the history
-- entry, the release of every GPU still owned by this job and of its port
-- happen together (lib/release_gpus), and so does the attempt's usage charge (lib/usage_record).
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] ports hash of the master node
-- KEYS[4 ..] the job's GPU hashes, each followed by its node's hash (whose `rev`
--            goes up when one of its GPUs is released)
-- ARGV[1] job id  ARGV[2] attempt  ARGV[3] node  ARGV[4] exit code
-- ARGV[5] number of nodes  ARGV[6] now  ARGV[7] reason text for the history
-- ARGV[8] node rank of ARGV[3]  ARGV[9] "1" when the node stopped because it was told to (cancel)
-- ARGV[10] (optional) the attempt note (lib/attempt_record): the plan's record and this node's
--          report (cause, last lines, observed peak), kept in the job's `attempt:<n>` field
-- Returns {status, state, exited_nodes, failed_nodes} where status is
--   "ignored" (stale or repeated), "recorded" (others still running) or "finished".

--#include check_types
--#include job_states
--#include release_gpus
--#include attempt_record
--#include usage_record

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "list"}, {KEYS[3], "hash"})
check_key_range(4, #KEYS, 1, "hash")
check_usage_types(KEYS[1])

-- The job's reason when a node's failure ends it: the node and what its agent recognised (the
-- attempt record's cause: "out of memory", "signal 9 (SIGKILL)"), and for a command that never
-- started (cause "launch failed: <why>") the agent's words instead of the exit code 127 it is
-- counted with.
local function failure_reason(node, rank, code, cause)
  local where = "node " .. node .. " (node rank " .. rank .. ")"
  cause = cause or ""
  if string.sub(cause, 1, 15) == "launch failed: " then
    return where .. " could not start the job: " .. string.sub(cause, 16)
  end
  local reason = where .. " failed with exit code " .. code
  if cause == "oom" then
    return reason .. ": out of memory"
  end
  if cause ~= "" and cause ~= "exit code " .. code and cause ~= "cancelled" then
    return reason .. ": " .. cause
  end
  return reason
end

local h = redis.call("HMGET", KEYS[1], "state", "attempt", "cancel_requested", "master_port")
local state = h[1]
if not state then
  return {"ignored", "missing", 0, 0}
end
if tostring(h[2]) ~= ARGV[2] then
  return {"ignored", state, 0, 0}
end
if TERMINAL[state] or state == JOB_STATE.pending then
  return {"ignored", state, 0, 0}
end
if redis.call("HSETNX", KEYS[1], "exit:" .. ARGV[3], ARGV[4]) == 0 then
  return {"ignored", state, 0, 0}
end
redis.call("HDEL", KEYS[1], "pid:" .. ARGV[3])
local exited = redis.call("HINCRBY", KEYS[1], "exited_nodes", 1)
local failed = tonumber(redis.call("HGET", KEYS[1], "failed_nodes") or "0")
local note = {}
if ARGV[10] ~= nil and ARGV[10] ~= "" then
  note = cjson.decode(ARGV[10])
end
local first_failure = false
if ARGV[4] ~= "0" then
  failed = redis.call("HINCRBY", KEYS[1], "failed_nodes", 1)
  if ARGV[9] ~= "1" and redis.call("HEXISTS", KEYS[1], "failed_node") == 0 then
    redis.call("HSET", KEYS[1], "failed_node", ARGV[3], "failed_rank", ARGV[8], "failed_exit_code", ARGV[4])
    first_failure = true
  end
end
note_exit(KEYS[1], ARGV[2], note, first_failure)
if exited < tonumber(ARGV[5]) then
  return {"recorded", state, exited, failed}
end
local final = JOB_STATE.succeeded
local reason = ARGV[7]
if h[3] == "1" then
  final = JOB_STATE.cancelled
elseif failed > 0 then
  final = JOB_STATE.failed
  local f = redis.call("HMGET", KEYS[1], "failed_node", "failed_rank", "failed_exit_code")
  if f[1] then
    reason = failure_reason(f[1], f[2], f[3], load_attempt(KEYS[1], ARGV[2], note).cause)
  end
end
set_state(KEYS[1], final, "updated_at", ARGV[6], "finished_at", ARGV[6])
end_attempt(KEYS[1], ARGV[2], note, string.lower(final), ARGV[6])
record_usage(KEYS[1], ARGV[2], ARGV[6], 4, #KEYS - 1, string.lower(final))
redis.call("RPUSH", KEYS[2], cjson.encode({state = final, at = tonumber(ARGV[6]), reason = reason}))
release_gpus(4, ARGV[1])
release_port(KEYS[3], h[4], ARGV[1])
return {"finished", final, exited, failed}
