-- recount_queue_users: rebuild the per-user count of queued jobs from the queue itself.
--
-- Guarantees (atomic, one script): afterwards `<queue>:users` holds, for every user with jobs
-- in the queue, exactly how many (lib/queue_users keeps it so from then on). Run by a scheduler
-- when it becomes the leader: it heals a hash written by hand, lost, or from before the hash
-- existed. O(queued jobs) inside Redis (about 1 ms per 1,000), once per leadership.
--
-- KEYS[1] queue zset  KEYS[2] its users hash (Keys.queue_users)
-- ARGV[1] the job hash key's prefix (the job's id is appended)
-- Returns the number of queued jobs counted.

local counts = {}
local ids = redis.call("ZRANGE", KEYS[1], 0, -1)
for _, job_id in ipairs(ids) do
  local user = redis.call("HGET", ARGV[1] .. job_id, "user") or ""
  counts[user] = (counts[user] or 0) + 1
end
redis.call("DEL", KEYS[2])
for user, n in pairs(counts) do
  redis.call("HSET", KEYS[2], user, n)
end
return #ids
