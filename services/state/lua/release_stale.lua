-- release_stale: free the GPUs an ended process of an older reservation still holds.
--
-- When a job is requeued (a node lost) or failed while some of its nodes were
-- still stopping, their GPUs stay held under the old fencing token until the
-- agent reports that the process ended. That report comes here.
--
-- Guarantees (atomic, one script): only GPUs whose owner is this job AND whose
-- fence is the ended reservation's are released, and only if that reservation
-- is no longer the job's live one (the job moved on to another fence, or
-- ended). A newer reservation of the same job (a new fence) is never touched.
--
-- KEYS[1] job hash  KEYS[2] that node's hash (its `rev` goes up when a GPU is released)
-- KEYS[3 ..] the GPU hashes of the node that reported
-- ARGV[1] job id  ARGV[2] the ended reservation's fence
-- Returns the number of GPUs released.

--#include check_types
--#include job_states
--#include release_gpus

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "hash"})
check_key_range(3, #KEYS, 1, "hash")

local h = redis.call("HMGET", KEYS[1], "state", "fence")
if ACTIVE[h[1]] and tostring(h[2]) == ARGV[2] then
  return 0
end
local released = 0
for i = 3, #KEYS do
  if release_gpu(KEYS[i], ARGV[1], ARGV[2]) then
    released = released + 1
  end
end
if released > 0 then
  redis.call("HINCRBY", KEYS[2], "rev", 1)
end
return released
