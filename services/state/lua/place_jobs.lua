-- place_jobs: reserve a batch of jobs and publish their launches, in one call.
--
-- Guarantees (atomic, one script; each job all or nothing, jobs independent):
-- for each job in order, before writing anything for it, it checks that
--   * the job is pending and still at the attempt its launches were signed for
--     (a cancel or a requeue meanwhile makes it a conflict, never a launch of
--     an old attempt);
--   * every GPU hash exists, is healthy, has no owner, and reports at least
--     the plan's per-GPU bytes free;
--   * every node holds a live heartbeat lease and is not draining;
--   * the rendezvous port chosen for it is free on its master node;
--   * the fencing token is above every token handed out before the scheduler
--     took its block (it came from INCRBY on the shared counter);
--   * the caller still holds the leader lease it names (acquire_lease.lua):
--     a scheduler that paused past its lease while a standby took over places
--     nothing (every job of the batch fails with that reason).
-- Every key of the job has the type its writes expect (lib/check_types; a key of the batch's own,
-- the queue, the counter or the lease, fails the whole call before any write).
-- If a check fails nothing is written for that job and its reason is
-- returned; the jobs after it are still tried, seeing what the ones before
-- wrote (two jobs of a batch can never take the same GPU or port).
-- Otherwise it writes owner and fence onto every GPU, takes the port, bumps
-- each node's `rev`, moves the job to launching with its plan, placement,
-- fence and rendezvous, removes it from the queue, appends the reserved and
-- launching history entries and adds one launch message per node to the
-- node's stream. The messages are signed by the scheduler with the nodes'
-- keys before the call (Redis cannot sign): which is why the fence and the
-- port are chosen outside and only checked here. A job is never left
-- reserved without its launches, and a crash cannot publish half a batch's job.
--
-- KEYS[1] queue zset  KEYS[2] sequence counter  KEYS[3] leader lease, then per job, in order:
--   job hash, job history, ports hash of its master node (its first node),
--   its n GPU hashes, its m nodes' alive-lease keys, their node hashes,
--   their launch streams
-- ARGV[1] now  ARGV[2] stream MAXLEN  ARGV[3] number of jobs  ARGV[4] the caller's
--   lease value ("" when it runs without one: a lone scheduler, tests), then per job:
--   job id, attempt, fence, n, m, bytes needed per GPU, port, master node,
--   master address, expected end ("" when unknown), plan JSON, placement
--   JSON, reserved history entry, launching history entry, then the m
--   launch messages (same order as the streams)
-- Returns a flat list, two entries per job: 1, "" (placed) or 0, reason.

--#include check_types
--#include job_states
--#include queue_users

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[2], "string"}, {KEYS[3], "string"})
check_queue_types(KEYS[1])

local now = ARGV[1]
local maxlen = ARGV[2]
local jobs = tonumber(ARGV[3])
local seq = tonumber(redis.call("GET", KEYS[2]) or "0")
local out = {}
local k = 4  -- KEYS consumed so far
local a = 5  -- next ARGV

if ARGV[4] ~= "" and redis.call("GET", KEYS[3]) ~= ARGV[4] then
  for _ = 1, jobs do
    out[#out + 1] = 0
    out[#out + 1] = "not the leader: this scheduler's lease " .. ARGV[4] .. " has expired or passed to another"
  end
  return out
end

-- The first key of the job's that has another type than its writes expect (lib/check_types): the
-- job is not placed, with that reason, and nothing of it is written.
local function mistyped(job_key, history, ports_key, gpus, alive, nodes, streams)
  local why = wrong_type(job_key, "hash") or wrong_type(history, "list") or wrong_type(ports_key, "hash")
  if why then return why end
  local groups = {gpus, alive, nodes, streams}
  local types = {"hash", "string", "hash", "stream"}
  for g, group in ipairs(groups) do
    for _, key in ipairs(group) do
      why = wrong_type(key, types[g])
      if why then return why end
    end
  end
  return nil
end

local function check(job_key, ports_key, gpus, alive, nodes, attempt, fence, need, port, master)
  local h = redis.call("HMGET", job_key, "state", "attempt")
  if h[1] ~= JOB_STATE.pending then
    return "job is " .. tostring(h[1]) .. ", not " .. JOB_STATE.pending
  end
  if (h[2] or "1") ~= attempt then
    return "job is at attempt " .. tostring(h[2]) .. ", the launch was for attempt " .. attempt
  end
  if fence > seq then
    return "fence " .. fence .. " was never handed out (counter at " .. seq .. ")"
  end
  for _, gpu in ipairs(gpus) do
    local g = redis.call("HMGET", gpu, "owner", "healthy", "memory_free")
    if g[1] == false and g[2] == false then
      return gpu .. " does not exist"
    end
    if g[1] and g[1] ~= "" then
      return gpu .. " is held by " .. g[1]
    end
    if g[2] == "0" then
      return gpu .. " is unhealthy"
    end
    if tonumber(g[3] or "0") < need then
      return gpu .. " has " .. tostring(g[3]) .. " bytes free, needs " .. need
    end
  end
  for i, lease in ipairs(alive) do
    if redis.call("EXISTS", lease) == 0 then
      return lease .. " lease expired (node dead)"
    end
    if redis.call("HGET", nodes[i], "draining") == "1" then
      return nodes[i] .. " is draining"
    end
  end
  if redis.call("HEXISTS", ports_key, port) == 1 then
    return "port taken: rendezvous port " .. port .. " on " .. master .. " is in use"
  end
  return nil
end

for _ = 1, jobs do
  local job_id, attempt, fence = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local n, m = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local need, port, master, addr, est_end = tonumber(ARGV[a + 5]), ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9]
  local job_key, history, ports_key = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local gpus, alive, nodes, streams = {}, {}, {}, {}
  for i = 1, n do gpus[i] = KEYS[k + 2 + i] end
  for i = 1, m do
    alive[i] = KEYS[k + 2 + n + i]
    nodes[i] = KEYS[k + 2 + n + m + i]
    streams[i] = KEYS[k + 2 + n + 2 * m + i]
  end
  local why = mistyped(job_key, history, ports_key, gpus, alive, nodes, streams)
    or check(job_key, ports_key, gpus, alive, nodes, attempt, fence, need, port, master)
  if why then
    out[#out + 1] = 0
    out[#out + 1] = why
  else
    for _, gpu in ipairs(gpus) do
      redis.call("HSET", gpu, "owner", job_id, "fence", fence)
    end
    for _, node in ipairs(nodes) do
      redis.call("HINCRBY", node, "rev", 1)
    end
    redis.call("HSET", ports_key, port, job_id)
    set_state(job_key, JOB_STATE.launching, "plan", ARGV[a + 10], "placement", ARGV[a + 11],
      "fence", fence, "pending_reason", "", "updated_at", now, "reserved_at", now,
      "master_node", master, "master_addr", addr, "master_port", port)
    if est_end ~= "" then
      redis.call("HSET", job_key, "est_end", est_end)
    end
    queue_remove(KEYS[1], job_key, job_id)
    redis.call("RPUSH", history, ARGV[a + 12], ARGV[a + 13])
    for i, stream in ipairs(streams) do
      redis.call("XADD", stream, "MAXLEN", "~", maxlen, "*", "data", ARGV[a + 13 + i])
    end
    out[#out + 1] = 1
    out[#out + 1] = ""
  end
  k = k + 3 + n + 3 * m
  a = a + 14 + m
end
return out
