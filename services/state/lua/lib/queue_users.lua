-- lib/queue_users: the waiting queue and its count of waiting jobs per user, changed together.
--
-- Not a script of its own: frenzy.state.scripts inlines it at load. Every script that puts a
-- job in the queue or takes one out goes through these two functions, so the hash
-- `<queue key>:users` (user -> jobs of theirs in the queue; Keys.queue_users) always agrees with
-- the queue. That makes the per-user queued-jobs quota one HGET, exact on any number of
-- scheduler processes (submit_job.lua checks it in the same step as the write).
-- The hash's name is derived from the queue's key rather than passed in KEYS: it shares the
-- queue key's hash tag, so it lives in the same Redis Cluster slot. recount_queue_users.lua
-- rebuilds it (a leader does so when it takes over: data written before the hash existed).

-- Queue `job_id` (whose hash is `job_key`) at `score`; count it for its user if it was not queued.
local function queue_add(queue_key, job_key, score, job_id)
  if redis.call("ZADD", queue_key, score, job_id) == 1 then
    redis.call("HINCRBY", queue_key .. ":users", redis.call("HGET", job_key, "user") or "", 1)
  end
end

-- Take `job_id` out of the queue; uncount it for its user if it was there.
local function queue_remove(queue_key, job_key, job_id)
  if redis.call("ZREM", queue_key, job_id) == 1 then
    local counts, user = queue_key .. ":users", redis.call("HGET", job_key, "user") or ""
    if redis.call("HINCRBY", counts, user, -1) <= 0 then
      redis.call("HDEL", counts, user)
    end
  end
end

-- Fail before any write (lib/check_types, which the script includes first) when the queue or its
-- per-user counts have another type.
local function check_queue_types(queue_key)
  check_types({queue_key, "zset"}, {queue_key .. ":users", "hash"})
end
