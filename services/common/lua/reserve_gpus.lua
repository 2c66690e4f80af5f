-- reserve_gpus: gang-reserve every GPU of a plan for one job, all or nothing.
--
-- Guarantees (atomic, one script): before writing anything it checks that
--   * the job exists and is PENDING (not cancelled meanwhile);
--   * every GPU hash exists, is healthy, has no owner, and reports at least
--     the plan's per-GPU bytes free;
--   * every node of the placement holds a live heartbeat lease.
-- If any check fails nothing is written and the first failure is returned.
-- Otherwise it takes a new fencing token from the shared counter, writes it
-- and the owner onto every GPU, moves the job to RESERVED with its plan and
-- placement, removes it from the queue and appends the history entry.
-- No GPU can ever be held by two jobs: ownership is only taken here, under
-- the "owner is empty" check, inside one script.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset  KEYS[4] sequence counter
-- KEYS[5 .. 4+n]         the n GPU hashes
-- KEYS[5+n .. ]          the alive-lease key of each node in the placement
-- ARGV[1] job id  ARGV[2] n  ARGV[3] bytes needed per GPU  ARGV[4] now
-- ARGV[5] plan JSON  ARGV[6] placement JSON  ARGV[7] history entry JSON
-- Returns {1, fence} or {0, reason}

local n = tonumber(ARGV[2])
local need = tonumber(ARGV[3])
local state = redis.call("HGET", KEYS[1], "state")
if state ~= "PENDING" then
  return {0, "job is " .. tostring(state) .. ", not PENDING"}
end
for i = 5, 4 + n do
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
for i = 5 + n, #KEYS do
  if redis.call("EXISTS", KEYS[i]) == 0 then
    return {0, KEYS[i] .. " lease expired (node dead)"}
  end
end
local fence = redis.call("INCR", KEYS[4])
for i = 5, 4 + n do
  redis.call("HSET", KEYS[i], "owner", ARGV[1], "fence", fence)
end
redis.call("HSET", KEYS[1], "state", "RESERVED", "plan", ARGV[5], "placement", ARGV[6],
  "fence", fence, "pending_reason", "", "updated_at", ARGV[4])
redis.call("ZREM", KEYS[3], ARGV[1])
redis.call("RPUSH", KEYS[2], ARGV[7])
return {1, fence}
