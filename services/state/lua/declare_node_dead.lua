-- declare_node_dead: mark a node dead, unless it came back meanwhile.
--
-- Guarantees (atomic, one script): the mark is written only if the node's
-- heartbeat lease is still gone and its last heartbeat is still the one the
-- scheduler judged too old; an agent that re-registered or heartbeated in
-- between keeps its node alive (and register/heartbeat clear the mark).
--
-- Fenced: a caller naming a leader lease value that is no longer the lease's
-- (it paused past its lease, a standby took over) changes nothing.
--
-- KEYS[1] node hash  KEYS[2] alive lease  KEYS[3] leader lease
-- ARGV[1] the heartbeat_at the decision was based on  ARGV[2] now (Redis time, seconds)
-- ARGV[3] the caller's lease value ("" without one)
-- Returns 1 when the node is (now, or already) marked dead, 0 when it is alive again,
-- -1 when the caller is not the leader.

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "string"}, {KEYS[3], "string"})

if ARGV[3] ~= "" and redis.call("GET", KEYS[3]) ~= ARGV[3] then
  return -1
end

if redis.call("EXISTS", KEYS[2]) == 1 then
  return 0
end
local hb = redis.call("HGET", KEYS[1], "heartbeat_at")
if hb ~= ARGV[1] then
  return 0
end
if redis.call("HEXISTS", KEYS[1], "dead_at") == 0 then
  redis.call("HSET", KEYS[1], "dead_at", ARGV[2])
end
return 1
