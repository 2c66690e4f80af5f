-- lib/release_gpus: give back the GPUs and the rendezvous port a job holds, only
-- where the job still holds them.
--
-- Not a script of its own: frenzy.state.scripts inlines it at load into every
-- script that releases (Redis has no `require`). Guarantees: a GPU is released
-- only when its owner is this job (and, given a fence, under that fence); a port
-- only when its entry still names this job. So a stale or repeated call never
-- frees what another job, or a newer reservation of the same job, holds.

-- Free one GPU hash if `job` owns it (under `fence` when one is given); true when freed.
local function release_gpu(gpu, job, fence)
  local g = redis.call("HMGET", gpu, "owner", "fence")
  if g[1] ~= job or (fence ~= nil and g[2] ~= fence) then
    return false
  end
  redis.call("HSET", gpu, "owner", "")
  return true
end

-- Free every GPU of KEYS[first ..], each key followed by its node's hash, whose `rev`
-- goes up once per GPU freed (the scheduler then re-reads that node).
local function release_gpus(first, job)
  for i = first, #KEYS, 2 do
    if release_gpu(KEYS[i], job) then
      redis.call("HINCRBY", KEYS[i + 1], "rev", 1)
    end
  end
end

-- Free the job's rendezvous `port` in its master node's `ports` hash (port may be false).
local function release_port(ports, port, job)
  if port and redis.call("HGET", ports, port) == job then
    redis.call("HDEL", ports, port)
  end
end
