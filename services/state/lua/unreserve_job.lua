-- unreserve_job: roll a reservation that was never dispatched back into the queue.
--
-- A scheduler stopped between reserve_gpus and dispatch_job leaves its job reserved,
-- holding GPUs and a rendezvous port, with no launch sent (dispatch_job writes the
-- launches and leaves reserved in one step, so reserved means no agent was told).
-- The next scheduler (on start) or the reaper (after a timeout) calls this.
--
-- Guarantees (atomic, one script), only if the job is still reserved under the same
-- fencing token (a dispatch, cancel or newer reservation in between makes this a no-op):
--   * every GPU still held by this job under that fence is released (lib/release_gpus),
--     and its node's `rev` goes up; the rendezvous port is released;
--   * the job goes back to pending at its old queue position, the same attempt (it never
--     ran: nothing is counted against its attempt limit), its reservation fields cleared;
--   * one history entry says why.
-- A late dispatch_job of the stopped scheduler then finds the job pending and sends
-- nothing: a job is never launched twice for one reservation.
--
-- KEYS[1] job hash  KEYS[2] job history  KEYS[3] queue zset  KEYS[4] ports hash of the master node
-- KEYS[5 ..] the job's GPU hashes, each followed by its node's hash
-- ARGV[1] job id  ARGV[2] fence  ARGV[3] now  ARGV[4] why (history and pending reason)
-- Returns {1, "pending"} or {0, current state}

--#include job_states
--#include release_gpus
--#include queue_users

local h = redis.call("HMGET", KEYS[1], "state", "fence", "master_port", "seq")
if h[1] ~= JOB_STATE.reserved or tostring(h[2]) ~= ARGV[2] then
  return {0, tostring(h[1])}
end
for i = 5, #KEYS, 2 do
  if release_gpu(KEYS[i], ARGV[1], ARGV[2]) then
    redis.call("HINCRBY", KEYS[i + 1], "rev", 1)
  end
end
release_port(KEYS[4], h[3], ARGV[1])
redis.call("HDEL", KEYS[1], "plan", "placement", "fence", "master_node", "master_addr", "master_port", "est_end")
set_state(KEYS[1], JOB_STATE.pending, "updated_at", ARGV[3], "pending_reason", ARGV[4])
queue_add(KEYS[3], KEYS[1], h[4], ARGV[1])
redis.call("RPUSH", KEYS[2], cjson.encode({state = JOB_STATE.pending, at = tonumber(ARGV[3]), reason = ARGV[4]}))
return {1, JOB_STATE.pending}
