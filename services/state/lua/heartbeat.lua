-- heartbeat: renew one node's alive lease and report its GPUs' live state.
--
-- Guarantees (one script):
--   * if the node hash or any of its GPU hashes is missing (Redis lost its data,
--     or someone deleted the node) nothing is written and 0 is returned, so the
--     agent re-registers instead of resurrecting a partial node;
--   * otherwise the lease, heartbeat_at, the node's health and every GPU's
--     memory_free / healthy / health_reason / utilization / processes are
--     written together; `owner`, `fence`, `draining` and everything else the
--     scheduler owns are never touched. A `dead_at` mark is cleared: a node
--     that heartbeats is not dead (e.g. after a network partition healed); the
--     reply then says so (2), because the scheduler moved every job the node ran
--     when it declared it dead, and the agent must stop those copies;
--   * the node's `rev` goes up when a GPU's health or a free GPU's memory_free
--     changed (what the scheduler's view is built from), not on every beat.
-- heartbeat_at is the Redis server clock (TIME), like registered_at.
--
-- KEYS[1] node hash  KEYS[2] alive lease  KEYS[3 ..] one GPU hash per GPU
-- ARGV[1] lease TTL in ms  ARGV[2] lease value (agent instance id)  ARGV[3] node health_reason
-- ARGV[4 ..] 5 fields per GPU, in KEYS order: memory_free, healthy ("1"/"0"), health_reason,
--            utilization, processes (JSON)
-- Returns 1 (renewed), 2 (renewed, and the node had been declared dead: its jobs were moved)
-- or 0 (node unknown: register again).

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "string"})
check_key_range(3, #KEYS, 1, "hash")

local head = 3
local per_gpu = 5
local n = #KEYS - 2
if n < 0 or #ARGV ~= head + n * per_gpu then
  return redis.error_reply("heartbeat: " .. n .. " GPU keys but " .. (#ARGV - head) .. " GPU fields")
end
local ttl = tonumber(ARGV[1])
if not ttl or ttl <= 0 then
  return redis.error_reply("heartbeat: bad lease TTL " .. tostring(ARGV[1]))
end
for i = 1, #KEYS do
  if i ~= 2 and redis.call("EXISTS", KEYS[i]) == 0 then
    return 0
  end
end

local t = redis.call("TIME")
local now = t[1] .. "." .. string.format("%06d", tonumber(t[2]))
local changed = false
for g = 1, n do
  local a = head + (g - 1) * per_gpu
  local old = redis.call("HMGET", KEYS[2 + g], "memory_free", "healthy", "owner")
  -- The scheduler reads a busy GPU's memory only once it is released (which bumps rev then).
  if old[2] ~= ARGV[a + 2] or (old[3] == "" and old[1] ~= ARGV[a + 1]) then
    changed = true
  end
  redis.call("HSET", KEYS[2 + g], "memory_free", ARGV[a + 1], "healthy", ARGV[a + 2],
    "health_reason", ARGV[a + 3], "utilization", ARGV[a + 4], "processes", ARGV[a + 5])
end
redis.call("HSET", KEYS[1], "heartbeat_at", now, "health_reason", ARGV[3])
local was_dead = redis.call("HDEL", KEYS[1], "dead_at")
if changed then
  redis.call("HINCRBY", KEYS[1], "rev", 1)
end
redis.call("SET", KEYS[2], ARGV[2], "PX", ttl)
if was_dead == 1 then
  return 2
end
return 1
