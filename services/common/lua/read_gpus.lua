-- read_gpus: the same fields of many GPU hashes, in one round trip.
--
-- Guarantees: read-only; every GPU is read in one snapshot (a script runs
-- alone), so a reservation or release is seen whole or not at all — the
-- scheduler never sees half of a gang reservation.
--
-- KEYS: GPU hashes  ARGV: field names
-- Returns one array of ARGV's values per key (false where missing).

local out = {}
for i = 1, #KEYS do
  out[i] = redis.call("HMGET", KEYS[i], unpack(ARGV))
end
return out
