"""The cluster file: one YAML/JSON shape that describes a cluster, used by
`frenzy up` (to start fake-GPU agents) and by the simulator.

    nodes:
      - {gpu: A100-80GB, count: 2, gpus_per_node: 8}   # 2 nodes of 8 GPUs
      - {gpu: L4, count: 3, gpus_per_node: 4, name_prefix: l4}

Optional per entry: ``name_prefix`` (default: the GPU name lower-cased),
``intra_node_link`` ("nvlink" | "pcie"), ``inter_node_gbps`` (float, GB/s),
``price_per_gpu_hour`` (dollars per GPU-hour, >= 0: the operator's own rate, over the
GPU catalog's list price; docs/cost.md).
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
    price_per_gpu_hour: float | None = None  # None: the GPU catalog's list price

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

    def price_overrides(self) -> dict[str, float]:
        """GPU type (as written) -> the price its groups set; where several groups of one type set
        different prices, the highest (a plan of that type may land on any of them, and a budget is
        a limit)."""
        out: dict[str, float] = {}
        for g in self.groups:
            if g.price_per_gpu_hour is not None:
                out[g.gpu] = max(out.get(g.gpu, 0.0), g.price_per_gpu_hour)
        return out


_ALLOWED = {"gpu", "count", "gpus_per_node", "name_prefix", "intra_node_link", "inter_node_gbps",
            "price_per_gpu_hour"}


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
        price = entry.get("price_per_gpu_hour")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                                  or not 0 <= price <= 1e6):
            raise ClusterSpecError(f"{where}.price_per_gpu_hour: must be a number of dollars per GPU-hour, "
                                   f"0 to 1e6 (got {price!r})")
        groups.append(NodeGroup(gpu=gpu.strip(), count=count, gpus_per_node=per_node, name_prefix=prefix,
                                intra_node_link=link, inter_node_gbps=float(gbps) if gbps is not None else None,
                                price_per_gpu_hour=float(price) if price is not None else None))
    return ClusterSpec(tuple(groups))
