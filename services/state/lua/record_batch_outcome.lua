-- record_batch_outcome: write one batch entry's outcome, never losing a success.
--
-- Guarantees (atomic, one script):
--   * a success already recorded for this entry ("submitted" / "duplicate")
--     is never overwritten by a later non-success (a redelivered task that
--     then meets an unreachable scheduler must not hide the job it made);
--   * the batch id is indexed in the batches zset (NX: the first time wins);
--   * the batch hash expires ARGV[6] seconds after this write, and ids older
--     than that leave the batches zset, so no batch record stays forever.
--
-- KEYS[1] batch hash   KEYS[2] batches zset
-- ARGV[1] entry index (hash field)   ARGV[2] outcome JSON
-- ARGV[3] "1" when the new outcome is a success   ARGV[4] now (float seconds)   ARGV[5] batch id
-- ARGV[6] time to live of the batch's records, seconds
-- Returns 1 when written, 0 when a recorded success was kept.

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "hash"}, {KEYS[2], "zset"})

if ARGV[3] ~= "1" then
  local current = redis.call("HGET", KEYS[1], ARGV[1])
  if current then
    local ok, decoded = pcall(cjson.decode, current)
    if ok and type(decoded) == "table" and (decoded["status"] == "submitted" or decoded["status"] == "duplicate") then
      return 0
    end
  end
end
local ttl = tonumber(ARGV[6])
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("EXPIRE", KEYS[1], ttl)
redis.call("ZADD", KEYS[2], "NX", ARGV[4], ARGV[5])
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", "(" .. (tonumber(ARGV[4]) - ttl))
return 1
