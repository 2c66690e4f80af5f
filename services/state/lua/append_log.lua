-- append_log: add the next piece of one node's job log to the job's log stream, exactly once.
--
-- Guarantees (atomic, one script): a piece is appended only if it starts at or
-- after the offset already shipped for this node and attempt, and the stream
-- entry and the new offset are written together. So an agent that restarts
-- and re-reads the log file from an older offset (or retries after a timeout
-- whose write did land) never duplicates output; it learns the shipped offset
-- from the reply and skips ahead. The stream is capped (MAXLEN ~) and both
-- keys expire `retention` after the last output (0: never).
--
-- KEYS[1] job log stream  KEYS[2] job log offsets hash
-- ARGV[1] offsets field ("node/attempt")  ARGV[2] start offset  ARGV[3] end offset
-- ARGV[4] stream MAXLEN  ARGV[5] chunk JSON (messages.LogChunk)  ARGV[6] retention in ms
-- Returns the shipped offset after the call (ARGV[3] when appended).

local shipped = tonumber(redis.call("HGET", KEYS[2], ARGV[1]) or "0")
local start = tonumber(ARGV[2])
if start == nil or tonumber(ARGV[3]) == nil or tonumber(ARGV[3]) < start then
  return redis.error_reply("append_log: bad offsets " .. tostring(ARGV[2]) .. ".." .. tostring(ARGV[3]))
end
if start < shipped then
  return shipped
end
redis.call("XADD", KEYS[1], "MAXLEN", "~", ARGV[4], "*", "data", ARGV[5])
redis.call("HSET", KEYS[2], ARGV[1], ARGV[3])
local retention = tonumber(ARGV[6]) or 0
if retention > 0 then
  redis.call("PEXPIRE", KEYS[1], retention)
  redis.call("PEXPIRE", KEYS[2], retention)
end
return tonumber(ARGV[3])
