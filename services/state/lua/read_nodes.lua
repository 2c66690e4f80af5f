-- read_nodes: what the scheduler needs of every node, in one round trip.
--
-- Guarantees: read-only; one consistent snapshot of all the nodes' heads (a
-- script runs alone), so no node is half-updated between two reads.
--
-- KEYS: for each node, its node hash then its alive lease key (2 per node)
-- Returns one entry per node: {name, gpu_count, draining, rev, alive (1/0), addr};
-- name is false when the node hash is missing. `rev` goes up whenever a script
-- changes one of the node's GPUs as the scheduler reads them (owner, health,
-- a free GPU's memory): a node whose rev is unchanged need not be re-read.

local out = {}
for i = 1, #KEYS, 2 do
  local h = redis.call("HMGET", KEYS[i], "name", "gpu_count", "draining", "rev", "addr")
  out[#out + 1] = {h[1], h[2], h[3], h[4], redis.call("EXISTS", KEYS[i + 1]), h[5]}
end
return out
