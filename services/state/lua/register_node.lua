-- register_node: register (or re-register) one node agent and all its GPUs, atomically.
--
-- Guarantees (one script, so the scheduler never sees half a node):
--   * the node hash, every GPU hash, the membership in the nodes set and the
--     alive lease are written together;
--   * an existing GPU hash keeps its `owner` and `fence` untouched: a restarting
--     agent must never free GPUs the scheduler reserved (new GPUs start with
--     owner "" and fence "0");
--   * an existing node keeps its `draining` flag (an operator's drain survives an
--     agent restart; a new node starts "0"); a `dead_at` mark from the scheduler
--     is cleared: the node is back;
--   * timestamps come from the Redis server clock (TIME), so heartbeat ages are
--     comparable across hosts whatever their clocks say;
--   * the node's `rev` goes up (the scheduler re-reads the node's GPUs).
-- Input is checked before anything is written; a malformed call writes nothing.
--
-- KEYS[1] node hash  KEYS[2] nodes set  KEYS[3] alive lease
-- KEYS[4 ..] one GPU hash per GPU, in the order of the GPU fields below
-- ARGV[1] node name  ARGV[2] addr  ARGV[3] gpu_types (comma list)  ARGV[4] agent_pid
-- ARGV[5] lease TTL in ms  ARGV[6] lease value (agent instance id)  ARGV[7] node health_reason
-- ARGV[8] the operator's price per GPU-hour of this node's GPUs ("": the catalog's list price;
--         the plans' dollars and the usage charged read it: docs/cost.md)
-- ARGV[8 ..] 13 fields per GPU: index, uuid, type, nvml_name, memory_total, memory_free, healthy,
--            health_reason, pci_bus_id, links (JSON), utilization, processes (JSON), type_from_memory
-- Returns the previous lease value (a live agent's instance id) or false.

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "set"}, {KEYS[3], "string"})
check_key_range(4, #KEYS, 1, "hash")

local head = 8
local per_gpu = 13
local names = {"index", "uuid", "type", "nvml_name", "memory_total", "memory_free", "healthy",
               "health_reason", "pci_bus_id", "links", "utilization", "processes", "type_from_memory"}
local n = #KEYS - 3
if n < 0 or #ARGV ~= head + n * per_gpu then
  return redis.error_reply("register_node: " .. n .. " GPU keys but " .. (#ARGV - head) .. " GPU fields")
end
local ttl = tonumber(ARGV[5])
if not ttl or ttl <= 0 then
  return redis.error_reply("register_node: bad lease TTL " .. tostring(ARGV[5]))
end
local price = tonumber(ARGV[8])
if ARGV[8] ~= "" and (not price or price < 0 or price > 1000000) then
  return redis.error_reply("register_node: bad price per GPU-hour " .. tostring(ARGV[8]))
end

local t = redis.call("TIME")
local now = t[1] .. "." .. string.format("%06d", tonumber(t[2]))

for g = 1, n do
  local a = head + (g - 1) * per_gpu
  local key = KEYS[3 + g]
  local fields = {"node", ARGV[1]}
  for i = 1, per_gpu do
    fields[#fields + 1] = names[i]
    fields[#fields + 1] = ARGV[a + i]
  end
  redis.call("HSET", key, unpack(fields))
  redis.call("HSETNX", key, "owner", "")
  redis.call("HSETNX", key, "fence", "0")
end

redis.call("HSET", KEYS[1],
  "name", ARGV[1], "addr", ARGV[2], "gpu_count", n, "gpu_types", ARGV[3],
  "registered_at", now, "heartbeat_at", now, "agent_pid", ARGV[4], "health_reason", ARGV[7])
redis.call("HSETNX", KEYS[1], "draining", "0")
if ARGV[8] == "" then
  redis.call("HDEL", KEYS[1], "price_per_gpu_hour")
else
  redis.call("HSET", KEYS[1], "price_per_gpu_hour", ARGV[8])
end
redis.call("HINCRBY", KEYS[1], "rev", 1)
redis.call("HDEL", KEYS[1], "dead_at")
redis.call("SADD", KEYS[2], ARGV[1])
local previous = redis.call("GET", KEYS[3])
redis.call("SET", KEYS[3], ARGV[6], "PX", ttl)
return previous
