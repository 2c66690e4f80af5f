-- set_draining: an operator's drain ("1") or undrain ("0") of one node.
--
-- Guarantees (one script): only an existing node is changed; a drain of a
-- node name that never registered writes nothing (no half node record).
-- Draining nodes are skipped by placement (HAS) and refused by place_jobs;
-- their running jobs go on. The flag survives agent restarts (register_node
-- keeps it).
--
-- KEYS[1] node hash  ARGV[1] "1" or "0"
-- Returns 1 when set, 0 when the node does not exist.

if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
redis.call("HSET", KEYS[1], "draining", ARGV[1])
return 1
