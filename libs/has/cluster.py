"""Immutable snapshot of the cluster's GPUs, indexed for placement.

The scheduler service derives each tick's ``ClusterView`` from the previous one
(``updated``: only changed nodes are re-indexed); the simulator builds one from its
own model of the cluster. Placement code never
scans every GPU: the view keeps, per GPU type, the nodes that have free GPUs of
that type (and those GPUs' free memory, sorted, so "how many qualify for X
bytes" is a bisect). Views are never mutated: ``with_reserved`` returns a new
view that shares every untouched node with the old one, so one scheduling pass
can place many jobs without double booking and without copying the cluster.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

_INF = float("inf")


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as the scheduler sees it (memory in bytes)."""

    node: str
    index: int
    gpu_type: str
    memory_total: int
    memory_free: int
    owner: str | None  # job id holding it; None when free
    healthy: bool = True
    # When the owner is expected to release it (seconds, same clock as ``now``); None when
    # unknown. Only completion-time-aware plan choice reads it (docs/has-policy.md).
    free_at: float | None = None

    @property
    def is_free(self) -> bool:
        return self.owner is None and self.healthy


@dataclass(frozen=True)
class NodeView:
    """One node and its GPUs; only ``schedulable`` nodes receive new work."""

    name: str
    gpus: tuple[GpuSlot, ...]
    alive: bool = True
    draining: bool = False

    @property
    def schedulable(self) -> bool:
        # A draining node finishes what it runs but takes nothing new.
        return self.alive and not self.draining


@dataclass(frozen=True)
class NodeFree:
    """Free, healthy GPUs of one type on one schedulable node.

    ``slots`` is sorted by GPU index (a placement takes the lowest indices, so
    CUDA_VISIBLE_DEVICES stays compact); ``mem_sorted`` holds the same GPUs'
    free memory ascending so the qualifying count for a byte need is a bisect.
    """

    node: str
    slots: tuple[GpuSlot, ...]
    mem_sorted: tuple[int, ...]
    # ``indices``, computed on first use (outside equality, hash and repr)
    _indices: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_indices", None)  # (a compiled build does not apply the default)

    @staticmethod
    def of(node: str, slots: Iterable[GpuSlot]) -> NodeFree:
        ordered = tuple(sorted(slots, key=lambda s: s.index))
        return NodeFree(node, ordered, tuple(sorted(s.memory_free for s in ordered)))

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPUs' indices, ascending (computed once per object and kept on it)."""
        indices = self._indices
        if indices is None:
            indices = tuple([s.index for s in self.slots])
            object.__setattr__(self, "_indices", indices)
        return indices

    def count_at_least(self, need_bytes: int) -> int:
        """How many of these GPUs have at least ``need_bytes`` free."""
        return len(self.mem_sorted) - bisect.bisect_left(self.mem_sorted, need_bytes)

    def take(self, count: int, need_bytes: int) -> tuple[int, ...]:
        """Indices of the ``count`` lowest-index GPUs with enough free memory."""
        picked = [s.index for s in self.slots if s.memory_free >= need_bytes][:count]
        if len(picked) < count:
            raise ValueError(f"node {self.node}: only {len(picked)} GPUs qualify, {count} asked")
        return tuple(picked)


class HealthySpan(NamedTuple):
    """Of one GPU type's healthy GPUs on schedulable nodes, free or not: the most on one node
    and the total (0 and 0: the cluster has none). What a pending reason reports of them."""

    widest: int
    total: int


class _Capacity:
    """Healthy GPUs per type and node, free or not, on schedulable nodes.

    What the cluster could offer once every running job has ended. Reservations
    never change it, so all views derived by ``with_reserved`` share one
    instance — including its memo of TP-group counts, which is why the queue
    policy's "could this ever fit?" check costs a dict lookup per plan.
    """

    __slots__ = ("mems", "counts", "levels", "_groups", "_sizes", "_spans", "release_ids")

    def __init__(self, raw: dict[str, dict[str, list[int]]]) -> None:
        # gpu_type → node → memory_total of its healthy GPUs, ascending.
        self.mems = {t: {n: tuple(sorted(m)) for n, m in per.items()} for t, per in raw.items()}
        # Read-only: healthy_by_node hands these out, and every derived view shares them.
        self.counts = {
            t: MappingProxyType({n: len(m) for n, m in per.items()}) for t, per in self.mems.items()
        }
        # Distinct memory sizes per type: any byte need between two levels counts the same GPUs.
        self.levels = {t: sorted({x for m in per.values() for x in m}) for t, per in self.mems.items()}
        self._groups: dict[tuple[str, int, int], int] = {}
        self._sizes: dict[str, dict[int, int]] = {}  # gpu_type → healthy GPUs per node → nodes
        self._spans: dict[str, HealthySpan] = {}  # gpu_type → its widest node and total (span)
        # The queue policy's numbering of release lists (has.releases.Releases): (gpu_type, memory
        # level or None) → small int, in first-use order. Kept here because which level a byte
        # need falls in depends on this capacity only, so jobs' cached numbers stay valid while
        # it does (a few entries: GPU types × memory sizes).
        self.release_ids: dict[tuple[str, int | None], int] = {}

    @staticmethod
    def of(raw: dict[str, dict[str, list[int]]]) -> _Capacity:
        """The capacity of ``raw``, reusing the previous view's when equal (it changes only when
        a node or GPU goes down or comes back), so its memos — and the queue policy's per-job
        "could this job ever fit?" answers keyed by it — carry over from tick to tick."""
        global _LAST_CAPACITY
        last = _LAST_CAPACITY
        if last is not None and last[0] == raw:
            return last[1]
        capacity = _Capacity(raw)
        _LAST_CAPACITY = (raw, capacity)
        return capacity

    def by_node(self, gpu_type: str, need_bytes: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for node, mems in self.mems.get(gpu_type, {}).items():
            n = len(mems) - bisect.bisect_left(mems, need_bytes)
            if n:
                out[node] = n
        return out

    def span(self, gpu_type: str) -> HealthySpan:
        out = self._spans.get(gpu_type)
        if out is None:
            per: Mapping[str, int] = self.counts.get(gpu_type, {})
            out = self._spans[gpu_type] = HealthySpan(max(per.values(), default=0), sum(per.values()))
        return out

    def groups(self, gpu_type: str, need_bytes: int, tp: int) -> int:
        levels = self.levels.get(gpu_type, [])
        i = bisect.bisect_left(levels, need_bytes)
        if i == len(levels):
            return 0
        key = (gpu_type, levels[i], tp)
        cached = self._groups.get(key)
        if cached is None:
            if i == 0:  # every GPU of the type qualifies: count by node size, not node by node
                sizes = self._sizes.get(gpu_type)
                if sizes is None:
                    sizes = {}
                    for count in self.counts[gpu_type].values():
                        sizes[count] = sizes.get(count, 0) + 1
                    self._sizes[gpu_type] = sizes
                cached = sum(nodes * (c // tp) for c, nodes in sizes.items())
            else:
                cached = sum(c // tp for c in self.by_node(gpu_type, levels[i]).values())
            self._groups[key] = cached
        return cached


_LAST_CAPACITY: tuple[dict[str, dict[str, list[int]]], _Capacity] | None = None
_NO_CAPACITY = _Capacity({})  # a blank view's, until ``_derived`` or ``updated`` sets the real one


def _check_node(node: NodeView) -> None:
    seen: set[int] = set()
    for gpu in node.gpus:
        if gpu.node != node.name:
            raise ValueError(f"GPU {gpu.node}:{gpu.index} listed under node {node.name!r}")
        if gpu.index in seen:
            raise ValueError(f"duplicate GPU index {gpu.index} on node {node.name!r}")
        seen.add(gpu.index)


@dataclass(frozen=True)
class _Contribution:
    """What one node adds to a view's indexes, per GPU type (nothing unless schedulable)."""

    node: str
    free: dict[str, NodeFree]  # its free healthy GPUs
    capacity: dict[str, list[int]]  # memory_total of its healthy GPUs, in GPU order
    # release estimate → how many of its busy healthy GPUs have it: inf when unknown, -inf
    # for a NaN estimate (both read max(now, estimate) as now; -inf can be a dict key)
    busy: dict[str, dict[float, int]]

    @property
    def types(self) -> set[str]:
        return set(self.capacity)


def _release_key(free_at: float | None) -> float:
    """A busy GPU's release estimate as counted: inf when unknown, -inf for NaN (both read
    max(now, estimate) as "free now"; -inf, unlike NaN, can be a dict key)."""
    if free_at is None:
        return _INF
    return free_at if free_at == free_at else -_INF


def _add_counts(into: dict[float, int], counts: Mapping[float, int], sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) ``counts`` of release estimates; none left: no entry."""
    for x, n in counts.items():
        left = into.get(x, 0) + sign * n
        if left:
            into[x] = left
        else:
            del into[x]


def _contribution(node: NodeView) -> _Contribution:
    free: dict[str, list[GpuSlot]] = {}
    capacity: dict[str, list[int]] = {}
    busy: dict[str, dict[float, int]] = {}
    if node.schedulable:
        for gpu in node.gpus:
            if not gpu.healthy:
                continue
            capacity.setdefault(gpu.gpu_type, []).append(gpu.memory_total)
            if gpu.owner is None:
                free.setdefault(gpu.gpu_type, []).append(gpu)
            else:
                at = _release_key(gpu.free_at)
                counted = busy.get(gpu.gpu_type)
                if counted is None:
                    counted = busy[gpu.gpu_type] = {}
                counted[at] = counted.get(at, 0) + 1
    return _Contribution(node.name, {t: NodeFree.of(node.name, s) for t, s in free.items()}, capacity, busy)


class _HasGpus(Protocol):
    """What ``with_reserved`` needs of a Placement (a protocol, to avoid an import cycle)."""

    @property
    def job_id(self) -> str: ...

    def gpus(self) -> list[tuple[str, int]]: ...


class ClusterView:
    """Read-only cluster snapshot with a GPU-type → node → free-GPUs index.

    Only healthy, unowned GPUs on schedulable (alive, not draining) nodes are
    indexed as free; everything else is still visible through ``nodes`` for
    explanations and for the starvation policy's "what will be free" estimate.
    """

    __slots__ = ("_nodes", "_free", "_capacity", "_free_total", "_cache", "_busy_at")

    _nodes: dict[str, NodeView]
    _free: dict[str, dict[str, NodeFree]]
    _capacity: _Capacity
    _free_total: dict[str, int]
    _cache: dict[tuple[str, str, int], object]
    _busy_at: dict[str, dict[float, int]] | None

    def __init__(self, nodes: Iterable[NodeView], *, _blank: bool = False) -> None:
        if _blank:  # for ``_derived`` and ``updated``, which fill every field themselves
            self._nodes = {}
            self._free = {}
            self._capacity = _NO_CAPACITY
            self._free_total = {}
            self._cache = {}
            self._busy_at = None
            return
        by_name: dict[str, NodeView] = {}
        for node in nodes:
            if node.name in by_name:
                raise ValueError(f"duplicate node name {node.name!r}")
            _check_node(node)
            by_name[node.name] = node
        # Sorted by name once, so every later walk is deterministic.
        self._nodes = dict(sorted(by_name.items()))
        free: dict[str, dict[str, NodeFree]] = {}
        capacity: dict[str, dict[str, list[int]]] = {}
        # gpu_type → expected release → how many busy healthy GPUs on schedulable nodes have it
        # (_Contribution.busy): counted, because a running job's GPUs share one estimate, so a
        # few hundred runs stand for thousands of GPUs (``release_runs`` sorts those).
        busy_at: dict[str, dict[float, int]] = {}
        for node in self._nodes.values():
            if not node.schedulable:
                continue
            c = _contribution(node)
            for gpu_type, mems in c.capacity.items():
                capacity.setdefault(gpu_type, {})[node.name] = mems
            for gpu_type, times in c.busy.items():  # (a node's GPUs share one or two estimates)
                counted = busy_at.get(gpu_type)
                if counted is None:
                    counted = busy_at[gpu_type] = {}
                _add_counts(counted, times, 1)
            for gpu_type, nf in c.free.items():
                free.setdefault(gpu_type, {})[node.name] = nf
        self._free = free
        self._capacity = _Capacity.of(capacity)
        # Free GPUs per type: an O(1) "cannot fit now" test before any node is looked at.
        self._free_total = {t: sum(len(nf.slots) for nf in per.values()) for t, per in free.items()}
        # Derived indexes, built on first use (release_runs, free_buckets). The view is
        # immutable, so they stay valid for its lifetime and every pass on it shares them.
        self._cache = {}
        self._busy_at = busy_at

    @classmethod
    def _derived(
        cls,
        nodes: dict[str, NodeView],
        free: dict[str, dict[str, NodeFree]],
        capacity: _Capacity,
        free_total: dict[str, int],
    ) -> ClusterView:
        view = cls((), _blank=True)
        view._nodes = nodes
        view._free = free
        view._capacity = capacity
        view._free_total = free_total
        view._cache = {}
        view._busy_at = None  # ownership changed: release_runs walks the GPUs
        return view

    # ----- read access -------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeView, ...]:
        """All nodes, sorted by name (including dead and draining ones)."""
        return tuple(self._nodes.values())

    def node(self, name: str) -> NodeView:
        return self._nodes[name]

    def gpu_types(self) -> set[str]:
        """GPU types with at least one healthy GPU on a schedulable node."""
        return set(self._capacity.counts)

    def free_by_node(self, gpu_type: str) -> Mapping[str, NodeFree]:
        """Schedulable nodes with free healthy GPUs of ``gpu_type`` (name-sorted)."""
        return self._free.get(gpu_type, {})

    def healthy_by_node(self, gpu_type: str) -> Mapping[str, int]:
        """Healthy GPUs of ``gpu_type`` per schedulable node, free or not (name-sorted)."""
        return self._capacity.counts.get(gpu_type, {})

    def healthy_span(self, gpu_type: str) -> HealthySpan:
        """``healthy_by_node(gpu_type)``'s largest value and sum, memoised with the capacity (a
        pass explains hundreds of plans per type; each used to scan every node of it twice)."""
        return self._capacity.span(gpu_type)

    def capacity_by_node(self, gpu_type: str, need_bytes: int) -> dict[str, int]:
        """Per schedulable node: healthy GPUs of ``gpu_type`` with memory_total ≥ ``need_bytes``.

        This is what the node could give a job once everything on it has ended.
        """
        return self._capacity.by_node(gpu_type, need_bytes)

    def capacity_groups(self, gpu_type: str, need_bytes: int, tp: int) -> int:
        """Whole ``tp``-GPU groups the cluster could host with every job ended (memoised).

        The queue policy uses it to tell "waits" from "can never fit".
        """
        return self._capacity.groups(gpu_type, need_bytes, tp)

    def free_summary(self) -> dict[str, dict[str, int]]:
        """gpu_type → node → free healthy GPUs, for every schedulable node with that type."""
        out: dict[str, dict[str, int]] = {}
        for gpu_type in sorted(self._capacity.counts):
            free = self._free.get(gpu_type, {})
            out[gpu_type] = {
                node: (len(free[node].slots) if node in free else 0)
                for node in self._capacity.counts[gpu_type]
            }
        return out

    def free_count(self, gpu_type: str | None = None) -> int:
        """Free healthy GPUs on schedulable nodes, of one type or of all types (O(1) per type)."""
        if gpu_type is not None:
            return self._free_total.get(gpu_type, 0)
        return sum(self._free_total.values())

    def memory_level(self, gpu_type: str, need_bytes: int) -> int | None:
        """The smallest memory_total of a healthy ``gpu_type`` GPU that is ≥ ``need_bytes``.

        Byte needs between two levels qualify the same GPUs, so callers key caches on it.
        """
        levels = self._capacity.levels.get(gpu_type, [])
        i = bisect.bisect_left(levels, need_bytes)
        return levels[i] if i < len(levels) else None

    def release_times(self, gpu_type: str, level: int, now: float) -> list[float]:
        """When each healthy ``gpu_type`` GPU with memory_total ≥ ``level`` on a schedulable
        node is free, ascending: ``now`` for a free GPU, max(now, ``free_at``) for a busy one,
        ``inf`` when a busy GPU's release is unknown (a NaN ``free_at`` reads as ``now``).

        One entry per GPU from a walk over the GPUs, uncached: the plain statement of what
        ``release_runs`` (which the scheduling pass reads) returns grouped.
        """
        free_now = 0
        busy = []
        for name in self.healthy_by_node(gpu_type):
            for g in self._nodes[name].gpus:
                if g.gpu_type != gpu_type or not g.healthy or g.memory_total < level:
                    continue
                if g.owner is None or (g.free_at is not None and g.free_at != g.free_at):
                    free_now += 1
                else:
                    busy.append(_INF if g.free_at is None else g.free_at)
        busy.sort()
        k = bisect.bisect_right(busy, now)  # estimates already past count as free now
        return [now] * (free_now + k) + busy[k:]

    def release_runs(self, gpu_type: str, level: int, now: float) -> tuple[list[float], list[int]]:
        """``release_times`` as runs: its distinct times ascending and how many GPUs each.
        New lists per call (callers edit them), built from a per-view cache of the busy runs
        with two slices: O(runs after ``now``), not O(GPUs)."""
        key = ("runs", gpu_type, level)
        runs = self._cache.get(key)
        if runs is None:
            free_now, counted = self._release_counts(gpu_type, level)
            times = sorted(counted)
            counts = [counted[t] for t in times]
            upto = [0]  # GPUs in the runs before each
            for c in counts:
                upto.append(upto[-1] + c)
            runs = self._cache[key] = (free_now, times, counts, upto)
        free_now, times, counts, upto = runs  # type: ignore[misc]
        k = bisect.bisect_right(times, now)  # estimates already past count as free now
        first = free_now + upto[k]
        if first:
            return [now, *times[k:]], [first, *counts[k:]]
        return times[k:], counts[k:]

    def _release_counts(self, gpu_type: str, level: int) -> tuple[int, dict[float, int]]:
        """(free GPUs of ``gpu_type`` with memory_total ≥ ``level``, release estimate → busy
        such GPUs with it: inf when unknown, -inf for NaN)."""
        levels = self._capacity.levels.get(gpu_type, [])
        if self._busy_at is not None and levels and level <= levels[0]:
            # Every GPU of the type qualifies: the counts kept with the view, no walk.
            return self._free_total.get(gpu_type, 0), self._busy_at.get(gpu_type, {})
        free_now = 0
        counted: dict[float, int] = {}
        for name in self.healthy_by_node(gpu_type):
            for g in self._nodes[name].gpus:
                if g.gpu_type != gpu_type or not g.healthy or g.memory_total < level:
                    continue
                if g.owner is None:
                    free_now += 1
                    continue
                at = _release_key(g.free_at)
                counted[at] = counted.get(at, 0) + 1
        return free_now, counted

    def free_buckets(self, gpu_type: str) -> tuple[tuple[tuple[str, ...], ...], int]:
        """Nodes with free ``gpu_type`` GPUs grouped by how many they have: ``buckets[c]`` is
        the name-sorted nodes with exactly ``c`` free; plus the least free memory of any of
        those GPUs. The per-pass placement index (``has.pass_state``) starts from this.
        """
        key = ("buckets", gpu_type, 0)
        hit = self._cache.get(key)
        if hit is None:
            free = self._free.get(gpu_type, {})
            width = max((len(nf.slots) for nf in free.values()), default=0)
            lists: list[list[str]] = [[] for _ in range(width + 1)]
            least = min((nf.mem_sorted[0] for nf in free.values()), default=0)
            for name, nf in free.items():  # name order, so every bucket is sorted
                lists[len(nf.slots)].append(name)
            hit = (tuple(tuple(names) for names in lists), least)
            self._cache[key] = hit
        return hit  # type: ignore[return-value]

    def drain_inventory(
        self, gpu_type: str
    ) -> tuple[list[tuple[str, NodeFree | None, list[int]]], list[int], list[int]]:
        """Per schedulable node with healthy ``gpu_type`` GPUs (name order): its free ones (None
        when none) and the memory_total of its busy ones, ascending — what a starving job's
        drain target is computed from, for any byte need, by bisects; plus the distinct free
        memories and busy totals, ascending (two byte needs between the same neighbours
        qualify the same GPUs). Built once per type for the view's lifetime."""
        key = ("drain", gpu_type, 0)
        hit = self._cache.get(key)
        if hit is None:
            free = self._free.get(gpu_type, {})
            rows = []
            busy_levels: set[int] = set()
            for name in self._capacity.counts.get(gpu_type, {}):
                busy = sorted(g.memory_total for g in self._nodes[name].gpus
                              if g.gpu_type == gpu_type and g.healthy and g.owner is not None)
                busy_levels.update(busy)
                rows.append((name, free.get(name), busy))
            free_levels = sorted({m for nf in free.values() for m in nf.mem_sorted})
            hit = self._cache[key] = (rows, free_levels, sorted(busy_levels))
        return hit  # type: ignore[return-value]

    # ----- derivation --------------------------------------------------

    def updated(self, nodes: Iterable[NodeView]) -> ClusterView:
        """The view of a cluster made of ``nodes``, built from this one at the cost of what changed.

        A node passed as the very object this view holds (``is``) is taken as unchanged, with
        everything derived from it; any other node is indexed anew, and nodes not passed are
        gone. The result answers every query exactly as ``ClusterView(nodes)`` would — the
        scheduler service keeps its view from tick to tick and hands over the node objects it
        could reuse, so a tick costs O(changed nodes), not O(GPUs). This view is not changed.
        """
        old = self._nodes
        fresh: dict[str, NodeView] = {}
        changed: list[str] = []
        for node in nodes:
            name = node.name
            if name in fresh:
                raise ValueError(f"duplicate node name {name!r}")
            fresh[name] = node
            if old.get(name) is not node:
                changed.append(name)
        gone = [name for name in old if name not in fresh]
        if not changed and not gone:
            return self
        for name in changed:
            _check_node(fresh[name])

        # Per GPU type: the free GPUs, capacity and busy release estimates the changed nodes
        # had here (to take out) and have now (to put in).
        touched: set[str] = set()
        before = [_contribution(old[n]) for n in changed if n in old] + [_contribution(old[n]) for n in gone]
        after = [_contribution(fresh[n]) for n in changed]
        for c in before + after:
            touched.update(c.types)
        names_same = not gone and all(n in old for n in changed)
        view = ClusterView((), _blank=True)
        if names_same:  # same names, same (sorted) order: swap the changed values in place
            view._nodes = dict(old)
            for name in changed:
                view._nodes[name] = fresh[name]
        else:
            view._nodes = dict(sorted(fresh.items()))

        free = dict(self._free)
        free_total = dict(self._free_total)
        for gpu_type in touched:
            per = dict(free.get(gpu_type, {}))
            inserted = False
            for c in before:
                nf = c.free.get(gpu_type)
                if nf is not None:
                    del per[nf.node]
                    free_total[gpu_type] -= len(nf.slots)
            for c in after:
                nf = c.free.get(gpu_type)
                if nf is not None:
                    inserted = True
                    per[nf.node] = nf
                    free_total[gpu_type] = free_total.get(gpu_type, 0) + len(nf.slots)
            if inserted:
                per = dict(sorted(per.items()))  # name order is part of the contract
            if per:
                free[gpu_type] = per
            else:
                free.pop(gpu_type, None)
                free_total.pop(gpu_type, None)
        view._free = free
        view._free_total = free_total

        capacity = self._capacity
        if [c.capacity for c in before] != [c.capacity for c in after] or not names_same:
            raw = {t: {n: list(m) for n, m in per.items()} for t, per in capacity.mems.items()}
            for c in before:
                for gpu_type in c.capacity:
                    del raw[gpu_type][c.node]
            for c in after:
                for gpu_type, mems in c.capacity.items():
                    raw.setdefault(gpu_type, {})[c.node] = list(mems)
            capacity = _Capacity.of({t: dict(sorted(per.items())) for t, per in sorted(raw.items()) if per})
        view._capacity = capacity

        busy_at = None
        if self._busy_at is not None:
            busy_at = dict(self._busy_at)
            for gpu_type in touched:
                counted = dict(busy_at.get(gpu_type, {}))
                for c in before:
                    _add_counts(counted, c.busy.get(gpu_type, {}), -1)
                for c in after:
                    _add_counts(counted, c.busy.get(gpu_type, {}), 1)
                if counted:
                    busy_at[gpu_type] = counted
                else:
                    busy_at.pop(gpu_type, None)
        view._busy_at = busy_at
        # Derived indexes of untouched types still hold (same GPUs, same estimates). Not the GPUs
        # by owner: they span every type, so any changed node may have changed hands; carried
        # over, the map would name a job's old GPUs and preemption would free the wrong ones.
        view._cache = {
            key: hit for key, hit in self._cache.items() if key[1] not in touched and key[0] != "owners"
        }
        return view

    def with_reserved(self, placement: _HasGpus) -> ClusterView:
        """A new view in which the placement's GPUs are owned by its job.

        Raises ``ValueError`` when a GPU is unknown or not free: that would be a
        double booking, which is always a bug in the caller.
        """
        return self.with_owned(placement.gpus(), placement.job_id)

    def gpus_by_owner(self) -> dict[str, list[GpuSlot]]:
        """Busy healthy GPUs on schedulable nodes, by the job holding them (preemption reads
        the GPUs of a few running jobs; built once per view)."""
        key = ("owners", "", 0)
        hit = self._cache.get(key)
        if hit is None:
            out: dict[str, list[GpuSlot]] = {}
            for node in self._nodes.values():
                if node.schedulable:
                    for g in node.gpus:
                        if g.owner is not None and g.healthy:
                            out.setdefault(g.owner, []).append(g)
            hit = self._cache[key] = out
        return hit  # type: ignore[return-value]

    def with_owned(self, gpus: Iterable[tuple[str, int]], owner: str) -> ClusterView:
        """A new view with ``gpus`` (node, index) marked as owned by ``owner``."""
        by_node: dict[str, set[int]] = {}
        for node_name, index in gpus:
            by_node.setdefault(node_name, set()).add(index)
        if not by_node:
            return self
        nodes = dict(self._nodes)
        free = {t: m for t, m in self._free.items()}
        free_total = dict(self._free_total)
        copied: set[str] = set()
        for node_name, indices in by_node.items():
            node = self._nodes.get(node_name)
            if node is None:
                raise ValueError(f"unknown node {node_name!r}")
            if not node.schedulable:
                raise ValueError(f"node {node_name!r} is not schedulable")
            new_gpus = []
            touched_types: set[str] = set()
            for gpu in node.gpus:
                if gpu.index in indices:
                    if not gpu.is_free:
                        raise ValueError(f"GPU {node_name}:{gpu.index} is not free (owner={gpu.owner!r})")
                    gpu = dataclasses.replace(gpu, owner=owner)
                    touched_types.add(gpu.gpu_type)
                    free_total[gpu.gpu_type] -= 1
                new_gpus.append(gpu)
            missing = indices - {g.index for g in node.gpus}
            if missing:
                raise ValueError(f"node {node_name!r} has no GPU {sorted(missing)}")
            new_node = dataclasses.replace(node, gpus=tuple(new_gpus))
            nodes[node_name] = new_node
            for gpu_type in touched_types:
                if gpu_type not in copied:
                    # Copy-on-write per type: other types keep sharing the old dicts.
                    free[gpu_type] = dict(free[gpu_type])
                    copied.add(gpu_type)
                remaining = [g for g in new_node.gpus if g.gpu_type == gpu_type and g.is_free]
                if remaining:
                    free[gpu_type][node_name] = NodeFree.of(node_name, remaining)
                else:
                    del free[gpu_type][node_name]
                if not free[gpu_type]:
                    del free[gpu_type]
                    del free_total[gpu_type]
        return ClusterView._derived(nodes, free, self._capacity, free_total)

    def __repr__(self) -> str:
        return f"ClusterView(nodes={len(self._nodes)}, free={self.free_count()})"
