"""The free GPUs left during one scheduling pass: a mutable index built for speed.

``schedule`` places many jobs in one pass and asks, for most of them and for several
plans each, "does this plan fit the GPUs still free?". Answering that by deriving a new
``ClusterView`` per placement and scanning the nodes with free GPUs per question (what
``choose_nodes`` on a view does) costs O(nodes) per question. This index answers the
same questions with the same answers, faster:

* Per GPU type, the nodes with free GPUs grouped by *how many* they have free
  (``buckets[c]`` = name-sorted nodes with exactly ``c`` free; ``c`` ≤ GPUs per node).
  When every free GPU of the type has at least the plan's bytes free (always in the
  simulator; in the live cluster unless a foreign process holds memory), a node's
  qualifying count is its free count, so "fits?" is a sum over the ``c`` values
  (≤ 8 or 16 terms, memoised per TP width until the type changes) and ``choose_nodes``'
  rules (best-fit single node, fewest nodes, equal split, best-fit remainder) walk the
  buckets from the right end instead of sorting every node: O(GPUs per node + nodes
  used). Otherwise it falls back to ``choose_from`` over the type's nodes (exact).
* Placements and held GPUs are removed in place (O(nodes touched)); nothing else is
  copied. Capacity only shrinks within a pass, so a "does not fit" answer stays true
  until the pass ends; a "fits" answer is recomputed after any change of that type.

``choose`` returns exactly what ``choose_from(view.free_by_node(t), plan)`` would on the
view with the same GPUs removed (tests/unit/has/test_has_equivalence.py checks it).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from has.cluster import ClusterView, GpuSlot, HealthySpan, NodeFree
from has.placement import (
    Nodes,
    Placement,
    PlanOption,
    choose_from,
    choose_mixed,
    explain_counts,
    explain_from,
)


class _TypeFree:
    """One GPU type's free nodes in this pass (copy-on-write from the view's index)."""

    __slots__ = ("free", "buckets", "least", "usable", "slow", "owned")

    def __init__(self, free: Mapping[str, NodeFree], buckets: Sequence[Sequence[str]], least: int) -> None:
        # Both are the view's read-only containers (a mapping, tuples) until ``own`` copies them
        # into a dict and lists, hence Any: a compiled build checks declared types on assignment.
        self.free: Any = free  # name → NodeFree, name order
        self.buckets: Any = buckets  # c → name-sorted nodes with c free GPUs
        self.least = least  # no free GPU of the type has less free memory than this
        # tp → GPUs in whole TP groups over all nodes, when every GPU qualifies (kept exact by take)
        self.usable: dict[int, int] = {}
        self.slow: dict[tuple[int, int], int] = {}  # (tp, bytes) → the same, counted per node
        self.owned = False

    def own(self) -> None:
        """Copy the containers shared with the view (or a clone) before the first write."""
        if not self.owned:
            self.free = dict(self.free)
            self.buckets = [list(names) for names in self.buckets]
            self.owned = True

    def clone(self) -> _TypeFree:
        other = _TypeFree(self.free, self.buckets, self.least)
        other.usable = dict(self.usable)
        other.slow = dict(self.slow)
        self.owned = False  # both now share the containers; whoever writes first copies
        return other


class PassFree:
    """Free GPUs of a ``ClusterView`` minus what the pass has placed or held so far."""

    __slots__ = ("view", "total", "types", "versions")

    def __init__(self, view: ClusterView, of: PassFree | None = None) -> None:
        """The view's free GPUs; with ``of``, a copy of that index instead (``copy``)."""
        self.view = view
        self.types: dict[str, _TypeFree] = {}
        if of is None:
            self.total: dict[str, int] = {t: view.free_count(t) for t in view.gpu_types()}
            self.versions: dict[str, int] = {}  # per type, bumped on every take (memo keys)
        else:
            self.total = dict(of.total)
            self.types = {t: ts.clone() for t, ts in of.types.items()}
            self.versions = dict(of.versions)

    def copy(self) -> PassFree:
        return PassFree(self.view, self)

    def _type(self, gpu_type: str) -> _TypeFree:
        ts = self.types.get(gpu_type)
        if ts is None:
            buckets, least = self.view.free_buckets(gpu_type)
            ts = _TypeFree(self.view.free_by_node(gpu_type), buckets, least)  # type: ignore[arg-type]  # not written until copied
            self.types[gpu_type] = ts
        return ts

    def free_by_node(self, gpu_type: str) -> Mapping[str, NodeFree]:
        """Nodes with free ``gpu_type`` GPUs now (name-sorted), as ``ClusterView.free_by_node``."""
        ts = self.types.get(gpu_type)
        return self.view.free_by_node(gpu_type) if ts is None else ts.free

    def fits(self, gpu_type: str, tp: int, need: int, need_bytes: int) -> bool:
        """Would ``choose_nodes`` find GPUs for such a plan now? (Whole TP groups per node.)"""
        if self.total.get(gpu_type, 0) < need:
            return False
        ts = self.types.get(gpu_type) or self._type(gpu_type)
        if need_bytes <= ts.least:
            groups = ts.usable.get(tp)
            if groups is None:
                groups = sum(len(names) * (c - c % tp) for c, names in enumerate(ts.buckets) if c >= tp)
                ts.usable[tp] = groups
            return groups >= need
        key = (tp, need_bytes)
        groups = ts.slow.get(key)
        if groups is None:
            groups = 0
            for nf in ts.free.values():
                if len(nf.slots) >= tp:
                    q = nf.count_at_least(need_bytes)
                    groups += q - q % tp
            ts.slow[key] = groups
        return groups >= need

    def explain(self, plan: PlanOption, healthy: HealthySpan) -> str:
        """``explain_plan`` on this pass's state (from the buckets when every GPU qualifies)."""
        ts = self.types.get(plan.gpu_type)
        if ts is None or plan.bytes_per_gpu > ts.least:
            return explain_from(self.free_by_node(plan.gpu_type), healthy, plan)
        tp = plan.tp
        buckets = ts.buckets
        total = self.total.get(plan.gpu_type, 0)
        usable = ts.usable.get(tp)  # (as in ``fits``, which keeps it)
        if usable is None:
            usable = ts.usable[tp] = sum(len(names) * (c - c % tp) for c, names in enumerate(buckets) if c >= tp)
        largest = next(((names[0], c) for c in range(len(buckets) - 1, 0, -1) if (names := buckets[c])), None)
        return explain_counts(plan, healthy, total, total, usable, largest)

    def choose(self, plan: PlanOption) -> Nodes | None:
        """Exactly ``choose_nodes(view_now, plan)``, where view_now is this pass's state."""
        need, tp = plan.num_gpus, plan.tp
        if not self.fits(plan.gpu_type, tp, need, plan.bytes_per_gpu):
            return None
        ts = self.types[plan.gpu_type]
        if plan.bytes_per_gpu > ts.least:
            return choose_from(ts.free, plan)
        return _choose_by_count(ts, need, tp)

    def fits_plan(self, plan: PlanOption) -> bool:
        """Would ``choose_plan`` place ``plan`` (single-type or mixed) now?"""
        if not plan.parts:
            return self.fits(plan.gpu_type, plan.tp, plan.num_gpus, plan.bytes_per_gpu)
        for gpu_type, need, tp, need_bytes in plan.type_needs():
            if not self.fits(gpu_type, tp, need, need_bytes):
                return False
        return True

    def choose_plan(self, job_id: str, index: int, plan: PlanOption) -> Placement | None:
        """The placement of ``plan`` (the job's plan ``index``) on this pass's state now: ``choose``
        for a single type, ``has.placement.choose_mixed`` for a mixed plan; None if it does not fit."""
        if not plan.parts:
            nodes = self.choose(plan)
            return None if nodes is None else Placement(job_id, index, plan, nodes)
        found = choose_mixed(self.choose, plan)
        return None if found is None else Placement(job_id, index, plan, found[0], found[1])

    def give(self, gpu_type: str, slots: Sequence[GpuSlot]) -> None:
        """Add these GPUs (healthy, of ``gpu_type``, on schedulable nodes) as free — a what-if: a
        running job's GPUs released; preemption asks it of a copy. Every index ends exactly as
        in a ``PassFree`` built from a view in which they were free, with the same takes
        applied. Raises ``ValueError`` when one is free here already."""
        ts = self._type(gpu_type)
        ts.own()
        had_free = bool(ts.free)
        by_node: dict[str, list[GpuSlot]] = {}
        for g in slots:
            by_node.setdefault(g.node, []).append(g)
        new_nodes = False
        for name, added in by_node.items():
            nf = ts.free.get(name)
            old = nf.slots if nf is not None else ()
            if {g.index for g in added} & {g.index for g in old} or len({g.index for g in added}) != len(added):
                raise ValueError(f"GPUs {sorted(g.index for g in added)} on {name}: some are free already")
            c, k = len(old), len(old) + len(added)
            if nf is not None:
                del ts.buckets[c][bisect.bisect_left(ts.buckets[c], name)]
            else:
                new_nodes = True
            while len(ts.buckets) <= k:  # (trailing empty buckets change no answer)
                ts.buckets.append([])
            ts.free[name] = NodeFree.of(name, (*old, *added))
            bisect.insort(ts.buckets[k], name)
            self.total[gpu_type] = self.total.get(gpu_type, 0) + len(added)
            for tp, groups in ts.usable.items():
                ts.usable[tp] = groups - (c - c % tp) + (k - k % tp)
        if new_nodes:  # keep ``free`` in name order, as the view's
            ts.free = dict(sorted(ts.free.items()))
        given = min((g.memory_free for g in slots), default=ts.least)
        ts.least = min(ts.least, given) if had_free else given
        ts.slow.clear()
        self.versions[gpu_type] = self.versions.get(gpu_type, 0) + 1

    def take(self, gpu_type: str, nodes: Iterable[tuple[str, Sequence[int]]], checked: bool = False) -> None:
        """Remove these GPUs (all free, of ``gpu_type``) from the index.

        Raises ``ValueError`` when one is not free here: a double booking, a bug in the caller.
        ``checked``: the GPUs come from ``choose`` on this very state, so a node whose every
        free GPU is taken needs no per-GPU check (most placements take whole nodes).
        """
        ts = self._type(gpu_type)
        ts.own()
        free, buckets, total, usable = ts.free, ts.buckets, self.total, ts.usable
        emptied: dict[int, list[str]] = {}  # free count → nodes emptied whole, in the order given
        for name, indices in nodes:
            nf = free.get(name)
            if nf is None:
                raise ValueError(f"node {name!r} has no free {gpu_type}")
            slots = nf.slots
            c = len(slots)
            if checked and len(indices) == c:
                del free[name]
                whole = emptied.get(c)
                if whole is None:
                    emptied[c] = [name]
                else:
                    whole.append(name)
                continue
            names = buckets[c]
            gone = set(indices)
            left = tuple([s for s in slots if s.index not in gone])
            if len(left) != len(slots) - len(gone):
                raise ValueError(f"GPUs {sorted(gone)} on {name} are not all free {gpu_type}")
            del names[bisect.bisect_left(names, name)]
            k = len(left)
            if left:
                free[name] = NodeFree(name, left, tuple(sorted([s.memory_free for s in left])))
                bisect.insort(buckets[k], name)
            else:
                del free[name]
            total[gpu_type] -= len(gone)
            for tp, groups in usable.items():  # the node now has k free: (k - k % tp) in groups
                usable[tp] = groups - (c - c % tp) + (k - k % tp)
        for c, whole in emptied.items():  # whole nodes gone: their GPUs and whole TP groups
            names = buckets[c]
            count = len(whole)
            if names[:count] == whole:  # ``choose`` takes a bucket's first nodes, in name order
                del names[:count]
            else:
                for name in whole:
                    del names[bisect.bisect_left(names, name)]
            total[gpu_type] -= c * count
            for tp, groups in usable.items():
                usable[tp] = groups - count * (c - c % tp)
        ts.slow.clear()
        self.versions[gpu_type] = self.versions.get(gpu_type, 0) + 1


def _first(ts: _TypeFree, name: str, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-index free GPUs of a node (every free GPU qualifies here)."""
    indices = ts.free[name].indices
    return indices if count == len(indices) else indices[:count]


def _choose_by_count(ts: _TypeFree, need: int, tp: int) -> Nodes:
    """``choose_from``'s rules when a node's qualifying count is its free count ``c``.

    A node's usable count is u(c) = c - c % tp (0 below tp), non-decreasing in c, so "the
    nodes with u ≥ x, fewest free first, then name" is the buckets from the smallest such c
    upwards, each in name order; "largest u first, then name" is the buckets from the top,
    merging by name the tp buckets that share one u. The caller checked that it fits.
    """
    buckets = ts.buckets
    width = len(buckets) - 1
    # 1. one node: best fit = smallest c whose u(c) reaches need, first name
    for c in range(max(tp, need), width + 1):
        if buckets[c] and c - c % tp >= need:
            name = buckets[c][0]
            return ((name, _first(ts, name, need)),)
    # 2. fewest nodes k: walk nodes by (-u, name) until the usable count reaches need
    order: list[tuple[str, int]] = []
    acc = 0
    u = width - width % tp
    while acc < need and u >= tp:
        groups = [buckets[c] for c in range(u, min(u + tp, width + 1)) if buckets[c]]
        names = groups[0] if len(groups) == 1 else heapq.merge(*groups)
        for name in names:
            order.append((name, u))
            acc += u
            if acc >= need:
                break
        u -= tp
    k = len(order)
    # 3. equal split when k nodes can each give need/k (a multiple of tp); u(c) ≥ per iff c ≥ per
    if need % k == 0 and (need // k) % tp == 0:
        per = need // k
        fitting: list[str] = []
        for c in range(per, width + 1):
            fitting.extend(buckets[c][: k - len(fitting)])
            if len(fitting) == k:
                return tuple((name, _first(ts, name, per)) for name in sorted(fitting))
    # 4. the k-1 largest give all they can; the remainder goes to the best fit of the rest
    head = order[: k - 1]
    head_names = {name for name, _ in head}
    remainder = need - sum(n for _, n in head)
    for c in range(max(tp, remainder), width + 1):
        if c - c % tp < remainder:
            continue
        for name in buckets[c]:
            if name not in head_names:
                return tuple((n, _first(ts, n, got)) for n, got in head) + (
                    (name, _first(ts, name, remainder)),
                )
    raise AssertionError("unreachable: the k-th largest node holds the remainder")  # pragma: no cover


__all__ = ["PassFree"]
