-- mark_deadline_missed: flag jobs whose deadline HAS can no longer meet (issue 35).
--
-- Guarantees (atomic, one script): per job, once per attempt; the flag, the time and the
-- history note land together. A job that no longer exists or no longer waits is left alone
-- (it is not a state change: the job stays queued and runs late, flagged; docs/has-policy.md).
--
-- KEYS: for each job, its hash then its history  ARGV[1] now, then per job: attempt, history note JSON
-- Returns how many jobs were newly flagged.

--#include check_types
--#include job_states

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_key_range(1, #KEYS, 2, "hash")
check_key_range(2, #KEYS, 2, "list")

local flagged = 0
for i = 1, #KEYS, 2 do
  local job_key, history = KEYS[i], KEYS[i + 1]
  local attempt, note = ARGV[i + 1], ARGV[i + 2]
  local state, seen = unpack(redis.call("HMGET", job_key, "state", "deadline_missed_attempt"))
  if state == JOB_STATE.pending and redis.call("HGET", job_key, "attempt") == attempt and seen ~= attempt then
    redis.call("HSET", job_key, "deadline_missed_attempt", attempt, "deadline_missed_at", ARGV[1])
    redis.call("RPUSH", history, note)
    flagged = flagged + 1
  end
end
return flagged
