-- append_log: add the next piece of one node's job log to that node's log stream of the job,
-- exactly once, within the stream's byte cap.
--
-- The keys are the node's own (node:{node}:logs:{job} and its :offsets, frenzy.state.keys): an
-- agent's ACL reaches its node's keys only, so it can neither write another node's output nor
-- move another node's shipped offset (issue 34). A check in here could not give that: Redis checks
-- every command a script runs against the caller's ACL, so whoever may run this XADD may run it
-- without the script. Readers merge the streams of the nodes the job was placed on by entry id.
--
-- Guarantees (atomic, one script): a piece is appended only if it starts at or
-- after the offset already shipped for this node and attempt, and the stream
-- entry and the new offset are written together. So an agent that restarts
-- and re-reads the log file from an older offset (or retries after a timeout
-- whose write did land) never duplicates output; it learns the shipped offset
-- from the reply and skips ahead. A piece may start after the shipped offset
-- (the agent skipped output its node's file cap dropped; it ships a note in its
-- place). Both keys expire `retention` after the last output (0: never).
--
-- The cap (issue 34 item 6): with ARGV[7] > 0 the stream holds at most that many bytes of
-- entries besides the newest one (each counted as its chunk's JSON plus ENTRY_OVERHEAD for the
-- stream's and this bookkeeping's own memory) and at most ARGV[4] entries: the oldest entries
-- go first, so the stream keeps the node's newest output. The cap is per node: a job keeps up
-- to the cap of output from each node it ran on. Only XADD trims (its exact
-- MINID), with the hash commands an agent's ACL already allows (frenzy.state.acl): no XRANGE,
-- XDEL or XTRIM for agents. The bookkeeping lives in the offsets hash beside the per-attempt
-- offsets, under names no "node/attempt" field can take (a node name has no ':'):
--   ":bytes"     bytes the stream's entries hold, as counted above
--   ":dropped"   bytes of entries trimmed for the cap, in all
--   ":head", ":tail", ":r:<n>" (head <= n < tail)   the entries in order: "<id> <bytes>"
--   ":last"      the newest entry's id
--   ":cap"       the cap (ARGV[7]); ":disk_cap" the agent's cap on a node's log file (ARGV[8])
-- so StreamLogs tells its readers the caps, and what was dropped shows as each node's first
-- offset (> 0). Without a cap (ARGV[7] 0 or absent) the stream is capped at ARGV[4] entries
-- only (MAXLEN ~), as before.
--
-- KEYS[1] the node's log stream of the job  KEYS[2] its offsets hash
-- ARGV[1] offsets field ("node/attempt")  ARGV[2] start offset  ARGV[3] end offset
-- ARGV[4] stream MAXLEN  ARGV[5] chunk JSON (messages.LogChunk)  ARGV[6] retention in ms
-- ARGV[7] byte cap of the stream (0: none)  ARGV[8] the node's file cap, for readers (0: none)
-- Returns the shipped offset after the call (ARGV[3] when appended).

--#include check_types

-- Every key this script may write has its type, or nothing is written (lib/check_types).
check_types({KEYS[1], "stream"}, {KEYS[2], "hash"})

local ENTRY_OVERHEAD = 128
local shipped = tonumber(redis.call("HGET", KEYS[2], ARGV[1]) or "0")
local start = tonumber(ARGV[2])
if start == nil or tonumber(ARGV[3]) == nil or tonumber(ARGV[3]) < start then
  return redis.error_reply("append_log: bad offsets " .. tostring(ARGV[2]) .. ".." .. tostring(ARGV[3]))
end
if start < shipped then
  return shipped
end
local cap = tonumber(ARGV[7] or "0") or 0
if cap <= 0 then
  redis.call("XADD", KEYS[1], "MAXLEN", "~", ARGV[4], "*", "data", ARGV[5])
else
  local maxlen = tonumber(ARGV[4]) or 10000
  local size = #ARGV[5] + ENTRY_OVERHEAD
  local book = redis.call("HMGET", KEYS[2], ":bytes", ":head", ":tail", ":last")
  local stored = tonumber(book[1] or "0") or 0
  local head = tonumber(book[2] or "0") or 0
  local tail = tonumber(book[3] or "0") or 0
  local dropped = 0
  -- the oldest entries leave until the others fit beside the new one
  while head < tail and (stored + size > cap or tail - head + 1 > maxlen) do
    local entry = redis.call("HGET", KEYS[2], ":r:" .. head)
    redis.call("HDEL", KEYS[2], ":r:" .. head)
    head = head + 1
    local bytes = tonumber(entry and string.match(entry, " (%d+)$") or "0") or 0
    stored = stored - bytes
    dropped = dropped + bytes
  end
  if stored < 0 or head >= tail then
    stored = 0
  end
  -- every entry older than the first one kept goes (entries from before the cap too)
  local minid
  if head < tail then
    minid = string.match(redis.call("HGET", KEYS[2], ":r:" .. head) or "", "^(%S+)") or "0-0"
  elseif book[4] then
    local ms, seq = string.match(book[4], "^(%d+)-(%d+)$")
    minid = ms and (ms .. "-" .. (tonumber(seq) + 1)) or "0-0"
  else
    minid = "0-0"
  end
  local id = redis.call("XADD", KEYS[1], "MINID", "=", minid, "*", "data", ARGV[5])
  redis.call("HSET", KEYS[2], ":r:" .. tail, id .. " " .. size, ":bytes", stored + size, ":head", head,
    ":tail", tail + 1, ":last", id, ":cap", cap, ":disk_cap", tonumber(ARGV[8] or "0") or 0)
  if dropped > 0 then
    redis.call("HINCRBY", KEYS[2], ":dropped", dropped)
  end
end
redis.call("HSET", KEYS[2], ARGV[1], ARGV[3])
local retention = tonumber(ARGV[6]) or 0
if retention > 0 then
  redis.call("PEXPIRE", KEYS[1], retention)
  redis.call("PEXPIRE", KEYS[2], retention)
end
return tonumber(ARGV[3])
