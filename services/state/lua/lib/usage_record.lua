-- lib/usage_record: charge an attempt's GPUs to its user when the attempt ends (issue 35).
--
-- Not a script of its own: frenzy.state.scripts inlines it at load into every script that ends an
-- attempt holding GPUs (record_exit, requeue_job, finish_from_earlier_attempt, transition_job), so
-- the charge is written in the same atomic step as the end. What it writes (frenzy.state.usage
-- reads it; keys.py names the keys, derived here from the job hash's key as lib/queue_users does):
--   {p}:usage                stream, one entry per GPU type of the attempt: job, user, attempt, name,
--                            gpu_type, gpus, price (dollars per GPU-hour used), start (the reservation),
--                            end, gpu_hours, cost_usd, outcome; entries older than USAGE_RETENTION_S
--                            are trimmed (XADD MINID), so it outlives the job's own record
--   {p}:usage:totals         hash, running totals for Prometheus: "h|{user}|{type}" GPU-hours,
--                            "usd|{user}|{type}" dollars (they only go up)
--   {p}:usage:user:{user}    hash, "{day}|h" and "{day}|usd" per UTC day (days since 1970) of the
--                            attempt's end: what budgets read (expires USAGE_RETENTION_S after the
--                            user's last charge)
-- Guarantees: an attempt is charged at most once (the job's `usage:<attempt>` field marks it), only
-- from its reservation (`reserved_at`) to `now`; each GPU at its node's `price_per_gpu_hour` when the
-- node hash carries one (an operator's rate, 0: free), else at the catalog's list price
-- (USAGE_PRICES, rendered from marp.prices at load; 0 for a type without one). The price used is
-- stored with the entry, so a later price change never rewrites what was charged.

--#include usage_prices

-- A number as text with every digit a double holds (Lua's tostring keeps 14).
local function num(x)
  return string.format("%.17g", x)
end

local function usage_prefix(job_key)
  return string.match(job_key, "^(.*):job:[^:]+$")
end

-- Fail before any write (lib/check_types, which the script includes first) when a usage key
-- record_usage may write for the job at `job_key` has another type.
local function check_usage_types(job_key)
  local prefix = usage_prefix(job_key)
  if prefix == nil then
    return
  end
  local user = redis.call("HGET", job_key, "user") or ""
  check_types({prefix .. ":usage", "stream"}, {prefix .. ":usage:totals", "hash"},
    {prefix .. ":usage:user:" .. user, "hash"})
end

-- Charge the attempt `attempt` of the job at `job_key`, whose GPU hashes are KEYS[first], KEYS[first+2],
-- ... up to KEYS[last] (each followed by its node's hash), ending at `now` with `outcome`.
local function record_usage(job_key, attempt, now, first, last, outcome)
  local prefix = usage_prefix(job_key)
  if prefix == nil or last < first then
    return
  end
  local j = redis.call("HMGET", job_key, "reserved_at", "user", "name")
  local start = tonumber(j[1])
  if start == nil then
    return
  end
  if redis.call("HSETNX", job_key, "usage:" .. attempt, now) == 0 then
    return
  end
  local t_end = tonumber(now)
  local hours = math.max(0, t_end - start) / 3600
  local user = j[2] or ""
  local types, order = {}, {}
  for i = first, last, 2 do
    local gtype = redis.call("HGET", KEYS[i], "type") or ""
    local price = tonumber(redis.call("HGET", KEYS[i + 1], "price_per_gpu_hour") or "")
    if price == nil or price < 0 then
      price = USAGE_PRICES[gtype] or 0
    end
    local t = types[gtype]
    if t == nil then
      t = {gpus = 0, usd = 0}
      types[gtype] = t
      order[#order + 1] = gtype
    end
    t.gpus = t.gpus + 1
    t.usd = t.usd + price * hours
  end
  local stream = prefix .. ":usage"
  local totals = prefix .. ":usage:totals"
  local days = prefix .. ":usage:user:" .. user
  local day = tostring(math.floor(t_end / 86400))
  local minid = string.format("%.0f", (t_end - USAGE_RETENTION_S) * 1000)
  for _, gtype in ipairs(order) do
    local t = types[gtype]
    local gpu_hours = t.gpus * hours
    local price = 0
    if gpu_hours > 0 then
      price = t.usd / gpu_hours
    else
      price = USAGE_PRICES[gtype] or 0
    end
    redis.call("XADD", stream, "MINID", "~", minid, "*",
      "job", string.match(job_key, ":job:([^:]+)$"), "user", user, "attempt", attempt, "name", j[3] or "",
      "gpu_type", gtype, "gpus", t.gpus, "price", num(price), "start", string.format("%.6f", start),
      "end", string.format("%.6f", t_end), "gpu_hours", num(gpu_hours), "cost_usd", num(t.usd),
      "outcome", outcome or "")
    redis.call("HINCRBYFLOAT", totals, "h|" .. user .. "|" .. gtype, num(gpu_hours))
    redis.call("HINCRBYFLOAT", totals, "usd|" .. user .. "|" .. gtype, num(t.usd))
    redis.call("HINCRBYFLOAT", days, day .. "|h", num(gpu_hours))
    redis.call("HINCRBYFLOAT", days, day .. "|usd", num(t.usd))
  end
  redis.call("EXPIRE", days, USAGE_RETENTION_S)
end
