-- submit_job: create a pending job and queue it, idempotently.
--
-- Guarantees (atomic, one script):
--   * if the idempotency key already names a job, nothing is written and that
--     job's id is returned with duplicate=1 (a retried submission never makes
--     a second job);
--   * if ARGV[5] > 0 and the user (the "user" field among ARGV[6..]) already has that many
--     jobs in the queue, nothing is written and {"", 2, their count} is returned: the
--     queued-jobs quota, exact however many scheduler processes admit at once;
--   * otherwise the job hash, its first history entry, its place in the job
--     index and in the FIFO queue (and its user's count, lib/queue_users), and the
--     idempotency key are all written together, with a fresh sequence number from the
--     shared counter; and the leader's wake list gets its token (the placement loop, in
--     whichever process leads, runs a pass now: no round trip of the submitter's own for it).
--
-- KEYS[1] idempotency key ("" allowed: the caller then passes a dummy key and ARGV[4]="0")
-- KEYS[2] job hash        KEYS[3] job history list
-- KEYS[4] jobs zset       KEYS[5] queue zset        KEYS[6] sequence counter
-- KEYS[7] the leader's wake list (keys.wake: one token at most)
-- ARGV[1] job id  ARGV[2] now (float seconds)  ARGV[3] history entry JSON
-- ARGV[4] "1" when the idempotency key is in use
-- ARGV[5] the most jobs one user may have queued ("0": no limit)
-- ARGV[6..] field, value pairs for the job hash (StateStore.prepare_submission: user, name, spec,
--           plans, model_name, parameter_count, pending_reason, priority, max_attempts)
-- Returns {job_id, duplicate(0|1), seq}, or {"", 2, queued} when over the quota

--#include check_types
--#include job_states
--#include queue_users

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "string"}, {KEYS[2], "hash"}, {KEYS[3], "list"}, {KEYS[4], "zset"},
  {KEYS[6], "string"}, {KEYS[7], "list"})
check_queue_types(KEYS[5])

if ARGV[4] == "1" then
  local existing = redis.call("GET", KEYS[1])
  if existing then
    return {existing, 1, 0}
  end
end
if redis.call("EXISTS", KEYS[2]) == 1 then
  return redis.error_reply("job id already exists: " .. ARGV[1])
end
local fields, user = {}, ""
for i = 6, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  if ARGV[i] == "user" then
    user = ARGV[i + 1]
  end
end
local limit = tonumber(ARGV[5])
if limit > 0 then
  local queued = tonumber(redis.call("HGET", KEYS[5] .. ":users", user) or "0")
  if queued >= limit then
    return {"", 2, queued}
  end
end
local seq = redis.call("INCR", KEYS[6])
redis.call("HSET", KEYS[2], "id", ARGV[1], "state", JOB_STATE.pending, "seq", seq,
  "submitted_at", ARGV[2], "updated_at", ARGV[2], "attempt", 1, unpack(fields))
redis.call("RPUSH", KEYS[3], ARGV[3])
redis.call("ZADD", KEYS[4], ARGV[2], ARGV[1])
queue_add(KEYS[5], KEYS[2], seq, ARGV[1])
if ARGV[4] == "1" then
  redis.call("SET", KEYS[1], ARGV[1])
end
redis.call("LPUSH", KEYS[7], "1")
redis.call("LTRIM", KEYS[7], 0, 0)
return {ARGV[1], 0, seq}
