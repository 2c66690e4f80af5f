-- read_hashes: the same fields of many hashes, in one round trip.
--
-- The scheduler reads this way, per tick: the GPU hashes of the nodes whose rev moved,
-- the job hashes of every queued job (attempt, submit time, state) and of every job
-- holding GPUs (expected end, preemption fields). One HMGET per key through a redis-py
-- pipeline costs ~20-30 µs a key on the client; here the whole read is one command.
--
-- Guarantees: read-only; every hash is read in one snapshot (a script runs alone), so a
-- reservation or release is seen whole or not at all — the scheduler never sees half of
-- a gang reservation.
--
-- KEYS: hashes  ARGV: field names
-- Returns one array of ARGV's values per key (false where missing).

local out = {}
for i = 1, #KEYS do
  out[i] = redis.call("HMGET", KEYS[i], unpack(ARGV))
end
return out
