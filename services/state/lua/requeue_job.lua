-- requeue_job: take a job off nodes that were lost (or could not launch it for a
-- reason of the host) and either queue it for another attempt or fail it.
--
-- Guarantees (atomic, one script), only if the job is still active (reserved,
-- launching or running) in the same attempt under the same fencing token (a
-- repeated or stale call changes nothing):
--   * a cancel for this attempt goes onto every node's launch stream: the
--     surviving nodes stop their processes, and a lost node's agent, should it
--     come back, stops its orphans before anything else;
--   * GPUs are released where nothing of this attempt can still run: on the
--     lost nodes and on nodes that already reported their exit. GPUs of nodes
--     still stopping stay held under the old fence until their agent reports
--     the exit (the scheduler then releases exactly those), so no new job is
--     put on a GPU whose old process has not ended (lib/release_gpus);
--   * the rendezvous port is released;
--   * below the attempt limit the job goes back to pending at its old queue
--     position with attempt + 1, its reservation fields cleared and (when the
--     caller re-planned for the remaining cluster) its new ranked plans;
--     at the limit it ends failed naming the lost node;
--   * a requeue records the attempt it ends (`prev_attempt`, `prev_fence`, `prev_nodes`, and a
--     `prev_exit:<node>` of 0 for each node that had already ended with 0, not told to stop), so
--     a late exit 0 of that attempt can still finish the job (finish_from_earlier_attempt);
--     what an earlier requeue recorded is replaced;
--   * one history entry says which;
--   * the attempt's GPUs are charged to its user up to now (lib/usage_record).
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset  KEYS[4] ports hash of the master node
-- KEYS[5 .. 4+2n]  the job's n GPU hashes, each followed by its node's hash (whose `rev` goes up
--                  when one of its GPUs is released)
-- KEYS[5+2n ..]    the launch stream of every node of the job
-- ARGV[1] job id  ARGV[2] attempt  ARGV[3] fence  ARGV[4] max attempts  ARGV[5] now
-- ARGV[6] n  ARGV[7] lost nodes, comma separated  ARGV[8] why (for history and the failure)
-- ARGV[9] JSON array: the cancel message for each launch stream, same order as those KEYS (each
--         signed with its node's key)  ARGV[10] stream MAXLEN  ARGV[11] new plans JSON ("" keeps the old ones)
-- ARGV[12 .. 11+n] the node of each GPU key, same order
-- ARGV[12+n] (optional) "1": HAS preempted the job — its `preemptions` count goes up with the
--            requeue (the caller does not count preemptions against the attempt limit)
-- ARGV[13+n] (optional) the attempt note (lib/attempt_record) plus: `cause` for an attempt no agent
--            reported a cause of (e.g. "node lost", of the first lost node), `fields` to set on the
--            job with the requeue (e.g. its out-of-memory threshold), and `exit`: the report of
--            the node whose exit ends the attempt (an out-of-memory exit: its GPUs are freed as a
--            lost node's, it counts as that node's exit)
-- Returns {1, new state, attempt} or {0, current state}

--#include check_types
--#include job_states
--#include release_gpus
--#include attempt_record
--#include queue_users
--#include usage_record

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "list"}, {KEYS[4], "hash"})
check_queue_types(KEYS[3])
check_key_range(5, 4 + 2 * tonumber(ARGV[6]), 1, "hash")
check_key_range(5 + 2 * tonumber(ARGV[6]), #KEYS, 1, "stream")
check_usage_types(KEYS[1])

local h = redis.call("HMGET", KEYS[1], "state", "attempt", "fence", "master_port", "seq")
local state = h[1]
if not ACTIVE[state] then
  return {0, tostring(state)}
end
if tostring(h[2]) ~= ARGV[2] or tostring(h[3]) ~= ARGV[3] then
  return {0, state}
end
local n = tonumber(ARGV[6])
local note = {}
if ARGV[13 + n] ~= nil and ARGV[13 + n] ~= "" then
  note = cjson.decode(ARGV[13 + n])
end
if note.exit ~= nil then
  note_exit(KEYS[1], ARGV[2], note, redis.call("HEXISTS", KEYS[1], "failed_node") == 0)
end
if type(note.fields) == "table" then
  for k, v in pairs(note.fields) do
    redis.call("HSET", KEYS[1], k, tostring(v))
  end
end
local lost = {}
for node in string.gmatch(ARGV[7], "[^,]+") do
  lost[node] = true
end
local cancels = cjson.decode(ARGV[9])
for i = 5 + 2 * n, #KEYS do
  redis.call("XADD", KEYS[i], "MAXLEN", "~", ARGV[10], "*", "data", cancels[i - 4 - 2 * n])
end
for g = 1, n do
  local node = ARGV[11 + g]
  local key = KEYS[3 + 2 * g]
  if lost[node] or redis.call("HEXISTS", KEYS[1], "exit:" .. node) == 1 then
    if release_gpu(key, ARGV[1], ARGV[3]) then
      redis.call("HINCRBY", KEYS[4 + 2 * g], "rev", 1)
    end
  end
end
release_port(KEYS[4], h[4], ARGV[1])

local attempt = tonumber(ARGV[2])
local now = tonumber(ARGV[5])
if attempt >= tonumber(ARGV[4]) then
  local first = string.match(ARGV[7], "[^,]+") or ""
  set_state(KEYS[1], JOB_STATE.failed, "updated_at", ARGV[5], "finished_at", ARGV[5],
    "failed_node", first, "failed_reason", ARGV[8])
  redis.call("RPUSH", KEYS[2], cjson.encode({state = JOB_STATE.failed, at = now,
    reason = ARGV[8] .. "; attempt " .. attempt .. " of " .. ARGV[4] .. ", no retries left"}))
  end_attempt(KEYS[1], ARGV[2], note, "failed: " .. ARGV[8], ARGV[5], note.cause, first)
  record_usage(KEYS[1], ARGV[2], ARGV[5], 5, 3 + 2 * n, "failed: " .. ARGV[8])
  return {1, JOB_STATE.failed, attempt}
end

-- What finish_from_earlier_attempt needs to recognise this attempt's late success.
local prev = {"prev_attempt", attempt, "prev_fence", ARGV[3]}
local nodes, seen = {}, {}
local clean = redis.call("HGET", KEYS[1], "cancel_requested") ~= "1"
  and redis.call("HGET", KEYS[1], "stop_requested") ~= "1"
for g = 1, n do
  local node = ARGV[11 + g]
  if not seen[node] then
    seen[node] = true
    nodes[#nodes + 1] = node
    if clean and redis.call("HGET", KEYS[1], "exit:" .. node) == "0" then
      prev[#prev + 1] = "prev_exit:" .. node
      prev[#prev + 1] = "0"
    end
  end
end
prev[#prev + 1] = "prev_nodes"
prev[#prev + 1] = table.concat(nodes, ",")

local drop = {"plan", "placement", "fence", "master_node", "master_addr", "master_port", "exited_nodes",
              "failed_nodes", "cancel_requested", "stop_requested", "failed_node", "failed_rank",
              "failed_exit_code"}
for _, f in ipairs(redis.call("HKEYS", KEYS[1])) do
  if string.sub(f, 1, 5) == "exit:" or string.sub(f, 1, 4) == "pid:" or string.sub(f, 1, 10) == "prev_exit:" then
    drop[#drop + 1] = f
  end
end
redis.call("HDEL", KEYS[1], unpack(drop))
if ARGV[12 + n] == "1" then
  redis.call("HINCRBY", KEYS[1], "preemptions", 1)
end
redis.call("HSET", KEYS[1], unpack(prev))
set_state(KEYS[1], JOB_STATE.pending, "attempt", attempt + 1, "updated_at", ARGV[5],
  "pending_reason", "requeued: " .. ARGV[8])
if ARGV[11] ~= "" then
  redis.call("HSET", KEYS[1], "plans", ARGV[11])
end
queue_add(KEYS[3], KEYS[1], h[5], ARGV[1])
end_attempt(KEYS[1], ARGV[2], note, "requeued: " .. ARGV[8], ARGV[5], note.cause,
  string.match(ARGV[7], "[^,]+") or "")
record_usage(KEYS[1], ARGV[2], ARGV[5], 5, 3 + 2 * n, "requeued: " .. ARGV[8])
redis.call("RPUSH", KEYS[2], cjson.encode({state = JOB_STATE.pending, at = now,
  reason = "requeued for attempt " .. (attempt + 1) .. " of " .. ARGV[4] .. ": " .. ARGV[8]}))
return {1, JOB_STATE.pending, attempt + 1}
