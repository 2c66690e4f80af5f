-- transition_job: move a job from one of the states its caller names to a new state, if the job
-- state machine allows that move (job_states.ALLOWED), optionally releasing the GPUs and the
-- rendezvous port it owns.
--
-- Guarantees (atomic, one script): the state is checked and changed together
-- with the history entry, the extra fields, the queue membership and the
-- release. A GPU (or port) is released only when its owner is this job, so a
-- stale or repeated call can never free what another job holds (lib/release_gpus).
-- Every target but pending leaves the queue; pending re-enters it at its old
-- sequence. A release that ends an attempt holding GPUs (reserved: a cancel) charges it to its
-- user (lib/usage_record).
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset
-- KEYS[4] ports hash of the job's master node (any key when it has none)
-- KEYS[5 ..] GPU hashes to release, each followed by its node's hash (whose `rev`
--           goes up when one of its GPUs is released)
-- ARGV[1] job id  ARGV[2] the current states the caller moves the job from, comma separated
-- ARGV[3] new state  ARGV[4] now  ARGV[5] history entry JSON  ARGV[6] "1": release (GPUs and port)
-- ARGV[7 ..] extra field, value pairs for the job hash
-- Returns {1, old_state} or {0, current_state}

--#include check_types
--#include job_states
--#include release_gpus
--#include queue_users
--#include usage_record

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "list"}, {KEYS[4], "hash"})
check_queue_types(KEYS[3])
check_key_range(5, #KEYS, 1, "hash")
check_usage_types(KEYS[1])

local state = redis.call("HGET", KEYS[1], "state")
if not state then
  return {0, "missing"}
end
local allowed = false
for s in string.gmatch(ARGV[2], "[^,]+") do
  if s == state then allowed = true end
end
if not allowed or not may_move(state, ARGV[3]) then
  return {0, state}
end
local fields = {"updated_at", ARGV[4]}
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
set_state(KEYS[1], ARGV[3], unpack(fields))
redis.call("RPUSH", KEYS[2], ARGV[5])
if ARGV[3] == JOB_STATE.pending then
  queue_add(KEYS[3], KEYS[1], redis.call("HGET", KEYS[1], "seq"), ARGV[1])
else
  queue_remove(KEYS[3], KEYS[1], ARGV[1])
end
if ARGV[6] == "1" then
  if ACTIVE[state] then
    record_usage(KEYS[1], redis.call("HGET", KEYS[1], "attempt") or "1", ARGV[4], 5, #KEYS - 1,
      string.lower(ARGV[3]))
  end
  release_gpus(5, ARGV[1])
  release_port(KEYS[4], redis.call("HGET", KEYS[1], "master_port"), ARGV[1])
end
return {1, state}
