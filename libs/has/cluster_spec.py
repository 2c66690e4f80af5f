"""The cluster file: one YAML/JSON shape that describes a cluster, used by
`frenzy up` (to start fake-GPU agents) and by the simulator.

    nodes:
      - {gpu: A100-80GB, count: 2, gpus_per_node: 8}   # 2 nodes of 8 GPUs
      - {gpu: L4, count: 3, gpus_per_node: 4, name_prefix: l4}

Optional per entry: ``name_prefix`` (default: the GPU name lower-cased),
``intra_node_link`` ("nvlink" | "pcie"), ``inter_node_gbps`` (float, GB/s).
This module only parses and validates the shape (pure); whether a GPU name
is in the catalog is checked by the caller, which owns the catalog.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any


class ClusterSpecError(ValueError):
    """A malformed cluster file; the message names the entry and field."""


@dataclass(frozen=True)
class NodeGroup:
    gpu: str
    count: int
    gpus_per_node: int
    name_prefix: str
    intra_node_link: str | None = None
    inter_node_gbps: float | None = None

    def node_names(self) -> list[str]:
        return [f"{self.name_prefix}-{i}" for i in range(self.count)]


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[NodeGroup, ...]

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)

    def nodes(self) -> list[tuple[str, NodeGroup]]:
        """(node name, its group) for every node, in file order."""
        return [(name, g) for g in self.groups for name in g.node_names()]


_ALLOWED = {"gpu", "count", "gpus_per_node", "name_prefix", "intra_node_link", "inter_node_gbps"}


def _positive_int(entry: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ClusterSpecError(f"{where}.{key}: must be a positive integer (got {value!r})")
    return value


def parse_cluster(data: Any) -> ClusterSpec:
    """Validate a decoded cluster file (dict) into a ClusterSpec."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise ClusterSpecError("cluster file: expected a mapping with a 'nodes' list")
    entries = data["nodes"]
    if not isinstance(entries, list) or not entries:
        raise ClusterSpecError("nodes: must be a non-empty list")
    groups: list[NodeGroup] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        if not isinstance(entry, dict):
            raise ClusterSpecError(f"{where}: expected a mapping like {{gpu: A100-80GB, count: 2, gpus_per_node: 8}}")
        unknown = set(entry) - _ALLOWED
        if unknown:
            # sorted by text: YAML keys can be numbers, None or dates, which do not sort with strings
            raise ClusterSpecError(f"{where}: unknown field(s) {sorted(unknown, key=str)}; allowed: {sorted(_ALLOWED)}")
        gpu = entry.get("gpu")
        if not isinstance(gpu, str) or not gpu.strip():
            raise ClusterSpecError(f"{where}.gpu: must name a GPU type (got {gpu!r})")
        count = _positive_int(entry, "count", where, 1)
        per_node = _positive_int(entry, "gpus_per_node", where, 8)
        prefix = entry.get("name_prefix") or re.sub(r"[^a-z0-9]+", "", gpu.lower())
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", prefix):
            raise ClusterSpecError(f"{where}.name_prefix: letters, digits, '-', '_' and '.' only (got {prefix!r})")
        if prefix in seen:
            raise ClusterSpecError(f"{where}.name_prefix: {prefix!r} is used twice; node names must be unique")
        seen.add(prefix)
        link = entry.get("intra_node_link")
        if link is not None and link not in ("nvlink", "pcie"):
            raise ClusterSpecError(f"{where}.intra_node_link: 'nvlink' or 'pcie' (got {link!r})")
        gbps = entry.get("inter_node_gbps")
        # Chained, so YAML's .nan and .inf and an int too large for a float are refused too.
        if gbps is not None and (isinstance(gbps, bool) or not isinstance(gbps, int | float)
                                 or not 0 < gbps <= sys.float_info.max):
            raise ClusterSpecError(f"{where}.inter_node_gbps: must be a positive number (got {gbps!r})")
        groups.append(NodeGroup(gpu=gpu.strip(), count=count, gpus_per_node=per_node, name_prefix=prefix,
                                intra_node_link=link, inter_node_gbps=float(gbps) if gbps is not None else None))
    return ClusterSpec(tuple(groups))
