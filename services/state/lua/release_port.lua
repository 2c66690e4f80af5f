-- release_port: free one rendezvous port entry if it still names the given job.
--
-- Guarantees (one script: check and delete together): a port the scheduler's
-- leak sweep found held by a finished job is freed, but never one that was
-- meanwhile handed to another job.
--
-- KEYS[1] ports hash of a node  ARGV[1] port  ARGV[2] job id
-- Returns 1 when freed, 0 otherwise.

if redis.call("HGET", KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call("HDEL", KEYS[1], ARGV[1])
end
return 0
