"""This node's record in Redis: its registration and its heartbeats, as the agent's two scripts write them.

``register_node.lua`` writes the node hash, every GPU hash, the nodes set and the alive lease in
one step; ``heartbeat.lua`` renews the lease and the GPUs' live fields. Both are called by their
SHA only (agents may not load scripts: issue 34). The agent decides when (at start, on every
heartbeat, again when Redis lost the node); this module only turns the node's GPUs into the
scripts' arguments and reads their answers.
"""

from __future__ import annotations

import json
import logging
import os

import redis

from frenzy.agent.gpus import GpuInfo, node_health, processes_json
from frenzy.state import scripts
from frenzy.state.keys import Keys

log = logging.getLogger(__name__)

# heartbeat.lua's answers: the node hash is gone (register again), renewed, or renewed but the
# scheduler declared the node dead meanwhile (its jobs moved: the copies here must stop).
MISSING, RENEWED, DECLARED_DEAD = 0, 1, 2


class NodeRegistration:
    """Registers ``node`` and renews its lease under the lease value ``instance`` (this agent run)."""

    def __init__(self, client: redis.Redis, keys: Keys, node: str, addr: str, ttl_s: float, instance: str,
                 price_per_gpu_hour: float | None = None) -> None:
        self.keys, self.node, self.addr, self.ttl_s, self.instance = keys, node, addr, ttl_s, instance
        self.price_per_gpu_hour = price_per_gpu_hour
        self._register = scripts.register_loaded(client, "register_node")
        self._heartbeat = scripts.register_loaded(client, "heartbeat")

    def _gpu_keys(self, gpus: list[GpuInfo]) -> list[str]:
        return [self.keys.gpu(self.node, g.index) for g in gpus]

    def register(self, gpus: list[GpuInfo]) -> None:
        """Write the node and its GPUs (owners and fences of GPUs already there are kept by the script)."""
        types: list[str] = []
        for g in gpus:
            if g.gpu_type and g.gpu_type not in types:
                types.append(g.gpu_type)
        args: list[object] = [self.node, self.addr, ",".join(types), os.getpid(),
                              int(self.ttl_s * 1000), self.instance, node_health(gpus),
                              "" if self.price_per_gpu_hour is None else repr(float(self.price_per_gpu_hour))]
        for g in gpus:
            args += [g.index, g.uuid, g.gpu_type or "", g.nvml_name, g.memory_total, g.memory_free,
                     int(g.healthy), g.health_reason, g.pci_bus_id,
                     json.dumps({str(k): v for k, v in sorted(g.links.items())}), g.utilization,
                     processes_json(g), int(g.type_from_memory)]
        keys = [self.keys.node(self.node), self.keys.nodes(), self.keys.node_alive(self.node), *self._gpu_keys(gpus)]
        previous = self._register(keys=keys, args=args)
        if previous and previous != self.instance:
            log.warning(
                "node %s still had a live lease from another agent run (%s): either this is a quick "
                "restart, or a second agent runs with the same --node name (it must not)", self.node, previous)
        log.info("registered node %s: %d GPU(s) %s, lease %.1fs", self.node, len(gpus),
                 ",".join(types) or "(none in catalog)", self.ttl_s)

    def heartbeat(self, gpus: list[GpuInfo]) -> int:
        """Renew the lease and the GPUs' live fields -> MISSING, RENEWED or DECLARED_DEAD."""
        args: list[object] = [int(self.ttl_s * 1000), self.instance, node_health(gpus)]
        for g in gpus:
            args += [g.memory_free, int(g.healthy), g.health_reason, g.utilization, processes_json(g)]
        keys = [self.keys.node(self.node), self.keys.node_alive(self.node), *self._gpu_keys(gpus)]
        return int(self._heartbeat(keys=keys, args=args) or MISSING)
