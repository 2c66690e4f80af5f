"""A starving job's drain target: the plan and nodes it waits for, holding the most free GPUs.

``drain_target`` reads a ``ClusterView`` or, during a pass, ``PassInventory`` (the snapshot
minus the pass's placements) and returns the ``Reservation``: per node, how many GPUs the plan
will take there once running jobs end, and the free GPUs held for it now (docs/has-policy.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from has.cluster import ClusterView, NodeFree
from has.pass_state import PassFree
from has.placement import Placement, PlanOption
from has.policy import Reservation


class DrainSource(Protocol):
    """What ``drain_target`` reads: a ``ClusterView``, or the pass's state (``PassInventory``)."""

    def drain_inventory(
        self, gpu_type: str
    ) -> tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]: ...


class PassInventory:
    """The snapshot minus this pass's placements, as ``drain_target`` reads it — from the pass's
    free-GPU index and the placements' GPUs, without deriving a ``ClusterView`` (which copies
    every GPU a placement takes: ~60 ms for a 1,000-GPU placement at 10,000 GPUs)."""

    def __init__(self, cluster: ClusterView, free: PassFree, placements: Sequence[Placement]) -> None:
        self.cluster, self.free, self.placements = cluster, free, placements

    def drain_inventory(
        self, gpu_type: str
    ) -> tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]:
        rows, _, busy_levels = self.cluster.drain_inventory(gpu_type)
        placed: dict[str, list[int]] = {}  # node → memory_total of the GPUs placed on it this pass
        for p in self.placements:
            if p.plan.gpu_type == gpu_type:
                for name, indices in p.nodes:
                    total = {g.index: g.memory_total for g in self.cluster.node(name).gpus}
                    placed.setdefault(name, []).extend(total[i] for i in indices)
        now = self.free.free_by_node(gpu_type)
        out = [(name, now.get(name), sorted(busy + placed[name]) if name in placed else busy) for name, _, busy in rows]
        free_levels = sorted({m for nf in now.values() for m in nf.mem_sorted})
        busy_levels = sorted(set(busy_levels).union(*placed.values())) if placed else busy_levels
        return out, free_levels, busy_levels


def drain_target(cluster: DrainSource, job_id: str, plans: Sequence[PlanOption]) -> Reservation | None:
    """The plan and nodes a starving job should wait for, holding the most free GPUs.

    For each plan: a node can give ``cap`` TP groups (its free qualifying GPUs
    plus the GPUs busy with other jobs whose memory_total is enough, rounded
    down to whole groups). The j-th group on a node already has
    ``clamp(free - (j-1)*tp, 0, tp)`` free GPUs — non-increasing in j — so
    taking the need/tp groups with the largest counts (a greedy over a sum of
    concave functions) maximises the GPUs that are free now. Ties prefer nodes
    with more free GPUs, then more capacity, then name, which also keeps the
    target on few nodes. Across plans the one missing the fewest GPUs wins,
    ties to the better-ranked plan. None when no plan fits even then.
    """
    best: tuple[tuple[int, int, int], _DrainNodes, dict[int, int]] | None = None
    # A job has dozens of plans but few node orders: plans of one GPU type and TP width whose
    # byte needs qualify the same GPUs rank the nodes alike (sorted once), and only their
    # sizes differ (the greedy walk, cheap). Only the winner's GPUs are listed.
    inventories: dict[str, tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]] = {}
    orders: dict[tuple[str, int, int, int], _DrainNodes] = {}
    for plan_index, plan in enumerate(plans):
        tp = plan.tp
        need_groups = plan.num_gpus // tp
        need_bytes = plan.bytes_per_gpu
        inv = inventories.get(plan.gpu_type)
        if inv is None:
            inv = inventories[plan.gpu_type] = cluster.drain_inventory(plan.gpu_type)
        inventory, free_levels, busy_levels = inv
        key = (plan.gpu_type, tp, bisect.bisect_left(free_levels, need_bytes),
               bisect.bisect_left(busy_levels, need_bytes))  # fmt: skip
        nodes = orders.get(key)
        if nodes is None:
            nodes = orders[key] = _DrainNodes(inventory, tp, need_bytes)
        if nodes.cap < need_groups:
            continue
        groups, held = nodes.pick(need_groups)
        rank = (plan.num_gpus - held, len(groups), plan_index)  # (missing, target nodes, plan)
        if best is None or rank < best[0]:
            best = (rank, nodes, groups)
    if best is None:
        return None
    (_, _, plan_index), nodes, groups = best
    target, held_gpus = nodes.listed(groups)
    return Reservation(job_id, plan_index, plans[plan_index], target, held_gpus)


class _DrainNodes:
    """One (GPU type, TP width, qualifying GPUs) of ``drain_target``: the nodes that can give
    the plan whole TP groups, best first — (name, free qualifying, cap groups, free GPUs) by
    (most free qualifying, most cap, name) — and their total ``cap``."""

    __slots__ = ("rows", "cap", "tp", "need_bytes", "_partial", "_picks")

    def __init__(self, inventory: list[tuple[str, NodeFree | None, list[int]]], tp: int, need_bytes: int) -> None:
        rows: list[tuple[str, int, int, NodeFree | None]] = []
        for name, free, busy in inventory:
            q = free.count_at_least(need_bytes) if free is not None else 0
            cap = (q + len(busy) - bisect.bisect_left(busy, need_bytes)) // tp
            if cap:
                rows.append((name, q, cap, free))
        rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
        self.rows = rows
        self.cap = sum(cap for _, _, cap, _ in rows)
        self.tp = tp
        self.need_bytes = need_bytes
        self._partial: list[tuple[int, int]] | None = None
        self._picks: dict[int, tuple[dict[int, int], int]] = {}  # (plans of one size share a pick)

    def pick(self, need_groups: int) -> tuple[dict[int, int], int]:
        """The ``need_groups`` groups of largest gain, ties by (node order, j) — counted, not
        listed: a node's groups gain tp (whole groups of free GPUs: q // tp of them), then one
        group gains q % tp (when the node has room for it), then the rest gain 0. Returns
        (row → groups taken there, free GPUs they hold)."""
        hit = self._picks.get(need_groups)
        if hit is not None:
            return hit
        rows, tp = self.rows, self.tp
        per_node: dict[int, int] = {}
        left = need_groups
        for order, (_, q, _, _) in enumerate(rows):  # 1. every group already whole, node by node
            if left == 0:
                break
            take = min(q // tp, left)
            if take:
                per_node[order] = take
                left -= take
        if left:  # 2. the partial groups, largest first
            partial = self._partial
            if partial is None:
                partial = self._partial = sorted(
                    (-(q % tp), order) for order, (_, q, cap, _) in enumerate(rows) if q % tp and cap > q // tp
                )
            for _, order in partial[:left]:
                per_node[order] = per_node.get(order, 0) + 1
            left -= min(left, len(partial))
        for order, (_, q, cap, _) in enumerate(rows):  # 3. groups of busy GPUs only, node by node
            if left == 0:
                break
            take = min(cap - -(-q // tp), left)  # cap minus the groups with a free GPU
            if take > 0:
                per_node[order] = per_node.get(order, 0) + take
                left -= take
        held = 0
        for order, groups in per_node.items():  # the first groups*tp of a node's q free ones
            held += min(rows[order][1], groups * tp)
        self._picks[need_groups] = (per_node, held)
        return per_node, held

    def listed(
        self, per_node: dict[int, int]
    ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, tuple[int, ...]], ...]]:
        """``pick``'s groups as (target nodes and GPU counts, free GPUs held), in node order."""
        target = []
        held = []
        for order in sorted(per_node):
            name, q, _, free = self.rows[order]
            gpus = per_node[order] * self.tp
            target.append((name, gpus))
            if q and free is not None:
                held.append((name, tuple([s.index for s in free.slots if s.memory_free >= self.need_bytes][:gpus])))
        return tuple(target), tuple(held)
