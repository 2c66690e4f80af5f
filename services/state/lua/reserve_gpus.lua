-- reserve_gpus: gang-reserve every GPU of a plan for one job, all or nothing,
-- and give the job a rendezvous (master) port on its first node.
--
-- Guarantees (atomic, one script): before writing anything it checks that
--   * the job exists and is pending (not cancelled meanwhile);
--   * every GPU hash exists, is healthy, has no owner, and reports at least
--     the plan's per-GPU bytes free;
--   * every node of the placement holds a live heartbeat lease and is not
--     draining (an operator's drain that raced with this placement wins);
--   * the master node has a free port in the configured range.
-- If any check fails nothing is written and the first failure is returned.
-- Otherwise it takes a new fencing token from the shared counter, writes it
-- and the owner onto every GPU, takes the port (ports hash: port -> job id),
-- moves the job to reserved with its plan, placement and rendezvous, removes
-- it from the queue, appends the history entry and bumps each node's `rev`.
-- No GPU can ever be held by two jobs: ownership is only taken here, under
-- the "owner is empty" check, inside one script. The same holds for ports:
-- two live jobs never share a master port on one node.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset  KEYS[4] sequence counter
-- KEYS[5] ports hash of the master node (the placement's first node)
-- KEYS[6 .. 5+n]         the n GPU hashes
-- KEYS[6+n .. 5+n+m]     the alive-lease key of each of the m nodes in the placement
-- KEYS[6+n+m .. ]        the node hash of each node, same order
-- ARGV[1] job id  ARGV[2] n  ARGV[3] bytes needed per GPU  ARGV[4] now
-- ARGV[5] plan JSON  ARGV[6] placement JSON  ARGV[7] history entry JSON
-- ARGV[8] first port of the range  ARGV[9] number of ports  ARGV[10] preferred offset in the range
-- ARGV[11] master node name  ARGV[12] master node address
-- Returns {1, fence, port} or {0, reason}

--#include job_states
--#include queue_users

local n = tonumber(ARGV[2])
local need = tonumber(ARGV[3])
local m = (#KEYS - 5 - n) / 2
local state = redis.call("HGET", KEYS[1], "state")
if state ~= JOB_STATE.pending then
  return {0, "job is " .. tostring(state) .. ", not " .. JOB_STATE.pending}
end
for i = 6, 5 + n do
  local g = redis.call("HMGET", KEYS[i], "owner", "healthy", "memory_free")
  if g[1] == false and g[2] == false then
    return {0, KEYS[i] .. " does not exist"}
  end
  if g[1] and g[1] ~= "" then
    return {0, KEYS[i] .. " is held by " .. g[1]}
  end
  if g[2] == "0" then
    return {0, KEYS[i] .. " is unhealthy"}
  end
  if tonumber(g[3] or "0") < need then
    return {0, KEYS[i] .. " has " .. tostring(g[3]) .. " bytes free, needs " .. ARGV[3]}
  end
end
for i = 6 + n, 5 + n + m do
  if redis.call("EXISTS", KEYS[i]) == 0 then
    return {0, KEYS[i] .. " lease expired (node dead)"}
  end
  if redis.call("HGET", KEYS[i + m], "draining") == "1" then
    return {0, KEYS[i + m] .. " is draining"}
  end
end
local base = tonumber(ARGV[8])
local span = tonumber(ARGV[9])
local port = nil
for k = 0, span - 1 do
  local candidate = base + (tonumber(ARGV[10]) + k) % span
  if redis.call("HEXISTS", KEYS[5], candidate) == 0 then
    port = candidate
    break
  end
end
if port == nil then
  return {0, "no free rendezvous port on " .. ARGV[11] .. ": all " .. span .. " ports from " .. base .. " are in use"}
end
local fence = redis.call("INCR", KEYS[4])
for i = 6, 5 + n do
  redis.call("HSET", KEYS[i], "owner", ARGV[1], "fence", fence)
end
for i = 6 + n + m, 5 + n + 2 * m do
  redis.call("HINCRBY", KEYS[i], "rev", 1)
end
redis.call("HSET", KEYS[5], port, ARGV[1])
set_state(KEYS[1], JOB_STATE.reserved, "plan", ARGV[5], "placement", ARGV[6],
  "fence", fence, "pending_reason", "", "updated_at", ARGV[4], "reserved_at", ARGV[4],
  "master_node", ARGV[11], "master_addr", ARGV[12], "master_port", port)
queue_remove(KEYS[3], KEYS[1], ARGV[1])
redis.call("RPUSH", KEYS[2], ARGV[7])
return {1, fence, port}
