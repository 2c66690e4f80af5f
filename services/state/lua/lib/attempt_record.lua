-- lib/attempt_record: one attempt of a job as the job hash keeps it (field `attempt:<n>`, JSON):
-- the plan it ran with (MARP's predicted peak per GPU, the GPU's size, the layout), then what the
-- agents reported (exit code, recognised cause, last output lines, observed peak per GPU) and how
-- the attempt ended. Never dropped by a requeue: the job's history of attempts and plans.
--
-- Not a script of its own: frenzy.state.scripts inlines it at load. `note` is a JSON object the
-- caller (frenzy.state.store) builds:
--   base  {attempt, gpu_type, num_gpus, layout, predicted_peak_bytes, gpu_memory_bytes}: the record
--         before anything happened (used when the field does not exist yet)
--   exit  (optional) one node's report: {node, code, cause, tail, peak, measured}
-- Guarantees: the observed peak only goes up (the highest node's); the exit code, cause, node and
-- tail are the first failure's (`first_failure`), or the cause the end gives when none was
-- reported (`end_attempt`, e.g. "node lost"); numbers are stored as JSON numbers.

local function attempt_field(attempt)
  return "attempt:" .. attempt
end

local function load_attempt(job_key, attempt, note)
  local raw = redis.call("HGET", job_key, attempt_field(attempt))
  if raw then
    return cjson.decode(raw)
  end
  local rec = note.base or {}
  rec.attempt = tonumber(attempt)
  rec.outcome = rec.outcome or "running"
  return rec
end

local function save_attempt(job_key, attempt, rec)
  redis.call("HSET", job_key, attempt_field(attempt), cjson.encode(rec))
end

-- Count one node's exit report into the attempt's record. first_failure: this exit is the
-- attempt's failure (a non-zero exit of a node not told to stop, the first of them).
local function note_exit(job_key, attempt, note, first_failure)
  local e = note.exit
  if note.base == nil and e == nil then
    return
  end
  local rec = load_attempt(job_key, attempt, note)
  if e ~= nil then
    local peak = tonumber(e.peak) or 0
    if peak > (tonumber(rec.observed_peak_bytes) or 0) then
      rec.observed_peak_bytes = peak
      rec.peak_measured = e.measured == true
      rec.peak_node = e.node
    end
    if first_failure then
      rec.exit_code = tonumber(e.code) or -1
      rec.cause = e.cause or ""
      rec.node = e.node or ""
      rec.tail = e.tail or ""
    end
  end
  save_attempt(job_key, attempt, rec)
end

-- The attempt ended: its outcome ("succeeded", "failed", "cancelled", "requeued: why", ...) and when;
-- a cause (and its node) for an attempt whose agents reported none (a node lost).
local function end_attempt(job_key, attempt, note, outcome, now, cause, node)
  if note.base == nil then
    return
  end
  local rec = load_attempt(job_key, attempt, note)
  rec.outcome = outcome
  rec.ended_at = tonumber(now)
  if cause ~= nil and cause ~= "" and (rec.cause == nil or rec.cause == "") then
    rec.cause = cause
    rec.node = node or ""
  end
  save_attempt(job_key, attempt, rec)
end
