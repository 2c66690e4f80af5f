-- finish_from_earlier_attempt: a late exit 0 of the attempt a requeue ended (its node was cut
-- off, declared dead, and its copy ran on to the end): count it, and once every node of that
-- attempt has ended with 0 the job has its result — it ends succeeded and the attempt that
-- replaced it is stopped, so a job that ran is never run again.
--
-- Guarantees (atomic, one script), only while the job may still end succeeded (every state but a
-- terminal one: job_states.ALLOWED), is at the attempt right
-- after the event's (`prev_attempt` + 1, as requeue_job recorded) and the event carries that
-- attempt's fence and comes from one of its nodes (anything else changes nothing: an attempt
-- two steps back, a wrong fence, a redelivered event):
--   * the node's exit 0 is recorded once (`prev_exit:<node>`);
--   * when every node of that attempt has one, and the current attempt is still as the caller
--     read it (same state and fence; else "retry", nothing written):
--       - pending: it leaves the queue;
--       - reserved (no launch sent; left by a scheduler of the two-step path of earlier
--         versions): its GPUs and port are released;
--       - launching or running: a cancel goes onto each of its nodes' launch streams; its port
--         is released, and its GPUs where its node already reported an exit — the others stay
--         held under its fence until their exit comes (the scheduler then frees them as stale),
--         so nothing new starts on a GPU whose process has not ended (lib/release_gpus);
--     and the job ends succeeded with one history entry naming the attempt that succeeded; the stopped
--     attempt, if it held GPUs, is charged to its user up to now (lib/usage_record).
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset  KEYS[4] ports hash of the current master node
-- KEYS[5 .. 4+2n]  the current attempt's n GPU hashes, each followed by its node's hash
-- KEYS[5+2n ..]    the launch stream of every node of the current attempt
-- ARGV[1] job id  ARGV[2] the event's attempt  ARGV[3] the event's fence  ARGV[4] the event's node
-- ARGV[5] now  ARGV[6] n  ARGV[7] the current state as read  ARGV[8] the current fence as read ("0": none)
-- ARGV[9] JSON array: the cancel message for each launch stream (signed)  ARGV[10] stream MAXLEN
-- ARGV[11 .. 10+n] the node of each GPU key, same order
-- Returns {status, state}: "ignored", "recorded" (other nodes of that attempt have not ended
-- with 0 yet), "retry" (the current attempt moved on since it was read) or "finished".

--#include check_types
--#include job_states
--#include release_gpus
--#include queue_users
--#include usage_record

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "list"}, {KEYS[4], "hash"})
check_queue_types(KEYS[3])
check_key_range(5, 4 + 2 * tonumber(ARGV[6]), 1, "hash")
check_key_range(5 + 2 * tonumber(ARGV[6]), #KEYS, 1, "stream")
check_usage_types(KEYS[1])

local h = redis.call("HMGET", KEYS[1], "state", "attempt", "prev_attempt", "prev_fence", "prev_nodes", "fence",
  "master_port")
local state = h[1]
if not state then
  return {"ignored", "missing"}
end
if not may_move(state, JOB_STATE.succeeded) or h[3] ~= ARGV[2] or h[4] ~= ARGV[3] or tonumber(h[2]) ~= tonumber(ARGV[2]) + 1 then
  return {"ignored", state}
end
local nodes = {}
local member = false
for node in string.gmatch(h[5] or "", "[^,]+") do
  nodes[#nodes + 1] = node
  if node == ARGV[4] then member = true end
end
if not member then
  return {"ignored", state}
end
if redis.call("HSETNX", KEYS[1], "prev_exit:" .. ARGV[4], "0") == 0 then
  return {"ignored", state}
end
for _, node in ipairs(nodes) do
  if redis.call("HGET", KEYS[1], "prev_exit:" .. node) ~= "0" then
    return {"recorded", state}
  end
end
-- Every node of that attempt ended with 0. The current attempt must be the one the caller built
-- the keys and cancels for; if not, undo the count so the caller's retry finds it to do.
if state ~= ARGV[7] or tostring(h[6] or "0") ~= ARGV[8] then
  redis.call("HDEL", KEYS[1], "prev_exit:" .. ARGV[4])
  return {"retry", state}
end

local n = tonumber(ARGV[6])
local dispatched = state == JOB_STATE.launching or state == JOB_STATE.running
if dispatched then
  local cancels = cjson.decode(ARGV[9])
  for i = 5 + 2 * n, #KEYS do
    redis.call("XADD", KEYS[i], "MAXLEN", "~", ARGV[10], "*", "data", cancels[i - 4 - 2 * n])
  end
end
if h[6] then
  for g = 1, n do
    local node = ARGV[10 + g]
    if not dispatched or redis.call("HEXISTS", KEYS[1], "exit:" .. node) == 1 then
      if release_gpu(KEYS[3 + 2 * g], ARGV[1], h[6]) then
        redis.call("HINCRBY", KEYS[4 + 2 * g], "rev", 1)
      end
    end
  end
  release_port(KEYS[4], h[7], ARGV[1])
end
queue_remove(KEYS[3], KEYS[1], ARGV[1])
if ACTIVE[state] then
  record_usage(KEYS[1], h[2], ARGV[5], 5, 3 + 2 * n, "stopped: attempt " .. ARGV[2] .. " succeeded late")
end
local reason = "attempt " .. ARGV[2] .. " succeeded late: every node of it (" .. h[5] .. ") exited with 0 after"
  .. " it had been requeued; attempt " .. h[2] .. " stopped"
set_state(KEYS[1], JOB_STATE.succeeded, "updated_at", ARGV[5], "finished_at", ARGV[5],
  "succeeded_attempt", ARGV[2])
redis.call("RPUSH", KEYS[2], cjson.encode({state = JOB_STATE.succeeded, at = tonumber(ARGV[5]), reason = reason}))
return {"finished", JOB_STATE.succeeded}
