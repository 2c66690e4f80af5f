-- renew_lease: extend the lease while it is still ours, or let it go.
--
-- Guarantees (atomic): only the holder named in the value can extend or
-- release it; a holder whose lease expired and was taken by another gets 0
-- and must stop placing (its value is refused by the fenced scripts anyway).
--
-- KEYS[1] lease key
-- ARGV[1] the value acquire_lease returned  ARGV[2] time to live (ms), or 0 to release
-- Returns 1 when still held (or released by us), 0 when it is not ours.

if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == "0" then
  redis.call("DEL", KEYS[1])
else
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 1
